"""``history``, ``replay`` and ``dlq`` as subprocesses on a real nats-server holding a recorded TrainJob.

The recording is made here the way the services make it (an event, the plans ``planner.core.plan`` makes of
it, a dead letter), with user data that rich would read as markup: a function's source with ``batch[i]``
and ``[/opt/x]`` in the container command, ``[bold]`` and ``:smile:`` in the event's cause and the error.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import msgspec
import pytest
import yaml

from contracts import subjects
from contracts.messages import DeadLetter, TrainJobObserved, component_of, encode
from contracts.trainer import TrainingRuntime, TrainJob
from planner.core import plan
from plumbing import bus as plumbing_bus
from tjpipe.credentials import generate_credentials

from .conftest import Bus
from .support import SDK_COMMAND, runtime, tjpipe, trainjob

pytestmark = [pytest.mark.nats]

CAUSE = "resync [bold]now[/bold] :smile:"
ERROR = "refused: x = batch[i] in [/opt/x] [red]"
T = TypeVar("T")


def _run(coroutine: Callable[[], Awaitable[T]]) -> T:
    """Run async set-up from a sync fixture, on its own loop in its own thread."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coroutine()).result()  # type: ignore[arg-type]


@dataclass(frozen=True)
class Recorded:
    namespace: str
    event_seq: int
    fresh_seq: int
    plans: list[tuple[str, str, str]]
    """(component, target, policy) of each recorded plan of ``sdk``."""
    letter_seq: int
    letter: DeadLetter


def _event(namespace: str, name: str) -> TrainJobObserved:
    job = trainjob(name, namespace, "tiny")
    job["metadata"] = {**job["metadata"], "uid": f"uid-{name}", "resourceVersion": "7"}  # type: ignore[dict-item]
    return TrainJobObserved(
        trainjob=msgspec.convert(job, TrainJob),
        runtime=msgspec.convert(runtime("tiny"), TrainingRuntime),
        runtime_source="live",
        observed_at=time.time(),
        cause=CAUSE,
    )


@pytest.fixture(scope="module")
def recorded(own_bus: Bus) -> Recorded:
    """``sdk``: an event, its plans and a dead letter; ``fresh``: an event nothing was planned from yet."""
    namespace = "cli-" + os.urandom(3).hex()

    async def record() -> Recorded:
        nc = await plumbing_bus.connect(own_bus.url, name="test-record", creds=own_bus.credentials.seed_file("admin"))
        try:
            js = nc.jetstream()
            event = _event(namespace, "sdk")
            event_seq = (await js.publish(subjects.event_subject(namespace, "sdk"), encode(event))).seq
            planned = plan(event, source_seq=event_seq).applies
            for message in planned:
                subject = subjects.apply_subject(namespace, "sdk", component_of(message))
                await js.publish(subject, encode(message))
            fresh_seq = (
                await js.publish(subjects.event_subject(namespace, "fresh"), encode(_event(namespace, "fresh")))
            ).seq
            jobset = next(m for m in planned if component_of(m) == "jobset")
            letter = DeadLetter(
                stage="applier",
                reason="permanent",
                error=ERROR,
                subject=subjects.apply_subject(namespace, "sdk", "jobset"),
                payload=encode(jobset),
                headers={"X-Note": "[i]"},
                stream_seq=3,
                deliveries=1,
                dead_at=1_700_000_000.0,
            )
            letter_seq = (await js.publish(subjects.dlq_subject("applier", namespace, "sdk"), encode(letter))).seq
        finally:
            await nc.close()
        return Recorded(
            namespace=namespace,
            event_seq=event_seq,
            fresh_seq=fresh_seq,
            plans=[(component_of(m), str(m.target), m.policy) for m in planned],
            letter_seq=letter_seq,
            letter=letter,
        )

    return _run(record)


def _exact_json(stdout: str) -> Any:
    """The parsed output, after checking it is printed exactly as ``json.dumps(indent=2)`` prints it."""
    parsed = json.loads(stdout)
    assert stdout == json.dumps(parsed, indent=2, ensure_ascii=False) + "\n"
    return parsed


