"""A ledger claim newer than the plan in hand: normally the plan is just stale, but not always.

A plan older than its target's claim is skipped: a newer plan was claimed or applied. Two kinds of claim
are not to be believed, though, since each would stall its target for good:

* a claim of another history: made by another cluster sharing the bus, or in this cluster before etcd
  went back (a restore), which its stamp says or its version proves (``applier.epoch``). It is set aside
  at once for this plan's claim;
* a corrupt claim: one of this history that is newer than anything the cluster holds (a ledger written by
  something other than an applier). It is held for a grace a bit longer than the watcher's resync, with a
  condition on the TrainJob, and then overwritten.

This is the rare path (reordering, replays, a poisoned ledger): only here does the applier read the
cluster's current revision, and only for this may its role list TrainJobs.
"""

from __future__ import annotations

import logging
import time
from typing import Literal

from applier import core
from applier.epoch import ClusterEpoch, standing
from applier.ledger import Ledger
from applier.objects import resource_version
from applier.trainjobs import TrainJobs
from contracts import conditions, resources
from contracts.messages import AppliedRecord, ApplyMessage
from plumbing.kube import KubeApiError, KubeClient
from plumbing.observability import FOREIGN_CLAIMS, STALE_CLAIMS

log = logging.getLogger("applier")

NewerClaim = Literal["stale", "replaced", "changed"]
"""What became of a newer claim (``NewerClaims.settle``): it stands and the plan is ``stale``; it was
``replaced`` by this plan's claim; or the key ``changed`` while it was being replaced (read it again)."""


