"""What the TrainJob list shows, kept as one small record per TrainJob and built as the streams are read.

Why an index: the list of a namespace is the newest state of every TrainJob in it, live or deleted, and
working that out from the streams on each request means reading every event of every TrainJob. The index
reads each event once, in stream order, keeps a few fields of it, and afterwards only reads what arrived
since. Why it stays bounded: it holds a fixed-size summary per TrainJob, never an event body, and drops a
TrainJob once the streams no longer hold any of its events or dead letters, so it is as large as the
streams' retention and no larger. Why its own decoder: only the metadata, the runtime reference and the
conditions matter here, so the rest of an event (the TrainJob's pod templates, the runtime, the JobSet) is
skipped by the parser instead of being built into objects and thrown away.

One TrainJob's timeline is not kept here: it is read from the streams on demand (``tjpipe.history_tools.history``,
the same code ``tjpipe history`` runs), starting at the time the index saw that TrainJob's first event.

Training progress (``TJ_PROGRESS``, written by the status server) is folded in the same way, keeping the
newest update of each TrainJob only (at most 256 metrics of 64 characters each, all the status server
admits): what the list shows next to the state, and what tells a stalled job (Running, and no update for a
while) from a working one. The series itself is read on demand, as the timeline is. A bus set up before the
progress stream existed simply has no progress to show.
"""

from __future__ import annotations

import datetime as dt
import itertools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec

from contracts import streams, subjects

if TYPE_CHECKING:
    from nats.js import JetStreamContext

    from plumbing.bus_history import StoredMessage

STATES = ("Created", "Running", "Suspended", "Complete", "Failed", "Deleted")
"""What the list shows for a TrainJob, from the newest event the streams hold of it."""

READ_PAGE = 2048
"""Messages read per pass while catching up: what one pass holds in memory at most."""


# The light view of an event: the fields the list needs, every other field skipped by the decoder.
class _Meta(msgspec.Struct, frozen=True, kw_only=True):
    uid: str = ""
    creation_timestamp: str = msgspec.field(default="", name="creationTimestamp")
    labels: dict[str, str] = {}


class _RuntimeRef(msgspec.Struct, frozen=True, kw_only=True):
    name: str = ""
    kind: str = ""


class _Trainer(msgspec.Struct, frozen=True, kw_only=True):
    num_nodes: int | None = msgspec.field(default=None, name="numNodes")


class _Spec(msgspec.Struct, frozen=True, kw_only=True):
    runtime_ref: _RuntimeRef = msgspec.field(default_factory=_RuntimeRef, name="runtimeRef")
    trainer: _Trainer | None = None
    suspend: bool = False


class _Condition(msgspec.Struct, frozen=True, kw_only=True):
    type: str = ""
    status: str = ""


class _JobStatus(msgspec.Struct, frozen=True, kw_only=True):
    active: int = 0
    ready: int = 0
    succeeded: int = 0
    failed: int = 0

    @property
    def started(self) -> bool:
        return self.active > 0 or self.ready > 0 or self.succeeded > 0 or self.failed > 0


class _Status(msgspec.Struct, frozen=True, kw_only=True):
    conditions: list[_Condition] = []
    jobs_status: list[_JobStatus] = msgspec.field(default_factory=list, name="jobsStatus")


class _TrainJob(msgspec.Struct, frozen=True, kw_only=True):
    metadata: _Meta = msgspec.field(default_factory=_Meta)
    spec: _Spec = msgspec.field(default_factory=_Spec)
    status: _Status = msgspec.field(default_factory=_Status)


class _Observed(msgspec.Struct, frozen=True, kw_only=True, tag="trainjob.observed"):
    trainjob: _TrainJob
    observed_at: float = 0.0


class _Deleted(msgspec.Struct, frozen=True, kw_only=True, tag="trainjob.deleted"):
    uid: str = ""
    observed_at: float = 0.0


_decode = msgspec.json.Decoder(_Observed | _Deleted).decode


