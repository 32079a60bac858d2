"""A ledger claim newer than the cluster itself: how it is told (``claim_beyond_cluster``) and when it is
overwritten (``stale_claim_action``). Pure: no I/O; ``applier.claims`` reads the cluster and acts.
"""

from __future__ import annotations

from typing import Literal

from applier.objects import resource_version_number
from contracts.messages import AppliedRecord


def claim_beyond_cluster(record: AppliedRecord, *, cluster_revision: str) -> bool:
    """A claim newer than the cluster itself: no observation could have produced it.

    A record's source_version is the newest resourceVersion among the objects a plan was made from, and one
    etcd revision counter numbers every object, so a genuine claim is never above the cluster's current
    revision (a list's resourceVersion). Comparing with the live target and the TrainJob alone is not
    enough: the snapshot ConfigMap, the runtime or a JobSet status change can make a genuine claim newer
    than both, and a replayed older plan then looked like poisoning. An unknown revision proves nothing.
    """
    revision = resource_version_number(cluster_revision)
    return revision > 0 and record.source_version > revision


StaleClaimAction = Literal["overwrite", "hold"]


def stale_claim_action(first_seen: float, now: float, *, grace_seconds: float) -> StaleClaimAction:
    """A claim beyond the cluster is held to be corrupt, and overwritten, once it outlasted the grace."""
    return "overwrite" if now - first_seen >= grace_seconds else "hold"
