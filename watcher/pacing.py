"""Which changes of a running JobSet wait in the watcher: those that change only its Jobs' counts.

While a TrainJob runs, JobSet reports each stage of its pods (Jobs made, pods ready, pods done) as a
status change, often within seconds of each other. The applier writes a status whose only change is those
counts at most once per interval (``applier.pacing``); left to the applier alone, each such change is still
observed, published, stored twice, planned, held by the applier, handed back and finally skipped as
overtaken, which makes a third of a torch TrainJob's events and apply messages for nothing.

So the watcher holds them itself, by the applier's rule, where it can tell the applier would hold them: when
the TrainJob's last observation was the echo of a status write (``watcher.core.EchoGuard``) that carried
the same JobSet as the observation before it, everything the pipeline knew of the TrainJob is written, and
a JobSet change that leaves all the watcher keeps of it as it was but the counts
(``status.replicatedJobsStatus``) waits until the interval since that echo has passed. Then the newest
counts go out, in one observation, and the applier writes them at once. Nothing else waits: a condition, a
terminal state, a restart, a spec, a new JobSet, a TrainJob change; a change that comes while counts wait
goes out in its own window, carrying the newest counts with it, and the held one is dropped as carried.
When the last observation was anything else, a status planned from it may still wait in the applier, and a
change held here past that status's turn would cost one more write: it goes out at once, as before, and
the applier's pacing decides. A watcher that has just started holds nothing.

Held changes cost no decoding while they wait: the key goes back into the work queue until its instant
(``plumbing.workqueue``), and what is compared is a number per TrainJob (a hash of the JobSet with its
counts and version left out), not a copy of the JobSet.
"""

from __future__ import annotations

import msgspec

from contracts.jobset import JobSet
from contracts.kube import ObjectMeta
from contracts.values import is_set

Key = tuple[str, str]


def counts_aside(jobset: JobSet | None) -> int | None:
    """A number that changes with everything the watcher keeps of a JobSet but its counts and its version."""
    if jobset is None:
        return None
    uid = jobset.metadata.uid if is_set(jobset.metadata) else msgspec.UNSET
    status = jobset.status
    if is_set(status):
        status = msgspec.structs.replace(status, replicated_jobs_status=msgspec.UNSET)
    rest = msgspec.structs.replace(jobset, metadata=ObjectMeta(uid=uid), status=status)
    return hash(msgspec.json.encode(rest))


class CountsPacing:
    """Per TrainJob: what its last observation carried of the JobSet, and whether it was a quiet echo."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self._carried: dict[Key, tuple[str, int | None, float | None]] = {}
        """The JobSet version and ``counts_aside`` of the TrainJob's last observation that went out, and when
        it went out if it was a quiet echo (the pipeline's status write, with the JobSet as the one before)."""

    def published(self, key: Key, jobset: JobSet | None, *, echo: bool, now: float) -> None:
        version = _version(jobset)
        before = self._carried.get(key)
        quiet = echo and before is not None and before[0] == version
        # Only a quiet echo makes later changes wait, so only its JobSet is ever compared: hashed then alone.
        self._carried[key] = (version, counts_aside(jobset) if quiet else None, now if quiet else None)

    def carried(self, key: Key, jobset: JobSet | None) -> bool:
        """Whether the TrainJob's last observation already carried this version of its JobSet."""
        last = self._carried.get(key)
        version = _version(jobset)
        return last is not None and bool(version) and last[0] == version

    def wait(self, key: Key, jobset: JobSet | None, now: float) -> float:
        """Seconds a change of the TrainJob's JobSet waits before it is observed (0: at once)."""
        last = self._carried.get(key)
        if self.interval <= 0 or last is None or last[2] is None or jobset is None:
            return 0.0
        left = last[2] + self.interval - now
        if left <= 0 or last[1] != counts_aside(jobset):
            return 0.0
        return left

    def forget(self, key: Key) -> None:
        self._carried.pop(key, None)


def _version(jobset: JobSet | None) -> str:
    return str(jobset.metadata.resource_version or "") if jobset is not None and is_set(jobset.metadata) else ""