def rfc3339_seconds(text: str) -> float:
    """A creationTimestamp as Unix seconds; 0 when it is missing or unreadable."""
    if not text:
        return 0.0
    try:
        return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


def state_of(job: _TrainJob) -> str:
    """Trainer's terminal conditions first, then suspension, then whether any of its Jobs has started (pods
    running, or some finished while Trainer has not yet called the job Complete)."""
    true = {c.type for c in job.status.conditions if c.status == "True"}
    if "Failed" in true:
        return "Failed"
    if "Complete" in true:
        return "Complete"
    if "Suspended" in true or job.spec.suspend:
        return "Suspended"
    if any(s.started for s in job.status.jobs_status):
        return "Running"
    return "Created"


@dataclass(slots=True)
class Progress:
    """The newest progress update of a TrainJob, as its training code reported it."""

    received_at: float
    """When the status server accepted it (its clock, like every other time here)."""
    last_updated: str = ""
    """``lastUpdatedTime`` as the training code sent it (RFC 3339)."""
    pod: str = ""
    percentage: int | None = None
    remaining_seconds: int | None = None
    metrics: dict[str, str] = field(default_factory=dict)
    updates: int = 0
    """How many updates the streams hold of this TrainJob."""

    def to_json(self) -> dict[str, Any]:
        return {
            "percentage": self.percentage,
            "estimatedRemainingSeconds": self.remaining_seconds,
            "metrics": self.metrics,
            "lastUpdatedTime": self.last_updated,
            "receivedAt": self.received_at,
            "pod": self.pod,
            "updates": self.updates,
        }


@dataclass(slots=True)
class Summary:
    """One TrainJob as the list shows it."""

    namespace: str
    name: str
    uid: str = ""
    runtime: str = ""
    runtime_kind: str = ""
    state: str = "Created"
    created: str = ""
    first_seen: float = 0.0
    last_seen: float = 0.0
    events: int = 0
    dead_letters: int = 0
    last_event_seq: int = 0
    last_dead_letter_seq: int = 0
    state_since: float = 0.0
    """When the events first showed the current state."""
    progress: Progress | None = None
    last_progress_seq: int = 0
    labels: dict[str, str] = field(default_factory=dict)
    created_at: float = 0.0
    """``created`` as Unix seconds (0: not known), what a time range compares."""
    nodes: int | None = None
    """``spec.trainer.numNodes`` as the owner set it (``None``: the runtime's)."""
    ended_at: float = 0.0
    """When it first showed Complete or Failed, or was deleted (0 while it lives): what retention counts from
    (``history_server.retention``)."""

    def stalled_for(self, now: float, after: float) -> float | None:
        """Seconds without a progress update, when the job is Running, has reported progress before, and has
        been quiet for more than ``after`` seconds; ``None`` when it is not stalled. Quiet time counts from
        the later of its last update and the moment it (re)started running."""
        if self.state != "Running" or self.progress is None or after <= 0:
            return None
        quiet = now - max(self.progress.received_at, self.state_since)
        return quiet if quiet > after else None

    def to_json(self, now: float = 0.0, stalled_after: float = 0.0) -> dict[str, Any]:
        stalled = self.stalled_for(now, stalled_after) if now else None
        return {
            "namespace": self.namespace,
            "name": self.name,
            "uid": self.uid,
            "runtime": self.runtime,
            "runtimeKind": self.runtime_kind,
            "labels": self.labels,
            "nodes": self.nodes,
            "state": self.state,
            "deleted": self.state == "Deleted",
            "creationTimestamp": self.created,
            "firstSeen": self.first_seen,
            "lastSeen": self.last_seen,
            "events": self.events,
            "deadLetters": self.dead_letters,
            "stateSince": self.state_since,
            "progress": self.progress.to_json() if self.progress is not None else None,
            "stalled": stalled is not None,
            "stalledSeconds": round(stalled, 1) if stalled is not None else None,
        }


