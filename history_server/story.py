"""A TrainJob's timeline told in its owner's words: what state the job was in and when, and one plain line per
record, with the pipeline's own wording kept for whoever opens a record.

Why apart from ``tjpipe.history_tools.history``: that timeline is the operator's (``tjpipe history`` prints it), in
the pipeline's terms, resource versions, apply policies and stream sequences, which is what an operator
debugging the pipeline needs. A data scientist opening the history server asks other questions, "when did
my job start running, how long did it run, why did it stop", so this module reads the same entries and
answers those: the states the job went through (Created, Running, Suspended, Complete, Failed, Deleted)
with the reason Trainer's condition gives and how long each lasted, and a sentence per record. It is a pure
function of the entries, so the page, the API and the tests all see the same story.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tjpipe.history_tools import TimelineEntry

SUCCESS = frozenset({"created", "configured", "unchanged", "deleted"})
"""Apply outcomes that did what the plan asked; ``skipped`` and ``failed`` did not."""

_STATUS_PARTS = {
    "status.conditions": "conditions",
    "status.jobsStatus": "its Jobs' status",
    "status.trainerStatus": "training progress",
}


@dataclass(frozen=True)
class Phase:
    """A stretch of time the TrainJob spent in one state."""

    state: str
    start: float
    end: float | None
    """When the next state began; ``None`` for the state it is in now (or ended in)."""
    reason: str = ""
    message: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "from": self.start,
            "to": self.end,
            "seconds": None if self.end is None else round(self.end - self.start, 3),
            "reason": self.reason,
            "message": self.message,
        }


_STARTED = frozenset({"Running", "Complete", "Failed"})


def _owned(state: str, before: str) -> str:
    """The state the owner would say the job is in: a job that has started never waits for its pods again
    unless it was suspended in between, so an event that reads Created after Running (a status written from
    an older observation, or the moment between the last pod's end and Trainer's Complete) keeps the state
    before it."""
    return before if state == "Created" and before in _STARTED else state


def phases(entries: Iterable[TimelineEntry]) -> list[Phase]:
    """The states the events show, each from the first event in it to the first event of the next.

    A TrainJob deleted and made again under the same name starts over at Created: its phases follow the
    deletion's."""
    out: list[Phase] = []
    for entry in entries:
        if entry.kind != "event" or not entry.detail.get("state"):
            continue
        state = _owned(str(entry.detail["state"]), out[-1].state if out else "")
        reason, message = str(entry.detail.get("reason") or ""), str(entry.detail.get("message") or "")
        if out and out[-1].state == state:
            if not out[-1].reason and reason:  # the reason may arrive on a later event of the same state
                out[-1] = Phase(out[-1].state, out[-1].start, None, reason, message)
            continue
        if out:
            last = out[-1]
            out[-1] = Phase(last.state, last.start, entry.time, last.reason, last.message)
        out.append(Phase(state, entry.time, None, reason, message))
    return out


def running_seconds(found: Sequence[Phase], now: float) -> float:
    """How long the job ran: its Running phases, the current one up to ``now``."""
    return sum((p.end if p.end is not None else now) - p.start for p in found if p.state == "Running")


def tone(entry: TimelineEntry) -> str:
    """How a record should look: ``ok`` (an apply did what was planned), ``skipped`` (left as it was),
    ``failed`` (an apply failed or was given up on), ``info`` (everything else)."""
    if entry.kind == "dead-letter":
        return "failed"
    if entry.kind == "result":
        action = entry.detail.get("action")
        if action in SUCCESS:
            return "ok"
        return "failed" if action == "failed" else "skipped"
    if entry.kind == "event" and entry.detail.get("state") == "Failed":
        return "failed"
    return "info"


