"""Which cluster, and which of its histories, a ledger claim was made in.

The ledger fence compares resourceVersions, and those only mean something within one etcd history: a bus
kept while its cluster is rebuilt (etcd wiped, a new cluster) or rewound (etcd restored from a backup)
holds claims whose versions are beyond anything the new history has reached, and a plan of the new history
would lose to each of them. So every claim is stamped with where it was made, ``<cluster>/<epoch>``:

- the cluster is the ``kube-system`` namespace's uid (made once, when a cluster is created), or the id the
  operator gives with ``--cluster-id`` / ``TJPIPE_CLUSTER_ID``;
- the epoch counts the cluster's histories. The ledger bucket keeps, per cluster, a mark with the epoch
  and the highest revision any applier has seen; a current revision below it means etcd went back, and
  starts the next epoch.

A claim stamped with another cluster or an earlier epoch is set aside at once (logged, counted in
``tjpipe_foreign_ledger_claims_total{why}``): its version cannot be compared with a plan of this history,
and the live object, read before every write, is what the plan is applied against. A claim of this
cluster and epoch that is nonetheless newer than the cluster's current revision is itself the evidence of
a rewind: revisions are read with a list that the API server serves consistently (a quorum read, or a
watch cache it has brought up to date), and every claim's version was a revision of the same etcd, so
only going back explains it. Within one history nothing changes: claims are compared as before, and a
stale plan still loses.

Claims written before claims were stamped carry no stamp; they are judged as before (a claim beyond the
cluster is held for the grace, then overwritten).
"""

from __future__ import annotations

import dataclasses
import logging
import re
from typing import Literal

import msgspec
from nats.js.errors import BadRequestError, KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from applier import objects
from contracts import resources
from plumbing import retrying
from plumbing.kube import KubeApiError, KubeClient
from plumbing.observability import CLUSTER_REWINDS

log = logging.getLogger(__name__)

MARK_PREFIX = "_cluster"
"""Ledger keys are ``<namespace>.…`` and a namespace never starts with ``_``, so marks cannot collide."""
FALLBACK_CLUSTER = "cluster"


class ClusterMark(msgspec.Struct, frozen=True, kw_only=True):
    """One cluster's epoch, and the highest revision an applier has seen in it."""

    cluster: str
    epoch: int
    high_water: int


def next_mark(mark: ClusterMark | None, *, cluster: str, revision: int, seen: int = 0) -> tuple[ClusterMark, bool]:
    """The mark after reading ``revision`` (and, on the rare path, a claim ``seen`` of this epoch): and
    whether the cluster went back, which starts a new epoch whose high water is the current revision."""
    if mark is None:
        return ClusterMark(cluster=cluster, epoch=1, high_water=revision), False
    high = max(mark.high_water, seen)
    if 0 < revision < high:
        return ClusterMark(cluster=cluster, epoch=mark.epoch + 1, high_water=revision), True
    return ClusterMark(cluster=cluster, epoch=mark.epoch, high_water=max(high, revision)), False


Standing = Literal["current", "other-cluster", "rewound", "unstamped"]


def stamp_of(mark: ClusterMark) -> str:
    return f"{mark.cluster}/{mark.epoch}"


def standing(claim_stamp: str, current_stamp: str) -> Standing:
    """Where a claim was made, relative to where this applier works now."""
    if not claim_stamp or not current_stamp:
        return "unstamped"
    if claim_stamp == current_stamp:
        return "current"
    return "rewound" if claim_stamp.rpartition("/")[0] == current_stamp.rpartition("/")[0] else "other-cluster"


def mark_key(cluster: str) -> str:
    return f"{MARK_PREFIX}.{re.sub(r'[^-_=a-zA-Z0-9]', '_', cluster)}"


_mark_decoder = msgspec.json.Decoder(ClusterMark)


class ClusterEpoch:
    """Keeps the stamp this applier puts on its claims, and moves the epoch on when the cluster went back."""

    def __init__(self, kv: KeyValue, kube: KubeClient, *, configured: str = "") -> None:
        self.kv = kv
        self.kube = kube
        self.configured = configured
        self.stamp = ""

    async def _cluster(self) -> str:
        if self.configured:
            return self.configured
        try:
            raw = await self.kube.request("GET", "/api/v1/namespaces/kube-system")
        except KubeApiError as exc:
            log.warning(
                "cannot read the kube-system namespace to tell this cluster from another (%s %s); "
                "set --cluster-id / TJPIPE_CLUSTER_ID. Rewinds are still recognised by their revisions",
                exc.status,
                exc.reason,
            )
            return FALLBACK_CLUSTER
        return objects.read(raw.body).metadata.uid or FALLBACK_CLUSTER

    async def _revision(self) -> int:
        """The cluster's current revision: the resourceVersion of a one-item list of TrainJobs."""
        version = await self.kube.list_revision(resources.TRAINJOB)
        return int(version) if version.isdigit() else 0

    async def start(self) -> None:
        """The first observation, tried until the API server answers; claims made before it carry no stamp
        (few: a TrainJob is read from the API server before anything is claimed for it)."""
        policy = dataclasses.replace(retrying.API_UNAVAILABLE, retry_on=(KubeApiError, OSError, TimeoutError))
        async for attempt in policy.retrying(
            on_retry=lambda exc, wait: log.warning(
                "cannot read the cluster's identity and revision yet (%s); trying again in %.1fs", exc, wait
            )
        ):
            with attempt:
                await self.observe()

    async def observe(self, *, revision: int | None = None, seen: int = 0) -> bool:
        """Read (or take) the cluster's revision, update the mark; whether a new epoch began."""
        cluster = await self._cluster()
        current = revision if revision is not None else await self._revision()
        key = mark_key(cluster)
        for _ in range(8):
            try:
                entry = await self.kv.get(key)
                mark, last = (_mark_decoder.decode(entry.value) if entry.value else None), entry.revision or 0
            except KeyNotFoundError:
                mark, last = None, 0
            new, rewound = next_mark(mark, cluster=cluster, revision=current, seen=seen)
            if new != mark:
                try:
                    if last:
                        await self.kv.update(key, msgspec.json.encode(new), last=last)
                    else:
                        await self.kv.create(key, msgspec.json.encode(new))
                except (KeyWrongLastSequenceError, BadRequestError):
                    continue  # another replica moved the mark: read it again
            if rewound:
                CLUSTER_REWINDS.inc()
                log.warning(
                    "cluster %s is at revision %d, below the %d the ledger has seen: its etcd went back "
                    "(restored from a backup?); claims made before are set aside as they come (epoch %d)",
                    cluster,
                    current,
                    max(mark.high_water if mark else 0, seen),
                    new.epoch,
                )
            previous, self.stamp = self.stamp, stamp_of(new)
            if previous != self.stamp:
                log.info("ledger claims are stamped %s", self.stamp)
            return rewound
        raise RuntimeError(f"the ledger's cluster mark {key} kept changing under this applier")
