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
cluster's current revision, and only for this may its role list TrainJobs. ``NewerClaims.settle`` is the one
call the fence makes when a claim is newer than its plan (``is_stale``), and it answers what the round does
next. It judges first, as data (``Settled``: what became of the claim, and what is to be told on the
TrainJob, the condition while a corrupt claim is held and its removal), then carries the judgment out in the
order it is read: the claim replaced in the ledger, the TrainJob told (``TrainJobs.tell``), the message held.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Literal

from applier import errors, poisoned_claims, trainjob_condition
from applier.epoch import ClusterEpoch, standing
from applier.ledger import Ledger
from applier.trainjobs import TrainJobs
from contracts import conditions, resources
from contracts.messages import AppliedRecord, ApplyMessage
from plumbing.kube import KubeApiError, KubeClient
from plumbing.observability import FOREIGN_CLAIMS, STALE_CLAIMS

log = logging.getLogger("applier")


def is_stale(record: AppliedRecord | None, message: ApplyMessage) -> bool:
    """A plan made from an older observation than one already claimed or applied for the same target."""
    if record is None or message.source_version == 0:
        return False
    return record.source_version > message.source_version


NewerClaim = Literal["stale", "replaced", "changed", "held"]
"""What became of a newer claim (``NewerClaims.settle``): it stands and the plan is ``stale``; it was
``replaced`` by this plan's claim; the key ``changed`` while it was being replaced (read it again); or it
is held to be corrupt and still within its grace, and the plan is ``held`` (``errors.Held``)."""


@dataclass(frozen=True)
class Settled:
    """What judging a newer claim decided, for ``NewerClaims.settle`` to carry out."""

    claim: NewerClaim
    tell: tuple[trainjob_condition.ConditionChange, ...] = ()
    """The changes of the applier's condition on the TrainJob to write, in this order."""
    hold: float = 0.0
    """With ``held``: how long the message waits before it is delivered again."""


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
        """Judge a claim newer than ``message`` (``is_stale``), replace it if it cannot stand, and tell on the
        TrainJob what the judgment asks; raises ``errors.Held`` while a corrupt claim is within its grace."""
        elsewhere = await self._made_elsewhere(message, record)
        judged = Settled("replaced") if elsewhere else await self._corruption(message, lkey, record)
        if judged.claim == "replaced":
            judged = await self._replace(message, lkey, record, revision, elsewhere=elsewhere, tell=judged.tell)
        for change in judged.tell:
            await self.trainjobs.tell(message, change)
        if judged.claim == "held":
            raise errors.Held(judged.hold)
        return judged.claim

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
        if not poisoned_claims.claim_beyond_cluster(record, cluster_revision=current):
            return ""
        revision = int(current) if current.isdigit() else 0
        try:
            await self.epoch.observe(revision=revision, seen=record.source_version)
        except KubeApiError as exc:
            raise errors.from_api(exc) from exc
        return "rewound" if standing(record.cluster, self.epoch.stamp) == "rewound" else ""

    async def _corruption(self, message: ApplyMessage, lkey: str, record: AppliedRecord) -> Settled:
        """Whether a claim newer than this plan is corrupt: newer than the cluster, for longer than the grace.

        A claim newer than both the live target and the TrainJob that lasts longer than the grace is not
        explained by anything the cluster holds. Not corrupt: ``stale``. While it lasts the message is
        ``held``, and the TrainJob is told so when the claim is first seen. Past the grace: ``replaced``, which
        ``settle`` then makes true (``_replace``).
        """
        cluster_revision = await self._cluster_revision(message.trainjob.namespace)
        if not poisoned_claims.claim_beyond_cluster(record, cluster_revision=cluster_revision):
            self._corrupt.pop(lkey, None)
            return Settled("stale")
        now = time.monotonic()
        seen = self._corrupt.get(lkey)
        tell: tuple[trainjob_condition.ConditionChange, ...] = ()
        if seen is None or seen[0] != record.source_version:
            seen = (record.source_version, now)
            self._corrupt[lkey] = seen
            tell = (self._report(message, record, cluster_revision),)
        grace = self.grace_seconds
        if poisoned_claims.stale_claim_action(seen[1], now, grace_seconds=grace) == "hold":
            STALE_CLAIMS.labels(action="held").inc()
            return Settled("held", tell=tell, hold=min(30.0, max(0.5, seen[1] + grace - now + 0.1)))
        self._corrupt.pop(lkey, None)
        return Settled("replaced", tell=tell)

    def _report(
        self, message: ApplyMessage, record: AppliedRecord, cluster_revision: str
    ) -> trainjob_condition.SetCondition:
        log.warning(
            "%s: the ledger claims source version %d, newer than the cluster's current revision %s",
            message.target,
            record.source_version,
            cluster_revision,
            extra={"trainjob": str(message.trainjob), "trace_id": message.trace_id},
        )
        return trainjob_condition.SetCondition(
            reason=conditions.REASON_STALE_LEDGER_CLAIM,
            text=(
                f"a ledger claim for source version {record.source_version} is newer than anything the cluster"
                f" holds; it is re-checked and overwritten after {self.grace_seconds:.0f}s"
            ),
        )

    async def _replace(
        self,
        message: ApplyMessage,
        lkey: str,
        record: AppliedRecord,
        revision: int,
        *,
        elsewhere: str,
        tell: tuple[trainjob_condition.ConditionChange, ...],
    ) -> Settled:
        """Put this message's claim in place of one that cannot stand (compare-and-set); ``changed`` if the key
        changed first. ``elsewhere``: why the claim is another history's (``_made_elsewhere``), set aside at
        once; ``""``: a corrupt claim past its grace, overwritten. ``tell`` is what judging it already asks."""
        claim = self.fresh_claim(message)
        if await self.ledger.write(lkey, claim, revision=revision) is None:
            return Settled("changed", tell=tell)
        extra = {"trainjob": str(message.trainjob), "trace_id": message.trace_id}
        if elsewhere:
            FOREIGN_CLAIMS.labels(why=elsewhere).inc()
            held = self._corrupt.pop(lkey, None)
            log.warning(
                "%s: set aside a ledger claim for source version %d made %s (%s; now %s)",
                message.target,
                record.source_version,
                "by another cluster" if elsewhere == "other-cluster" else "before the cluster's revisions went back",
                record.cluster,
                self.stamp(),
                extra=extra,
            )
            if held is not None:  # it had been held as corrupt before the rewind was known: the condition goes
                return Settled("replaced", tell=(trainjob_condition.ClearCondition(),))
            return Settled("replaced")
        STALE_CLAIMS.labels(action="overwritten").inc()
        log.warning(
            "%s: overwrote a ledger claim for source version %d that nothing in the cluster accounts for",
            message.target,
            record.source_version,
            extra=extra,
        )
        return Settled("replaced", tell=(*tell, trainjob_condition.ClearCondition()))

    async def _cluster_revision(self, namespace: str) -> str:
        """The cluster's current etcd revision: the resourceVersion of a one-item list of TrainJobs."""
        try:
            return await self.kube.list_revision(resources.TRAINJOB, namespace=namespace)
        except KubeApiError as exc:
            raise errors.from_api(exc) from exc