def _target(target: Any) -> str:
    """``JobSet mnist``, or ``the TrainJob's status``, from a target as a dict or as ``Target``'s text."""
    if isinstance(target, dict):
        kind, subresource, target_name = target.get("kind", ""), target.get("subresource"), target.get("name", "")
    else:
        text = str(target or "")
        kind_part, _, key = text.partition(" ")
        kind, _, subresource = kind_part.partition("/")
        target_name = key.rpartition("/")[2]
    if kind == "TrainJob" and subresource == "status":
        return "the TrainJob's status"
    if kind == "TrainJob":
        return "the TrainJob"
    return f"{kind} {target_name}".strip()


def _changed(detail: dict[str, Any]) -> tuple[list[str], list[str]]:
    """The spec fields the owner changed (without ``spec.``) and the parts of the status that moved."""
    spec, status = [], []
    for path in detail.get("changed") or []:
        if path.startswith("spec."):
            spec.append(path.removeprefix("spec."))
        else:
            part = next((words for prefix, words in _STATUS_PARTS.items() if path.startswith(prefix)), "status")
            if part not in status:
                status.append(part)
    return spec, status


def _state_words(state: str, reason: str, message: str, before: str) -> str:
    if state == "Running":
        return "Resumed and running" if before == "Suspended" else "Running"
    if state == "Created":
        return "Resumed, waiting for its pods" if before == "Suspended" else "Waiting for its pods"
    words = state
    if reason and reason != state:
        words += f" — {reason}"
    if message and message not in (reason, f"TrainJob is {state.lower()}"):
        words += f": {message}"
    return words


def texts(entries: Sequence[TimelineEntry]) -> list[str]:
    """One sentence per entry, in the same order."""
    out: list[str] = []
    before = ""
    for entry in entries:
        d = entry.detail
        if entry.kind == "event":
            state = _owned(str(d.get("state") or ""), before)
            cause = str(d.get("cause") or "")
            if state == "Deleted":
                text = "Deleted"
            elif not before:
                first = "Created" if cause.endswith("ADDED") else "First seen"
                text = first if state == "Created" else f"{first}: {_state_words(state, d.get('reason', ''), '', '')}"
            elif state and state != before:
                text = _state_words(state, str(d.get("reason") or ""), str(d.get("message") or ""), before)
            else:
                spec, status = _changed(d)
                if spec:
                    text = "Changed: " + ", ".join(spec[:6]) + (f" and {len(spec) - 6} more" if len(spec) > 6 else "")
                elif status:
                    text = "Updated " + " and ".join(status)
                elif cause == "deadline reached":
                    text = "Its active deadline was reached"
                elif cause and not cause.startswith("TrainJob"):
                    kinds = sorted({part.split()[0] for part in cause.split(" + ") if part.strip()})
                    text = " and ".join(kinds) + " changed"
                else:
                    text = "Seen again, nothing changed"
            if d.get("runtime_error"):
                text += f" (runtime: {d['runtime_error']})"
            before = "" if state == "Deleted" else state or before
        elif entry.kind == "plan":
            text = f"Planned {_target(d.get('target') or entry.summary.partition(' → ')[2].partition(' (')[0])}"
        elif entry.kind == "result":
            what = _target(d.get("target"))
            reason = str(d.get("reason") or "")
            action = d.get("action")
            text = {
                "created": f"Created {what}",
                "configured": f"Updated {what}",
                "unchanged": f"{what[0].upper()}{what[1:]} already as planned",
                "deleted": f"Deleted {what}",
                "skipped": f"Left {what} as it was",
                "failed": f"Could not write {what}",
            }.get(str(action), f"{action} {what}")
            if reason:
                text += f": {reason}"
        elif entry.kind == "dead-letter":
            text = f"The {d.get('stage') or 'pipeline'} gave up: {d.get('error') or d.get('reason') or entry.summary}"
        else:
            text = entry.summary
        if entry.summary.startswith("undecodable"):
            text = f"A record that could not be read ({entry.kind})"
        out.append(text)
    return out


def counts(entries: Iterable[TimelineEntry]) -> dict[str, int]:
    out = {"event": 0, "plan": 0, "result": 0, "dead-letter": 0}
    for entry in entries:
        out[entry.kind] = out.get(entry.kind, 0) + 1
    return out
