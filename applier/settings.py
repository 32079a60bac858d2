"""The applier's settings, each declared once (``plumbing.configuration``): the command line, the settings
reference and the deployment checks are made from these fields.

A module of its own, importing nothing that does I/O, so that ``tjpipe`` builds its parser from it without
loading the applier.
"""

from __future__ import annotations

from dataclasses import dataclass

from plumbing.configuration import (
    AT_LEAST_ONE,
    AT_LEAST_ZERO,
    KubeSettings,
    NamespaceSettings,
    PartitionedSettings,
    StatusIntervalSettings,
    setting,
)


@dataclass(kw_only=True)
class ApplierSettings(PartitionedSettings, KubeSettings, NamespaceSettings, StatusIntervalSettings):
    concurrency: int = setting(
        16, flag="--concurrency", env="TJPIPE_APPLY_CONCURRENCY", help="concurrent applies", check=AT_LEAST_ONE
    )
    attempts: int = setting(
        5,
        flag="--apply-attempts",
        env="TJPIPE_APPLY_ATTEMPTS",
        check=AT_LEAST_ONE,
        help="attempts in process for an apply that fails for now (a conflict, a 429 or 5xx, the API server"
        " away), before the message goes back to JetStream for a delayed redelivery",
    )
    max_backoff_seconds: float = 8.0
    # namespaces (NamespaceSettings): whose TrainJobs the checks' watch follows, the watcher's; a TrainJob
    # elsewhere is read for each check, as far as RBAC lets the applier read it.
    trainjob_source: str = setting(
        "watch",
        flag="--trainjob-source",
        env="TJPIPE_TRAINJOB_SOURCE",
        choices=("watch", "get"),
        help="where the TrainJob checks answer from: a watch of TrainJobs (needs list and watch on them), or"
        " a read of each TrainJob",
    )
    """``watch`` reads one TrainJob only when the watch does not know it by the message's uid; ``get`` reads
    each TrainJob every few seconds."""
    trainjob_cache_seconds: float = setting(
        5.0,
        flag="--trainjob-cache-seconds",
        env="TJPIPE_TRAINJOB_CACHE_SECONDS",
        unit="seconds",
        check=AT_LEAST_ZERO,
        help="seconds a TrainJob verified by a read is trusted without reading it again",
    )
    cluster_id: str = setting(
        "",
        flag="--cluster-id",
        env="TJPIPE_CLUSTER_ID",
        help="what tells this cluster's ledger claims from another's (default: the kube-system namespace's uid)",
    )
    stale_claim_grace_seconds: float = setting(
        330.0,
        flag="--stale-claim-grace",
        env="TJPIPE_STALE_CLAIM_GRACE",
        unit="seconds",
        check=AT_LEAST_ZERO,
        help="seconds a ledger claim newer than the cluster may hold a target before it is overwritten",
    )
    """A bit over the watcher's resync (5 min) by default, since every resync brings a plan at least as new
    as any genuine claim."""
    trusted_plan_keys: str | None = setting(
        None,
        flag="--trusted-plan-keys",
        env="TJPIPE_TRUSTED_PLAN_KEYS",
        deployment="per-service",
        help="the planner's ed25519 public keys: a file, or a directory of *.pub files; required",
    )