def test_history_as_json_yaml_and_table(own_bus: Bus, recorded: Recorded) -> None:
    ns = recorded.namespace
    done = tjpipe("history", f"{ns}/sdk", "-o", "json", env=own_bus.env())
    assert (done.returncode, done.stderr) == (0, "")
    rows = _exact_json(done.stdout)
    assert [(r["kind"], r["stream"], r["seq"]) for r in rows] == [
        ("event", "TJ_EVENTS", recorded.event_seq),
        *[("plan", "TJ_APPLY", seq + 1) for seq in range(len(recorded.plans))],
        ("dead-letter", "TJ_DLQ", recorded.letter_seq),
    ]
    assert rows[0]["summary"] == f"{CAUSE} (TrainJob rv 7, runtime from live)"
    assert [r["summary"] for r in rows[1:-1]] == [
        f"{component} → {target} (policy {policy}, from event {recorded.event_seq})"
        for component, target, policy in recorded.plans
    ]
    assert rows[-1]["summary"] == f"applier: permanent: {ERROR}"

    as_yaml = tjpipe("history", "sdk", "-n", ns, "-o", "yaml", env=own_bus.env())
    assert (as_yaml.returncode, as_yaml.stderr) == (0, "")
    assert yaml.safe_load(as_yaml.stdout) == rows

    table = tjpipe("history", f"{ns}/sdk", env=own_bus.env())
    assert (table.returncode, table.stderr) == (0, "")
    assert f"history of TrainJob {ns}/sdk" in table.stdout
    assert f"{CAUSE} (TrainJob rv 7, runtime from live)" in table.stdout
    assert f"applier: permanent: {ERROR}" in table.stdout

    missing = tjpipe("history", f"{ns}/nope", env=own_bus.env())
    assert (missing.returncode, missing.stdout) == (3, "")
    assert missing.stderr == f"error: no history for TrainJob {ns}/nope (wrong name, or older than the streams keep)\n"


def test_replay_exit_codes_and_formats(own_bus: Bus, recorded: Recorded) -> None:
    ns = recorded.namespace
    same = tjpipe("replay", f"{ns}/sdk", "-o", "json", env=own_bus.env())
    assert (same.returncode, same.stderr) == (0, "")
    assert _exact_json(same.stdout) == {"events": 1, "jobs": 1, "jobs_changed": [], "fields_changed": {}, "changes": []}
    table = tjpipe("replay", "sdk", "-n", ns, env=own_bus.env())
    assert (table.returncode, table.stdout, table.stderr) == (
        0,
        "replayed 1 event(s) of 1 TrainJob(s): 1 unchanged, 0 changed\n",
        "",
    )

    changed = tjpipe("replay", f"{ns}/fresh", "-o", "yaml", env=own_bus.env())  # nothing was planned from it
    assert (changed.returncode, changed.stderr) == (1, "")
    report = yaml.safe_load(changed.stdout)
    components = sorted(component.replace("sdk-", "fresh-") for component, _, _ in recorded.plans)
    assert report == {
        "events": 1,
        "jobs": 1,
        "jobs_changed": [f"{ns}/fresh"],
        "fields_changed": {f"{c}: (component)": 1 for c in components},
        "changes": [
            {
                "trainjob": f"{ns}/fresh",
                "seq": recorded.fresh_seq,
                "components": {
                    c: [{"field": "(component)", "recorded": None, "replayed": "planned now, not before"}]
                    for c in components
                },
            }
        ],
    }
    human = tjpipe("replay", f"{ns}/fresh", env=own_bus.env())
    assert (human.returncode, human.stderr) == (1, "")
    assert human.stdout == (
        f"{ns}/fresh event {recorded.fresh_seq}:\n"
        + "".join(f"  {c}: (component): null → planned now, not before\n" for c in components)
        + "replayed 1 event(s) of 1 TrainJob(s): 0 unchanged, 1 changed\n"
        + "fields changed: "
        + ", ".join(f"{c}: (component) (1)" for c in components)
        + "\n"
    )

    everything = tjpipe("replay", "--all", "--since", "1h", "-o", "json", env=own_bus.env())
    assert (everything.returncode, everything.stderr) == (1, "")
    assert _exact_json(everything.stdout)["jobs"] == 2
    later = tjpipe("replay", "--all", "--since", "2099-01-01T00:00:00Z", "-o", "json", env=own_bus.env())
    assert (later.returncode, later.stderr) == (0, "")
    assert _exact_json(later.stdout)["events"] == 0


