"""Operator tools over the event history: what happened to a TrainJob, would a new planner change it,
what would a TrainJob produce, and what to do with dead letters.

All of them read the streams through ephemeral consumers (``plumbing.bus_history.read_stream``) and run the same
pure ``planner.core.plan`` the planner service runs, so what they show is what the pipeline does. None of
them needs key material: Secrets with keys are planned without data, and the keys are made by the applier
when it writes them, so the history can be read, copied and replayed freely.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, TypeVar

import msgspec

from contracts import streams, subjects
from contracts.messages import (
    ApplyMessage,
    ApplyTrainJobStatus,
    DeadLetter,
    Event,
    ObjectKey,
    TrainJobDeleted,
    TrainJobObserved,
    component_of,
    decode_apply,
    decode_dead_letter,
    decode_event,
    decode_result,
)
from contracts.progress import decode_progress
from planner import core as planner_core
from planner.core import plan
from planner.framework import Framework

if TYPE_CHECKING:
    from nats.js import JetStreamContext

    from plumbing.bus_history import StoredMessage


async def read_stream(
    js: JetStreamContext, stream: str, subject: str, *, where: Records | None = None, **options: Any
) -> list[StoredMessage]:
    """``plumbing.bus_history.read_stream``, imported when first used: ``plan`` and a mistyped argument need no NATS
    client library loaded.

    ``where`` a fleet cluster's records: the hub's fleet stream is read under the cluster's name, and each
    message comes back as the member stored it (its stream's and its subject's own names), so everything
    below reads a cluster's records at the hub exactly as it reads them on the cluster's own bus."""
    from dataclasses import replace

    from plumbing.bus_history import read_stream as read

    if where is None or not where.cluster:
        return await read(js, stream, subject, **options)
    found = await read(js, where.stream(stream), where.subject(subject), **options)
    return [replace(m, stream=stream, subject=subject_of(m.subject)) for m in found]


@dataclass(frozen=True)
class Records:
    """Whose records a read is about: this bus's own (``cluster`` empty), or one member cluster's copies in
    the hub's fleet streams.

    The one place that maps a cluster to where the hub keeps its records, following ``contracts.fleet``:
    a member's record stream ``TJ_X`` is the fleet stream ``FLEET_X_<cluster>``, and a record the member stored as
    ``S`` is stored there as ``fleet.<cluster>.S``. The cluster's name is a literal token of every subject
    read, never a wildcard, so a read about one cluster can only ever return that cluster's records.
    """

    cluster: str = ""

    def stream(self, name: str) -> str:
        from contracts import fleet

        return fleet.fleet_stream(name, self.cluster) if self.cluster else name

    def subject(self, subject: str) -> str:
        from contracts import fleet

        return fleet.fleet_subject(self.cluster, subject) if self.cluster else subject


LOCAL = Records()
"""The records of the bus a command is connected to."""


def subject_of(stored_subject: str) -> str:
    """The subject a record had in its member cluster, from the one the hub stores it under."""
    from contracts import fleet

    return fleet.cluster_of(stored_subject)[1]


Obj = dict[str, Any]

# ------------------------------------------------------------------------------------------- field diffs


def field_diff(old: Any, new: Any, path: str = "") -> list[tuple[str, Any, Any]]:
    """Paths at which two builtins trees differ, with both values; lists of named items are matched by name."""
    if isinstance(old, dict) and isinstance(new, dict):
        out: list[tuple[str, Any, Any]] = []
        for key in sorted(set(old) | set(new)):
            sub = f"{path}.{key}" if path else str(key)
            if key not in old:
                out.append((sub, None, new[key]))
            elif key not in new:
                out.append((sub, old[key], None))
            else:
                out.extend(field_diff(old[key], new[key], sub))
        return out
    if isinstance(old, list) and isinstance(new, list):
        if _named(old) and _named(new):
            return field_diff({i["name"]: i for i in old}, {i["name"]: i for i in new}, path)
        if len(old) == len(new):
            out = []
            for i, (a, b) in enumerate(zip(old, new, strict=True)):
                out.extend(field_diff(a, b, f"{path}[{i}]"))
            return out
    return [] if old == new else [(path, old, new)]


def _named(items: list[Any]) -> bool:
    return all(isinstance(i, dict) and "name" in i for i in items)


# ----------------------------------------------------------------------------------------------- history


@dataclass
class TimelineEntry:
    time: float
    stream: str
    seq: int
    kind: str
    summary: str
    detail: Obj = field(default_factory=dict)


def fold_progress(entries: Sequence[TimelineEntry]) -> list[TimelineEntry]:
    """The timeline as a person reads it at a terminal: each run of more than two training progress updates
    in a row becomes one entry that says how many there were, with the first and the last (``detail`` keeps
    ``updates`` and ``last_seq``); every other entry stays as it is. A job that reports every few seconds
    would otherwise bury its events and plans under hundreds of rows."""
    folded: list[TimelineEntry] = []
    run: list[TimelineEntry] = []

    def close_run() -> None:
        if len(run) > 2:
            first, last = run[0], run[-1]
            summary = f"{len(run)} progress updates: {first.summary} … {last.summary}"
            folded.append(replace(first, summary=summary, detail={"updates": len(run), "last_seq": last.seq}))
        else:
            folded.extend(run)
        run.clear()

    for entry in entries:
        if entry.kind == "progress":
            run.append(entry)
            continue
        close_run()
        folded.append(entry)
    close_run()
    return folded


def trainjob_state(job: Obj) -> tuple[str, str, str]:
    """The TrainJob's state as its owner would name it, with the reason and message that decided it.

    The order is the history list's (``history_server.index.state_of``): Trainer's terminal conditions,
    then suspension, then whether any of its Jobs has started (pods running or ready, or some already
    finished: between its last pod's end and Trainer's Complete condition a job is finishing, not waiting
    again); a job that was never any of these is Created. The reason and message are those of the deciding
    condition (e.g. ``AllJobsCompleted``)."""
    status = job.get("status") or {}
    true = {c.get("type"): c for c in status.get("conditions") or [] if c.get("status") == "True"}
    for state in ("Failed", "Complete", "Suspended"):
        if state in true:
            return state, str(true[state].get("reason") or ""), str(true[state].get("message") or "")
    if (job.get("spec") or {}).get("suspend"):
        return "Suspended", "", ""
    if any(_started(s) for s in status.get("jobsStatus") or []):
        return "Running", "", ""
    return "Created", "", ""


def _started(job_status: Obj) -> bool:
    return any((job_status.get(count) or 0) > 0 for count in ("active", "ready", "succeeded", "failed"))


def _event_summary(event: Event, previous: TrainJobObserved | None) -> tuple[str, Obj]:
    if isinstance(event, TrainJobDeleted):
        return "TrainJob deleted", {"uid": event.uid, "state": "Deleted"}
    job = msgspec.to_builtins(event.trainjob)
    changes: list[str] = []
    if previous is not None:
        before = msgspec.to_builtins(previous.trainjob)
        for part in ("spec", "status"):
            changes += [p for p, _, _ in field_diff(before.get(part), job.get(part), part)]
    rv = job.get("metadata", {}).get("resourceVersion", "")
    summary = f"{event.cause or 'observed'} (TrainJob rv {rv}, runtime from {event.runtime_source})"
    if event.runtime_error:
        summary += f"; runtime error: {event.runtime_error}"
    state, reason, message = trainjob_state(job)
    detail: Obj = {"cause": event.cause, "resourceVersion": rv, "changed": changes, "trace_id": event.trace_id}
    detail |= {"state": state, "reason": reason, "message": message}
    if event.runtime_error:
        detail["runtime_error"] = event.runtime_error
    return summary, detail


@dataclass(frozen=True)
class ProgressPoint:
    """One training progress update of a TrainJob, as the status server recorded it."""

    time: float
    """When the status server accepted it (Unix seconds, the server's clock, as every other record's time)."""
    seq: int
    pod: str
    last_updated: str
    """``lastUpdatedTime`` as the training code sent it (RFC 3339, the pod's clock)."""
    percentage: int | None
    remaining_seconds: int | None
    metrics: dict[str, str]
    """Each metric's value as sent: Trainer's API carries them as strings."""

    @classmethod
    def of(cls, record: Any, seq: int, stored_time: float) -> ProgressPoint:
        status = record.trainer_status
        unset = msgspec.UNSET
        return cls(
            time=record.received_at or stored_time,
            seq=seq,
            pod=record.pod,
            last_updated=status.last_updated_time if status.last_updated_time is not unset else "",
            percentage=status.progress_percentage if status.progress_percentage is not unset else None,
            remaining_seconds=(
                status.estimated_remaining_seconds if status.estimated_remaining_seconds is not unset else None
            ),
            metrics={
                str(m.name): str(m.value)
                for m in (status.metrics if status.metrics is not unset else [])
                if m.name is not unset and m.value is not unset
            },
        )

    def to_json(self) -> Obj:
        return {
            "time": self.time,
            "at": _iso(self.time),
            "lastUpdatedTime": self.last_updated,
            "pod": self.pod,
            "progressPercentage": self.percentage,
            "estimatedRemainingSeconds": self.remaining_seconds,
            "metrics": self.metrics,
        }

    def summary(self) -> str:
        parts = []
        if self.percentage is not None:
            parts.append(f"{self.percentage}%")
        if self.remaining_seconds is not None:
            parts.append(f"{_seconds(self.remaining_seconds)} left")
        parts += [f"{name} {value}" for name, value in sorted(self.metrics.items())]
        return " · ".join(parts or ["no figures"]) + (f" (pod {self.pod})" if self.pod else "")


def _iso(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, tz=dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _seconds(total: int) -> str:
    if total < 60:
        return f"{total}s"
    hours, rest = divmod(total, 3600)
    return f"{hours}h {rest // 60}m" if hours else f"{rest // 60}m {rest % 60}s"


async def progress_series(
    js: JetStreamContext, key: ObjectKey, *, since: float | None = None, where: Records = LOCAL
) -> list[ProgressPoint]:
    """Every progress update of one TrainJob the streams hold, in the order the status server accepted them.

    A record that does not decode (a newer writer's, or damaged) is left out; the rest are still shown."""
    found = await _read_progress(js, key, since, where)
    points = []
    for stored in found:
        try:
            record = decode_progress(stored.data)
        except (msgspec.MsgspecError, ValueError):
            continue
        points.append(ProgressPoint.of(record, stored.seq, stored.time))
    return sorted(points, key=lambda p: (p.time, p.seq))


async def _nothing() -> list[StoredMessage]:
    return []


async def _read_progress(
    js: JetStreamContext, key: ObjectKey, since: float | None, where: Records = LOCAL
) -> list[StoredMessage]:
    """The TrainJob's progress records; none on a bus set up before the progress stream existed."""
    import nats.js.errors

    subject = subjects.trainjob_progress_filter(key.namespace, key.name)
    try:
        return await read_stream(js, streams.PROGRESS.name, subject, where=where, start_time=since)
    except nats.js.errors.NotFoundError:
        return []


_FORMULA = ("=", "+", "-", "@", "\t", "\r")


def _cell(text: str) -> str:
    """A text cell a spreadsheet will not run as a formula; numbers (``-0.5``) stay numbers."""
    if text.startswith(_FORMULA):
        try:
            float(text)
        except ValueError:
            return "'" + text
    return text


def progress_csv(points: Iterable[ProgressPoint]) -> str:
    """The series as CSV (RFC 4180): one row per update, one column per metric, times in UTC."""
    import csv
    import io

    rows = list(points)
    metrics = sorted({m for p in rows for m in p.metrics})
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    header = ["time_utc", "last_updated_time", "pod", "progress_percentage", "estimated_remaining_seconds"]
    writer.writerow(header + [_cell(m) for m in metrics])
    for p in rows:
        writer.writerow(
            [
                _iso(p.time),
                _cell(p.last_updated),
                _cell(p.pod),
                "" if p.percentage is None else p.percentage,
                "" if p.remaining_seconds is None else p.remaining_seconds,
                *(_cell(p.metrics.get(m, "")) for m in metrics),
            ]
        )
    return buffer.getvalue()


async def read_records(
    js: JetStreamContext, key: ObjectKey, *, since: float | None = None, progress: bool = True, where: Records = LOCAL
) -> tuple[list[StoredMessage], list[StoredMessage], list[StoredMessage], list[StoredMessage], list[StoredMessage]]:
    """One TrainJob's stored records, stream by stream: events, plans, results, dead letters and (with
    ``progress``) progress updates, each oldest first. The streams are read at once: each read waits on the
    server, none on another."""
    ns, name = key.namespace, key.name
    events, plans, results, letters, updates = await asyncio.gather(
        read_stream(
            js, streams.EVENTS_HISTORY.name, subjects.trainjob_events_filter(ns, name), where=where, start_time=since
        ),
        read_stream(
            js, streams.APPLY_HISTORY.name, subjects.trainjob_apply_filter(ns, name), where=where, start_time=since
        ),
        read_stream(
            js, streams.RESULTS.name, subjects.trainjob_results_filter(ns, name), where=where, start_time=since
        ),
        read_stream(js, streams.DLQ.name, f"{subjects.DLQ_PREFIX}.*.{ns}.{name}", where=where, start_time=since),
        _read_progress(js, key, since, where) if progress else _nothing(),
    )
    return events, plans, results, letters, updates


async def history(
    js: JetStreamContext,
    key: ObjectKey,
    *,
    since: float | None = None,
    progress: bool = True,
    where: Records = LOCAL,
) -> list[TimelineEntry]:
    """Every event, planned component, apply result, dead letter and (with ``progress``) training progress
    update of one TrainJob, in time order.

    ``since`` skips what the streams hold from before that time (a caller that knows when the TrainJob's
    first event arrived saves the server the scan of everything older).

    Read at the hub (``where`` a cluster), two things the fleet's copies do not keep are taken from the
    records themselves: when each happened (the hub stores a copy when it arrives, which after the member
    was cut off can be much later, and in another order across streams), and an event's place in the
    member's work stream, which its plans name (``fleet_event_numbers``).
    """
    entries: list[TimelineEntry] = []
    previous: TrainJobObserved | None = None
    # Events and plans are named by their place in the work stream (what a plan's source_seq and a dead
    # letter's stream_seq refer to).
    events, plans, results, letters, updates = await read_records(js, key, since=since, progress=progress, where=where)
    fleet = bool(where.cluster)
    numbers = fleet_event_numbers(plans) if fleet else {}

    def when(stored: StoredMessage, own: float) -> float:
        return own if fleet and own > 0 else stored.time

    for stored, event in _decoded(events, decode_event, entries, "event", "undecodable event"):
        summary, detail = _event_summary(event, previous)
        seq = numbers.get((event.trace_id, event.observed_at), stored.origin_seq)
        at = when(stored, event.observed_at)
        entries.append(TimelineEntry(at, streams.EVENTS.name, seq, "event", summary, detail))
        if isinstance(event, TrainJobObserved):
            previous = event
    for stored, message in _decoded(plans, decode_apply, entries, "plan", "undecodable apply message"):
        entries.append(
            TimelineEntry(
                when(stored, message.observed_at),
                streams.APPLY.name,
                stored.origin_seq,
                "plan",
                f"{component_of(message)} → {message.target} "
                f"(policy {message.policy}, from event {message.source_seq})",
                {"component": component_of(message), "source_seq": message.source_seq, "target": str(message.target)},
            )
        )
    for stored, result in _decoded(results, decode_result, entries, "result", "undecodable apply result"):
        text = f"{result.action} {result.target} in {result.duration_ms:.0f} ms, {result.attempts} attempt(s)"
        if result.reason:
            text += f": {result.reason}"
        entries.append(
            TimelineEntry(
                when(stored, result.finished_at), stored.stream, stored.seq, "result", text, msgspec.to_builtins(result)
            )
        )
    for stored, letter in _decoded(letters, decode_dead_letter, entries, "dead-letter", "undecodable dead letter"):
        entries.append(
            TimelineEntry(
                when(stored, letter.dead_at),
                stored.stream,
                stored.seq,
                "dead-letter",
                f"{letter.stage}: {letter.reason}: {letter.error}",
                {"stage": letter.stage, "reason": letter.reason, "error": letter.error, "subject": letter.subject},
            )
        )
    for stored, record in _decoded(updates, decode_progress, entries, "progress", "undecodable progress update"):
        point = ProgressPoint.of(record, stored.seq, stored.time)
        entries.append(
            TimelineEntry(point.time, stored.stream, stored.seq, "progress", point.summary(), point.to_json())
        )
    return sorted(entries, key=lambda e: (e.time, e.stream, e.seq))


def fleet_event_numbers(plans: Iterable[StoredMessage]) -> dict[tuple[str, float], int]:
    """An event's sequence in its member's work stream, by the event's trace id and observation time.

    A plan names the event it was made from by that sequence (``source_seq``). The member's history copy
    keeps it (``origin_seq``), but the hub's copy of that copy names the member's history stream instead,
    so at the hub an event is numbered by the plans made from it: they carry its trace id and the time it
    was observed. An event nothing was planned from keeps the number the copy gives it."""
    numbers: dict[tuple[str, float], int] = {}
    for stored in plans:
        try:
            message = decode_apply(stored.data)
        except msgspec.MsgspecError:
            continue
        numbers.setdefault((message.trace_id, message.observed_at), message.source_seq)
    return numbers


async def plans_of(
    js: JetStreamContext,
    key: ObjectKey,
    source_seqs: Iterable[int],
    *,
    since: float | None = None,
    where: Records = LOCAL,
) -> dict[int, list[ApplyMessage]]:
    """The recorded plans of one TrainJob made from each of the events ``source_seqs``, by event sequence."""
    wanted = set(source_seqs)
    found: dict[int, list[ApplyMessage]] = {seq: [] for seq in wanted}
    subject = subjects.trainjob_apply_filter(key.namespace, key.name)
    for stored in await read_stream(js, streams.APPLY_HISTORY.name, subject, where=where, start_time=since):
        try:
            message = decode_apply(stored.data)
        except msgspec.MsgspecError:
            continue
        if message.source_seq in wanted:
            found[message.source_seq].append(message)
    return found


_Decoded = TypeVar("_Decoded")


def _decoded(
    messages: Iterable[StoredMessage],
    decode: Callable[[bytes], _Decoded],
    entries: list[TimelineEntry],
    kind: str,
    undecodable: str,
) -> Iterator[tuple[StoredMessage, _Decoded]]:
    """Each message with its decoded body; one that does not decode becomes a line of its own in ``entries``
    (summary ``undecodable``), so one bad record neither hides the rest nor stops the timeline."""
    for stored in messages:
        try:
            decoded = decode(stored.data)
        except msgspec.MsgspecError:
            entries.append(_raw_entry(stored, kind, undecodable))
            continue
        yield stored, decoded


_RECORDED_FROM = {history: work for work, history in streams.HISTORY_OF.items()}


def _raw_entry(stored: StoredMessage, kind: str, summary: str) -> TimelineEntry:
    """A record named like the decoded ones: a history copy by its work stream and its place there."""
    stream = _RECORDED_FROM.get(stored.stream, stored.stream)
    seq = stored.origin_seq or stored.seq
    return TimelineEntry(stored.time, stream, seq, kind, summary, {"subject": stored.subject})


# ------------------------------------------------------------------------------------------------ replay


@dataclass
class ReplayedEvent:
    key: ObjectKey
    seq: int
    changed: dict[str, list[tuple[str, Any, Any]]]
    """Per component: the fields whose planned value differs from the recorded plan."""


@dataclass
class ReplayReport:
    events: list[ReplayedEvent] = field(default_factory=list)

    @property
    def changed_jobs(self) -> set[str]:
        return {str(e.key) for e in self.events if e.changed}

    @property
    def jobs(self) -> set[str]:
        return {str(e.key) for e in self.events}

    def changed_fields(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for event in self.events:
            for component, diffs in event.changed.items():
                for path, _, _ in diffs:
                    label = f"{component}: {path}"
                    counts[label] = counts.get(label, 0) + 1
        return counts


def _comparable(message: ApplyMessage) -> Obj:
    """What a plan decided, without what only says when, why and in which format it was made (a plan
    recorded before messages carried ``wire_version`` decided what today's does), nor how soon the applier
    may write it (``paced``: a status recorded before the applier paced statuses decided the same status), nor
    when it sends a create-only Secret again (``recheck``: a Secret recorded before it decided the same Secret)."""
    body: Obj = msgspec.to_builtins(message)
    for volatile in ("trace_id", "source_seq", "wire_version", "paced", "recheck"):
        body.pop(volatile, None)
    return body


def compare_plans(recorded: Iterable[ApplyMessage], replayed: Iterable[ApplyMessage]) -> dict[str, list[Any]]:
    old = {component_of(m): _comparable(m) for m in recorded}
    new = {component_of(m): _comparable(m) for m in replayed}
    changed: dict[str, list[Any]] = {}
    for component in sorted(set(old) | set(new)):
        if component not in old:
            changed[component] = [("(component)", None, "planned now, not before")]
        elif component not in new:
            changed[component] = [("(component)", "planned before", None)]
        else:
            diffs = field_diff(old[component], new[component])
            if diffs:
                changed[component] = diffs
    return changed


async def replay(
    js: JetStreamContext,
    *,
    key: ObjectKey | None,
    since: float | None = None,
    from_seq: int | None = None,
    framework: Framework | None = None,
    progress: Any = None,
    where: Records = LOCAL,
) -> ReplayReport:
    """Plan every recorded event again, offline, and compare with the plans recorded for it.

    ``where`` a fleet cluster: its records at the hub, each event numbered as its plans name it
    (``fleet_event_numbers``)."""
    subject = subjects.trainjob_events_filter(key.namespace, key.name) if key else subjects.events_filter()
    apply_subject = subjects.trainjob_apply_filter(key.namespace, key.name) if key else subjects.apply_filter()
    read_events = await read_stream(js, streams.EVENTS_HISTORY.name, subject, where=where, start_time=since)
    plans_read: list[StoredMessage] | None = None
    numbers: dict[tuple[str, float], int] = {}
    if where.cluster and read_events:
        plans_read = await read_stream(js, streams.APPLY_HISTORY.name, apply_subject, where=where, start_time=since)
        numbers = fleet_event_numbers(plans_read)
    decoded: list[tuple[int, Event | None]] = []
    for stored in read_events:
        try:
            event: Event | None = decode_event(stored.data)
        except msgspec.MsgspecError:
            event = None  # dead-lettered by the planner; nothing was planned from it
        seq = numbers.get((event.trace_id, event.observed_at), stored.origin_seq) if event else stored.origin_seq
        if from_seq is None or seq >= from_seq:
            decoded.append((seq, event))
    # A plan belongs to the event it names and to the TrainJob it is for: a message that names another
    # TrainJob's event (a forged or mistaken one) is not that event's plan.
    recorded: dict[tuple[int, str, str], list[ApplyMessage]] = {}
    first_seq = min((seq for seq, _ in decoded), default=None)
    if first_seq is not None:
        if plans_read is None:
            plans_read = await read_stream(js, streams.APPLY_HISTORY.name, apply_subject, start_time=since)
        for stored in plans_read:
            try:
                message = decode_apply(stored.data)
            except msgspec.MsgspecError:
                continue
            if message.source_seq >= first_seq:
                owner = (message.source_seq, message.trainjob.namespace, message.trainjob.name)
                recorded.setdefault(owner, []).append(message)
    report = ReplayReport()
    for seq, event in decoded:
        if progress is not None:
            progress()
        if event is None:
            continue
        result = plan(event, source_seq=seq, framework=framework or planner_core.FRAMEWORK)
        owner = (seq, result.trainjob.namespace, result.trainjob.name)
        planned_before = recorded.get(owner, [])
        if isinstance(event, TrainJobObserved) and event.echo:
            # An echo is planned from its status alone; a planner older than the mark planned it whole, and
            # the components it sent again from it (each found unchanged) are not what the echo decides.
            planned_before = [m for m in planned_before if isinstance(m, ApplyTrainJobStatus)]
        changed = compare_plans(planned_before, result.applies)
        report.events.append(ReplayedEvent(key=result.trainjob, seq=seq, changed=changed))
    return report


async def recorded_observation(js: JetStreamContext, key: ObjectKey, *, where: Records = LOCAL) -> TrainJobObserved:
    """The newest observation of a TrainJob the history holds (the TrainJob with its runtime, as the watcher
    saw them): what ``plan --from-history`` plans again. ``LookupError`` when there is none."""
    found = await read_stream(
        js, streams.EVENTS_HISTORY.name, subjects.trainjob_events_filter(key.namespace, key.name), where=where
    )
    for stored in reversed(found):
        try:
            event = decode_event(stored.data)
        except msgspec.MsgspecError:
            continue
        if isinstance(event, TrainJobObserved):
            return event
    raise LookupError(f"no recorded observation of TrainJob {key}")


# --------------------------------------------------------------------------------------------- dead letters


@dataclass
class StoredDeadLetter:
    seq: int
    time: float
    letter: DeadLetter


async def dead_letters(js: JetStreamContext) -> list[StoredDeadLetter]:
    out = []
    for stored in await read_stream(js, streams.DLQ.name, f"{subjects.DLQ_PREFIX}.>"):
        try:
            out.append(StoredDeadLetter(stored.seq, stored.time, decode_dead_letter(stored.data)))
        except msgspec.MsgspecError:
            continue
    return out


async def retry_dead_letter(js: JetStreamContext, seq: int) -> str:
    """Send a dead letter's original payload back to its subject, then remove it from the DLQ."""
    raw = await js.get_msg(streams.DLQ.name, seq)
    letter = decode_dead_letter(raw.data or b"")
    headers = {k: v for k, v in letter.headers.items() if k != "Nats-Msg-Id"}
    headers["Nats-Msg-Id"] = f"dlq-retry:{seq}:{dt.datetime.now(dt.UTC).timestamp()}"
    await js.publish(letter.subject, letter.payload, headers=headers)
    await js.delete_msg(streams.DLQ.name, seq)
    return letter.subject


# --------------------------------------------------------------------------------------------------- plan


def preview(
    trainjob: Obj, runtime: Obj | None, *, jobset: Obj | None = None, framework: Framework | None = None
) -> list[ApplyMessage]:
    """What the pipeline would apply for this TrainJob and runtime, computed offline."""
    from contracts.jobset import JobSet
    from contracts.trainer import TrainingRuntime, TrainJob

    job = dict(trainjob)
    meta = dict(job.get("metadata") or {})
    meta.setdefault("namespace", "default")
    meta.setdefault("uid", "00000000-0000-0000-0000-000000000000")
    job["metadata"] = meta
    event = TrainJobObserved(
        trainjob=msgspec.convert(job, TrainJob),
        runtime=msgspec.convert(runtime, TrainingRuntime) if runtime is not None else None,
        runtime_source="live" if runtime is not None else "none",
        jobset=msgspec.convert(jobset, JobSet) if jobset is not None else None,
        observed_at=dt.datetime.now(dt.UTC).timestamp(),
        cause="tjpipe plan",
    )
    result = plan(event, source_seq=0, framework=framework or planner_core.FRAMEWORK)
    return list(result.applies)
