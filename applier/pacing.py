"""How often a running TrainJob's status is written: at most once per interval, conditions at once.

JobSet reports each stage of its pods (Jobs made, pods ready, pods done) as a status change, and the planner
plans the TrainJob's status from each. Written as planned that is one status write per stage, three or four
per TrainJob, where Trainer, which reconciles from a rate-limited queue, wrote 1.44 per TrainJob over a
lifecycle; and each write comes back to the watcher as an observation. So a status whose only change is the
Jobs' counts (the planner marks it ``paced``) waits until the interval since the TrainJob's last status write
has passed. A status that changes a condition (Complete, Failed, Suspended, resumed, not built) is never held:
it is what the job's owner and other controllers wait on, and it carries the latest counts with it.

The waiting is JetStream's, not this process's: the message goes back with a delay (a nak), so a held status
costs no memory here but the time of the TrainJob's last write, and a restart forgets only that (the next
status is then written at once). When the held message comes back, a newer status may have been written in
the meantime from a newer plan: the held one is conditional on the TrainJob version it was planned from, so
the API server refuses it as stale and it is dropped, and the newer one stands; and of several held at once,
the older ones are skipped when they come back, and only the newest is written. So the newest status wins,
with at most one write per TrainJob per interval for counts alone.

Five seconds by default: the Kubeflow SDK's progress reports are limited to one per five seconds per process
and the status server writes them at that pace too, so a reader of the TrainJob sees both kinds of running
detail move at the same rhythm; the stages of a JobSet's pods often follow each other within that time, so
most TrainJobs' counts are written once while running and once more with their final condition.

The watcher holds a JobSet change that changes only the counts by the same rule (``watcher.pacing``), so
most such statuses are never planned; this pacing stands behind it for what one watcher cannot know (a
watcher just started, which has seen no status write yet, or counts carried by another observation).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from contracts.messages import ApplyMessage, ApplyTrainJobStatus, ObjectKey


class StatusPacing:
    """The time of each TrainJob's last status write, and how long a paced status must wait for its turn."""

    def __init__(self, interval: float, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval = interval
        self._clock = clock
        self._written: dict[ObjectKey, tuple[float, int]] = {}
        """Each TrainJob's last status write: when, and the version of the observation it was planned from."""
        self._waiting: dict[ObjectKey, int] = {}
        """The newest observation version of each TrainJob's statuses handed back to wait for their turn."""

    def superseded(self, message: ApplyMessage) -> bool:
        """Whether the message is a status planned from an older observation than one this applier wrote or
        holds: the newest status wins, so when held ones come back together only the newest is written.

        An older one than a write of this process is stale for sure, so it is skipped here, without the
        ledger's claim round, whose judging of a newer claim reads the cluster's revision: that path is for
        the rare claim nobody here accounts for, and a held status overtaken by a newer one is common."""
        if not isinstance(message, ApplyTrainJobStatus) or message.source_version == 0:
            return False
        written = self._written.get(message.trainjob, (0.0, 0))[1]
        return message.source_version < max(written, self._waiting.get(message.trainjob, 0))

    def wait_for(self, message: ApplyMessage) -> float:
        """Seconds the message should wait before it is written (it is then counted as waiting); 0 to go on."""
        if not isinstance(message, ApplyTrainJobStatus) or not message.paced:
            return 0.0
        last = self._written.get(message.trainjob)
        wait = 0.0 if last is None else max(0.0, last[0] + self.interval - self._clock())
        if wait > 0:
            self._waiting[message.trainjob] = max(self._waiting.get(message.trainjob, 0), message.source_version)
        return wait

    def wrote(self, message: ApplyMessage) -> None:
        """The message's write changed the TrainJob's status (created or configured)."""
        if not isinstance(message, ApplyTrainJobStatus):
            return
        now = self._clock()
        if len(self._written) >= 4096:  # forget TrainJobs whose turn has long come: they wait for nothing
            self._written = {k: w for k, w in self._written.items() if now - w[0] < self.interval}
            self._waiting = {k: v for k, v in self._waiting.items() if k in self._written}
        self._written[message.trainjob] = (now, message.source_version)
        if self._waiting.get(message.trainjob, 0) <= message.source_version:
            self._waiting.pop(message.trainjob, None)