class NewerClaims:
    def __init__(
        self,
        kube: KubeClient,
        ledger: Ledger,
        trainjobs: TrainJobs,
        *,
        epoch: ClusterEpoch | None,
        grace_seconds: float,
    ) -> None:
        self.kube = kube
        self.ledger = ledger
        self.trainjobs = trainjobs
        self.epoch = epoch
        self.grace_seconds = grace_seconds
        self._corrupt: dict[str, tuple[int, float]] = {}
        """Ledger keys holding a claim beyond the cluster -> (its source_version, first seen, monotonic)."""

    def stamp(self) -> str:
        """Where claims are made now, ``<cluster>/<epoch>``; empty before the first answer."""
        return self.epoch.stamp if self.epoch is not None else ""

    def fresh_claim(self, message: ApplyMessage) -> AppliedRecord:
        """This message's claim, to put in place of one that cannot stand (corrupt, or of another history)."""
        return AppliedRecord(
            source_version=message.source_version,
            source_seq=message.source_seq,
            digest="",
            state="claimed",
            cluster=self.stamp(),
        )

    async def settle(self, message: ApplyMessage, lkey: str, record: AppliedRecord, revision: int) -> NewerClaim:
        """Judge a claim newer than ``message`` (``core.is_stale``), and replace it if it cannot stand.

        Raises ``core.Held`` while a corrupt claim is within its grace.
        """
        elsewhere = await self._made_elsewhere(message, record)
        if elsewhere:
            return "replaced" if await self._set_aside(message, lkey, record, revision, elsewhere) else "changed"
        if not await self._is_corrupt(message, lkey, record):
            return "stale"
        return "replaced" if await self._overwrite(message, lkey, record, revision) else "changed"

    async def _made_elsewhere(self, message: ApplyMessage, record: AppliedRecord) -> str:
        """Why a claim newer than this plan belongs to another history (``applier.epoch``); ``""`` if not.

        A claim of another cluster or an earlier epoch says so by its stamp. One of this cluster and epoch
        that is newer than the cluster's current revision proves that etcd went back since it was made,
        which begins a new epoch.
        """
        if self.epoch is None:
            return ""
        where = standing(record.cluster, self.epoch.stamp)
        if where in ("other-cluster", "rewound"):
            return where
        if where != "current":
            return ""
        current = await self._cluster_revision(message.trainjob.namespace)
        if not core.claim_beyond_cluster(record, cluster_revision=current):
            return ""
        revision = int(current) if current.isdigit() else 0
        try:
            await self.epoch.observe(revision=revision, seen=record.source_version)
        except KubeApiError as exc:
            raise core.classify(exc.status, exc.reason, exc.message, retry_after=exc.retry_after) from exc
        return "rewound" if standing(record.cluster, self.epoch.stamp) == "rewound" else ""

    async def _set_aside(
        self, message: ApplyMessage, lkey: str, record: AppliedRecord, revision: int, why: str
    ) -> bool:
        """Replace a claim of another history with this plan's (compare-and-set); ``False`` if the key changed."""
        if await self.ledger.write(lkey, self.fresh_claim(message), revision=revision) is None:
            return False
        FOREIGN_CLAIMS.labels(why=why).inc()
        held = self._corrupt.pop(lkey, None)
        log.warning(
            "%s: set aside a ledger claim for source version %d made %s (%s; now %s)",
            message.target,
            record.source_version,
            "by another cluster" if why == "other-cluster" else "before the cluster's revisions went back",
            record.cluster,
            self.stamp(),
            extra={"trainjob": str(message.trainjob), "trace_id": message.trace_id},
        )
        if held is not None:  # it had been held as corrupt before the rewind was known: the condition goes
            await self.trainjobs.clear_condition(message)
        return True

    async def _overwrite(self, message: ApplyMessage, lkey: str, record: AppliedRecord, revision: int) -> bool:
        """Overwrite a corrupt claim with this message's (compare-and-set); ``False`` if the key changed first."""
        if await self.ledger.write(lkey, self.fresh_claim(message), revision=revision) is None:
            return False
        STALE_CLAIMS.labels(action="overwritten").inc()
        log.warning(
            "%s: overwrote a ledger claim for source version %d that nothing in the cluster accounts for",
            message.target,
            record.source_version,
            extra={"trainjob": str(message.trainjob), "trace_id": message.trace_id},
        )
        await self.trainjobs.clear_condition(message)
        return True

    async def _is_corrupt(self, message: ApplyMessage, lkey: str, record: AppliedRecord) -> bool:
        """Whether a claim newer than this plan is corrupt: newer than the cluster, for longer than the grace.

        A claim newer than both the live target and the TrainJob that lasts longer than the grace is not
        explained by anything the cluster holds. While it lasts the message is held (``core.Held``) and
        the TrainJob carries a condition.
        """
        cluster_revision = await self._cluster_revision(message.trainjob.namespace)
        if not core.claim_beyond_cluster(record, cluster_revision=cluster_revision):
            self._corrupt.pop(lkey, None)
            return False
        now = time.monotonic()
        seen = self._corrupt.get(lkey)
        if seen is None or seen[0] != record.source_version:
            seen = (record.source_version, now)
            self._corrupt[lkey] = seen
            await self._report(message, record, cluster_revision)
        grace = self.grace_seconds
        if core.stale_claim_action(seen[1], now, grace_seconds=grace) == "hold":
            STALE_CLAIMS.labels(action="held").inc()
            raise core.Held(min(30.0, max(0.5, seen[1] + grace - now + 0.1)))
        self._corrupt.pop(lkey, None)
        return True

    async def _report(self, message: ApplyMessage, record: AppliedRecord, cluster_revision: str) -> None:
        log.warning(
            "%s: the ledger claims source version %d, newer than the cluster's current revision %s",
            message.target,
            record.source_version,
            cluster_revision,
            extra={"trainjob": str(message.trainjob), "trace_id": message.trace_id},
        )
        await self.trainjobs.set_condition(
            message,
            reason=conditions.REASON_STALE_LEDGER_CLAIM,
            text=(
                f"a ledger claim for source version {record.source_version} is newer than anything the cluster"
                f" holds; it is re-checked and overwritten after {self.grace_seconds:.0f}s"
            ),
        )

    async def _cluster_revision(self, namespace: str) -> str:
        """The cluster's current etcd revision: the resourceVersion of a one-item list of TrainJobs."""
        try:
            resp = await self.kube.request(
                "GET", resources.TRAINJOB.path(namespace=namespace), params={"limit": "1"}, timeout=30
            )
        except KubeApiError as exc:
            raise core.classify(exc.status, exc.reason, exc.message, retry_after=exc.retry_after) from exc
        return resource_version(resp.body)