class HistoryIndex:
    """TrainJob summaries by namespace, folded from the events and dead-letter streams in stream order."""

    def __init__(self) -> None:
        self._namespaces: dict[str, dict[str, Summary]] = {}
        self.next_seq: dict[str, int] = {}
        self.undecodable = 0
        self.reset()

    def reset(self) -> None:
        self._namespaces.clear()
        self.next_seq.update({streams.EVENTS_HISTORY.name: 1, streams.DLQ.name: 1, streams.PROGRESS.name: 1})
        self.undecodable = 0

    def __len__(self) -> int:
        return sum(len(jobs) for jobs in self._namespaces.values())

    # ------------------------------------------------------------------------------------ the fold

    def _summary(self, namespace: str, name: str) -> Summary:
        jobs = self._namespaces.setdefault(namespace, {})
        found = jobs.get(name)
        if found is None:
            found = jobs[name] = Summary(namespace=namespace, name=name)
        return found

    def add_event(self, stored: StoredMessage) -> None:
        namespace, name = subjects.trainjob_of_subject(stored.subject)
        if namespace == "_":
            return
        try:
            event = _decode(stored.data)
        except msgspec.MsgspecError:
            self.undecodable += 1
            return
        summary = self._summary(namespace, name)
        if not summary.events:
            summary.first_seen = stored.time
        summary.events += 1
        summary.last_seen = stored.time
        summary.last_event_seq = stored.seq
        if isinstance(event, _Deleted):
            if summary.state != "Deleted":
                summary.state_since = stored.time
            summary.state = "Deleted"
            summary.ended_at = summary.ended_at or stored.time
            return
        job = event.trainjob
        if job.metadata.uid != summary.uid:  # a new TrainJob of an old name starts its own story
            summary.uid = job.metadata.uid
        if job.metadata.creation_timestamp and job.metadata.creation_timestamp != summary.created:
            summary.created = job.metadata.creation_timestamp
            summary.created_at = rfc3339_seconds(summary.created)
        summary.labels = job.metadata.labels
        summary.nodes = job.spec.trainer.num_nodes if job.spec.trainer is not None else None
        summary.runtime = job.spec.runtime_ref.name
        summary.runtime_kind = job.spec.runtime_ref.kind or "ClusterTrainingRuntime"
        state = state_of(job)
        if state != summary.state or not summary.state_since:
            summary.state_since = stored.time
        summary.state = state
        summary.ended_at = (summary.ended_at or stored.time) if state in ("Complete", "Failed") else 0.0

    def add_dead_letter(self, stored: StoredMessage) -> None:
        parts = stored.subject.split(".")
        if len(parts) < 5:
            return
        summary = self._summary(parts[3], parts[4])
        if not summary.first_seen:
            summary.first_seen = stored.time
        summary.dead_letters += 1
        summary.last_dead_letter_seq = stored.seq
        summary.last_seen = max(summary.last_seen, stored.time)

    def add_progress(self, stored: StoredMessage) -> None:
        from contracts.progress import decode_progress

        namespace, name = subjects.trainjob_of_subject(stored.subject)
        if namespace == "_":
            return
        try:
            record = decode_progress(stored.data)
        except (msgspec.MsgspecError, ValueError):
            self.undecodable += 1
            return
        summary = self._summary(namespace, name)
        if not summary.first_seen:
            summary.first_seen = stored.time
        status = record.trainer_status
        metrics = status.metrics if isinstance(status.metrics, list) else []
        before = summary.progress.updates if summary.progress is not None else 0
        summary.progress = Progress(
            received_at=record.received_at or stored.time,
            last_updated=status.last_updated_time if isinstance(status.last_updated_time, str) else "",
            pod=record.pod,
            percentage=status.progress_percentage if isinstance(status.progress_percentage, int) else None,
            remaining_seconds=(
                status.estimated_remaining_seconds if isinstance(status.estimated_remaining_seconds, int) else None
            ),
            metrics={m.name: m.value for m in metrics if isinstance(m.name, str) and isinstance(m.value, str)},
            updates=before + 1,
        )
        summary.last_progress_seq = stored.seq
        summary.last_seen = max(summary.last_seen, stored.time)

    def prune(self, first_event_seq: int, first_dead_letter_seq: int, first_progress_seq: int | None = None) -> int:
        """Forget TrainJobs none of whose events, dead letters or progress updates the streams still hold;
        how many went."""
        gone = 0
        for namespace in list(self._namespaces):
            jobs = self._namespaces[namespace]
            for name in [
                n
                for n, s in jobs.items()
                if s.last_event_seq < first_event_seq
                and s.last_dead_letter_seq < first_dead_letter_seq
                and (first_progress_seq is None or s.last_progress_seq < first_progress_seq)
            ]:
                del jobs[name]
                gone += 1
            if not jobs:
                del self._namespaces[namespace]
        return gone

    def forget(self, namespace: str, name: str) -> None:
        """Drop one TrainJob whose records were removed (``history_server.retention``)."""
        jobs = self._namespaces.get(namespace, {})
        jobs.pop(name, None)
        if not jobs:
            self._namespaces.pop(namespace, None)

    # ----------------------------------------------------------------------------------- the reads

    def namespaces(self) -> list[str]:
        return sorted(self._namespaces)

    def in_namespace(self, namespace: str) -> list[Summary]:
        """The namespace's TrainJobs, the most recently active first."""
        return sorted(self._namespaces.get(namespace, {}).values(), key=lambda s: (-s.last_seen, s.name))

    def everywhere(self) -> Iterator[Summary]:
        for namespace in self.namespaces():
            yield from self.in_namespace(namespace)

    def summaries(self) -> Iterable[Summary]:
        """Every TrainJob, namespaces in name order, each namespace's in the order the index first saw them:
        unsorted, for a query that orders what it found itself (``history_server.find``)."""
        return itertools.chain.from_iterable(self._namespaces[ns].values() for ns in self.namespaces())

    def namespace_summaries(self, namespace: str) -> Iterable[Summary]:
        """One namespace's TrainJobs in the order the index first saw them (see ``summaries``)."""
        return self._namespaces.get(namespace, {}).values()

    def get(self, namespace: str, name: str) -> Summary | None:
        return self._namespaces.get(namespace, {}).get(name)

    def counts(self) -> dict[str, int]:
        out = dict.fromkeys(STATES, 0)
        for jobs in self._namespaces.values():
            for summary in jobs.values():
                out[summary.state] = out.get(summary.state, 0) + 1
        return out

    # ----------------------------------------------------------------------------- reading the bus

    async def catch_up(self, js: JetStreamContext) -> int:
        """Fold in everything that arrived since the last call, a page at a time; how many messages."""
        import nats.js.errors

        from plumbing.bus_history import read_stream

        firsts: dict[str, int] = {}
        sources = [
            (streams.EVENTS_HISTORY.name, subjects.events_filter(), self.add_event),
            (streams.DLQ.name, f"{subjects.DLQ_PREFIX}.>", self.add_dead_letter),
            (streams.PROGRESS.name, f"{subjects.PROGRESS_PREFIX}.>", self.add_progress),
        ]
        for stream, _, _ in list(sources):
            try:
                info = await js.stream_info(stream)
            except nats.js.errors.NotFoundError:
                if stream != streams.PROGRESS.name:
                    raise
                sources.pop()  # a bus set up before progress was recorded: nothing to show, nothing to fail
                continue
            firsts[stream] = int(info.state.first_seq or 0)
            if int(info.state.last_seq or 0) + 1 < self.next_seq[stream]:
                # The stream was purged or made anew below our position: start over, so nothing counts twice.
                self.reset()
        read = 0
        for stream, subject, fold in sources:
            while True:
                page = await read_stream(js, stream, subject, start_seq=self.next_seq[stream], limit=READ_PAGE)
                for stored in page:
                    fold(stored)
                read += len(page)
                if not page:
                    break
                self.next_seq[stream] = page[-1].seq + 1
                if len(page) < READ_PAGE:
                    break
        self.prune(firsts[streams.EVENTS_HISTORY.name], firsts[streams.DLQ.name], firsts.get(streams.PROGRESS.name))
        return read