def test_wrong_credentials_are_refused(own_bus: Bus, recorded: Recorded, tmp_path: Path) -> None:
    stranger = generate_credentials(tmp_path / "creds").seed_file("reader")
    done = tjpipe("history", f"{recorded.namespace}/sdk", env={**own_bus.env(), "NATS_CREDS": str(stranger)})
    assert (done.returncode, done.stdout) == (3, "")
    assert done.stderr == (
        f"error: the NATS server at {own_bus.url} refused the credentials of tjpipe-history ({stranger}) "
        "(set NATS_CREDS, e.g. from .tjpipe/env)\n"
    )


def test_bus_setup_as_admin_and_as_a_stranger(own_bus: Bus, tmp_path: Path) -> None:
    done = tjpipe("bus-setup", env=own_bus.env("admin"))  # the bus exists already: an update that changes nothing
    assert (done.returncode, done.stdout, done.stderr) == (
        0,
        "",
        "bus set up: streams, per-partition consumers, KV buckets\n",
    )
    stranger = generate_credentials(tmp_path / "creds").seed_file("admin")
    done = tjpipe("bus-setup", env={**own_bus.env(), "NATS_CREDS": str(stranger)})
    assert (done.returncode, done.stdout) == (3, "")
    assert done.stderr.startswith(
        f"error: the NATS server at {own_bus.url} refused the credentials of tjpipe-bus-setup"
    )


def test_dead_letters_list_show_and_retry(own_bus: Bus, recorded: Recorded) -> None:
    seq, letter = recorded.letter_seq, recorded.letter
    listed = tjpipe("dlq", "list", "-o", "json", env=own_bus.env())
    assert (listed.returncode, listed.stderr) == (0, "")
    rows = _exact_json(listed.stdout)
    assert len(rows) == 1 and rows[0]["seq"] == seq
    expected = {
        "seq": seq,
        "time": rows[0]["time"],
        "stage": "applier",
        "reason": "permanent",
        "error": ERROR,
        "subject": letter.subject,
        "payload": letter.payload.decode(),
        "headers": {"X-Note": "[i]"},
        "stream_seq": 3,
        "deliveries": 1,
        "dead_at": 1_700_000_000.0,
    }
    assert rows == [expected]

    table = tjpipe("dlq", "list", env=own_bus.env())
    assert (table.returncode, table.stderr) == (0, "")
    assert "1 dead letter(s)" in table.stdout and ERROR in table.stdout and letter.subject in table.stdout

    shown = tjpipe("dlq", "show", str(seq), "-o", "json", env=own_bus.env())
    assert (shown.returncode, shown.stderr) == (0, "")
    decoded = {**expected, "payload": json.loads(letter.payload)}
    assert _exact_json(shown.stdout) == decoded
    container = decoded["payload"]["object"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert container["containers"][0]["command"] == SDK_COMMAND
    as_yaml = tjpipe("dlq", "show", str(seq), env=own_bus.env())
    assert (as_yaml.returncode, as_yaml.stderr) == (0, "")
    assert yaml.safe_load(as_yaml.stdout) == decoded
    assert "x = batch[i]\n" in as_yaml.stdout and f"\nerror: '{ERROR}'\n" in as_yaml.stdout

    unknown = tjpipe("dlq", "show", str(seq + 100), env=own_bus.env())
    assert (unknown.returncode, unknown.stdout, unknown.stderr) == (
        3,
        "",
        f"error: no dead letter with sequence {seq + 100}\n",
    )

    refused = tjpipe("dlq", "retry", str(seq), env=own_bus.env("reader"), timeout=120)
    assert (refused.returncode, refused.stdout) == (3, "")
    assert refused.stderr == (
        f"error: no answer for dead letter {seq}: the NATS identity in use may not resend dead letters "
        "(use the dlq-operator identity, e.g. NATS_CREDS=.tjpipe/creds/dlq-operator.nk)\n"
    )
    retried = tjpipe("dlq", "retry", str(seq), env=own_bus.env("dlq-operator"))
    assert (retried.returncode, retried.stdout, retried.stderr) == (
        0,
        f"dead letter {seq} sent back to {letter.subject}\n",
        "",
    )
    emptied = tjpipe("dlq", "list", "-o", "yaml", env=own_bus.env())
    assert (emptied.returncode, emptied.stdout, emptied.stderr) == (0, "[]\n", "")
