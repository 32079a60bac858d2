"""Messages that older commits' own code wrote still decode, lose nothing, and are planned safely today.

The fixtures are not files kept in the repository but made here, each time, by the older commit's own
watcher trim, planner and encoder (its files from ``git archive``, run in a subprocess), from the same
inputs: so a change to today's types that an older writer's bytes no longer fit fails here, whichever
field it touches (``contracts.messages``: the wire-compatibility rule). Two older commits: the previous
release the rolling upgrade starts from (``compose.upgrade.PREVIOUS_RELEASE``) and the last watcher that
kept none of the JobSet's immutable spec fields.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest
from compose.upgrade import PREVIOUS_RELEASE, WATCHER_WITHOUT_IMMUTABLE_FIELDS, archive, commit_problem, missing_from
from needs import unavailable

from contracts import conditions
from contracts import messages as m
from contracts.jobset import JobSet
from contracts.trainer import TrainingRuntime, TrainJob
from planner.core import plan
from planner.immutability import LEFT_OUT_BY_OLD_WATCHERS
from tjpipe.history_tools import compare_plans

from .builders import replicated_job, runtime_dict, trainjob_dict

Obj = dict[str, Any]

NAMESPACE, NAME, UID = "compat", "tj", "9b2f6a4e-0000-4000-8000-000000000001"

OLD_WRITER = r"""
import base64, importlib, json, os, sys
tree = sys.argv[1]
sys.path.insert(0, tree)
import msgspec
# Before 41fc397 the packages were top-level (contracts, planner, watcher), not tjpipe's.
prefix = "tjpipe." if os.path.isdir(os.path.join(tree, "tjpipe", "contracts")) else ""
load = lambda name: importlib.import_module(prefix + name)
m = load("contracts.messages")
assert m.__file__.startswith(tree), m.__file__
JobSet = load("contracts.jobset").JobSet
TrainingRuntime, TrainJob = load("contracts.trainer").TrainingRuntime, load("contracts.trainer").TrainJob
plan = load("planner.core").plan
trim = load("watcher.trim")

given = json.load(sys.stdin)
job = msgspec.convert(given["trainjob"], TrainJob)
runtime = msgspec.convert(given["runtime"], TrainingRuntime)
live = trim.jobset(msgspec.convert(given["jobset"], JobSet))
added = m.TrainJobObserved(trainjob=job, runtime=runtime, observed_at=1.0, cause="TrainJob ADDED", trace_id="a")
modified = m.TrainJobObserved(
    trainjob=job, runtime=runtime, jobset=live, observed_at=2.0, cause="JobSet MODIFIED", trace_id="b"
)
deleted = m.TrainJobDeleted(key=m.ObjectKey(namespace=job.metadata.namespace, name=job.metadata.name),
                            uid=job.metadata.uid, observed_at=3.0)
applies = [*plan(added, source_seq=1).applies, *plan(modified, source_seq=2).applies]
out = lambda items: [base64.b64encode(m.encode(item)).decode() for item in items]
json.dump({"events": out([added, modified, deleted]), "applies": out(applies)}, sys.stdout)
"""


def _runtime() -> Obj:
    rjob = replicated_job("node", [{"name": "node", "image": "example.com/torch:1"}], ancestor="trainer")
    return runtime_dict(
        [rjob],
        name="torch-compat",
        metadata={"resourceVersion": "11", "labels": {"trainer.kubeflow.org/webhook-validation": "disabled"}},
        ml_policy={"numNodes": 2, "torch": {}},
    )


def _trainjob() -> Obj:
    return trainjob_dict(
        name=NAME,
        namespace=NAMESPACE,
        uid=UID,
        runtime="torch-compat",
        spec={"suspend": True},
        metadata={"resourceVersion": "5"},
    )


def _live_jobset() -> Obj:
    """The JobSet as the API server holds it after JobSet's webhook defaulted it: what today's planner builds
    for the TrainJob, suspended, with the spec fields JobSet sets at creation and then keeps."""
    first = m.TrainJobObserved(
        trainjob=msgspec.convert(_trainjob(), TrainJob),
        runtime=msgspec.convert(_runtime(), TrainingRuntime),
        observed_at=1.0,
    )
    (planned,) = [a for a in plan(first, source_seq=1).applies if isinstance(a, m.ApplyJobSet)]
    body: Obj = msgspec.to_builtins(planned.object)
    body["metadata"].update(uid="9b2f6a4e-0000-4000-8000-00000000000a", resourceVersion="7")
    body["spec"].update(
        suspend=True,
        network={"enableDNSHostnames": True, "publishNotReadyAddresses": True, "subdomain": NAME},
        successPolicy={"operator": "All"},
        startupPolicy={"startupPolicyOrder": "AnyOrder"},
    )
    return body


def _old_messages(commit: str, scratch: Path) -> dict[str, list[bytes]]:
    problem = commit_problem(commit)
    if problem is not None:
        unavailable(problem)
    tree = archive(commit, scratch / "tree", "tjpipe", "contracts", "planner", "watcher", "plumbing")
    given = {"trainjob": _trainjob(), "runtime": _runtime(), "jobset": _live_jobset()}
    env = {k: v for k, v in os.environ.items() if not k.startswith("TJPIPE_")}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    written = subprocess.run(
        [sys.executable, "-c", OLD_WRITER, str(tree)],
        input=json.dumps(given),
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert written.returncode == 0, written.stderr[-3000:]
    encoded = json.loads(written.stdout)
    return {kind: [base64.b64decode(item) for item in items] for kind, items in encoded.items()}


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, list[bytes]]]:
    """What each older commit wrote: its events and apply messages, by commit."""
    commits = (PREVIOUS_RELEASE, WATCHER_WITHOUT_IMMUTABLE_FIELDS)
    return {commit: _old_messages(commit, tmp_path_factory.mktemp("old-commit")) for commit in commits}


@pytest.fixture(params=[PREVIOUS_RELEASE, WATCHER_WITHOUT_IMMUTABLE_FIELDS])
def old(
    request: pytest.FixtureRequest, written: dict[str, dict[str, list[bytes]]]
) -> tuple[str, dict[str, list[bytes]]]:
    commit: str = request.param
    return commit, written[commit]


def test_old_events_decode_unversioned_and_lose_nothing(old: tuple[str, dict[str, list[bytes]]]) -> None:
    commit, messages = old
    assert len(messages["events"]) == 3
    for data in messages["events"]:
        assert b"wire_version" not in data
        event = m.decode_event(data)
        assert event.wire_version == m.UNVERSIONED, commit
        again = json.loads(m.encode(event))
        assert again.pop("wire_version") == m.UNVERSIONED
        assert missing_from(json.loads(data), again) == [], commit


def test_old_apply_messages_decode_unversioned_and_lose_nothing(old: tuple[str, dict[str, list[bytes]]]) -> None:
    commit, messages = old
    kinds = {type(m.decode_apply(data)) for data in messages["applies"]}
    assert {m.ApplyJobSet, m.ApplyTrainJobStatus, m.ApplyConfigMap} <= kinds, (commit, kinds)
    for data in messages["applies"]:
        message = m.decode_apply(data)
        assert message.wire_version == m.UNVERSIONED, commit
        again = json.loads(m.encode(message))
        assert again.pop("wire_version") == m.UNVERSIONED
        assert missing_from(json.loads(data), again) == [], (commit, type(message).__name__)


def _jobset_applies(p: m.Plan) -> list[m.ApplyJobSet]:
    return [a for a in p.applies if isinstance(a, m.ApplyJobSet)]


def _conditions(p: m.Plan) -> list[Obj]:
    status = [a for a in p.applies if isinstance(a, m.ApplyTrainJobStatus)]
    return [c for a in status for c in msgspec.to_builtins(a.object).get("status", {}).get("conditions", [])]


def test_a_resumable_jobset_is_replanned_from_each_old_watchers_event(old: tuple[str, dict[str, list[bytes]]]) -> None:
    """The previous release's watcher kept the immutable fields: the JobSet is re-applied with them as live.
    The older one kept none: the planner cannot tell what JobSet holds, so it leaves the JobSet alone (and
    says why) instead of removing the fields, which the API server would refuse or JobSet would default
    anew, and instead of a condition that they were kept."""
    commit, messages = old
    observed = m.decode_event(messages["events"][1])
    assert isinstance(observed, m.TrainJobObserved) and observed.jobset is not None
    carried = set(msgspec.to_builtins(observed.jobset.spec)) & set(LEFT_OUT_BY_OLD_WATCHERS)
    planned = plan(observed, source_seq=2)
    reasons = {c.get("reason") for c in _conditions(planned)}
    assert conditions.REASON_IMMUTABLE_FIELDS_KEPT not in reasons, (commit, reasons)
    if commit == PREVIOUS_RELEASE:
        assert carried == {"network", "successPolicy", "startupPolicy"}
        (jobset,) = _jobset_applies(planned)
        spec = msgspec.to_builtins(jobset.object)["spec"]
        live = _live_jobset()["spec"]
        assert {k: spec[k] for k in carried} == {k: live[k] for k in carried}
    else:
        assert carried == set()
        assert _jobset_applies(planned) == []
        assert any("carries none of the JobSet's immutable spec fields" in w for w in planned.warnings)
        # The same observation as today's watcher makes it is re-applied as usual.
        today = msgspec.structs.replace(
            observed, wire_version=m.WIRE_VERSION, jobset=msgspec.convert(_live_jobset(), JobSet)
        )
        assert len(_jobset_applies(plan(today, source_seq=2))) == 1


def test_a_newer_major_version_is_refused_with_its_reason() -> None:
    event = json.loads(m.encode(m.TrainJobDeleted(key=m.ObjectKey(namespace="a", name="b"), uid="u", observed_at=1.0)))
    event["wire_version"] = m.WIRE_VERSION + 1
    with pytest.raises(m.UnsupportedVersion, match="unsupported-version: an event of wire version 2") as refused:
        m.decode_event(json.dumps(event).encode())
    assert refused.value.reason == "unsupported-version"
    assert isinstance(refused.value, msgspec.ValidationError)  # what a consumer that knows no better dead-letters
    # Refused before the rest is read: a newer format need not decode as this one.
    newer = json.dumps({"component": "jobset", "wire_version": 7, "renamed": True}).encode()
    with pytest.raises(m.UnsupportedVersion, match="an apply message of wire version 7"):
        m.decode_apply(newer)


def test_todays_messages_carry_the_version_and_decode_as_written() -> None:
    written = m.TrainJobDeleted(key=m.ObjectKey(namespace="a", name="b"), uid="u", observed_at=1.0)
    assert json.loads(m.encode(written))["wire_version"] == m.WIRE_VERSION
    assert m.decode_event(m.encode(written)) == written


def test_todays_planner_plans_what_the_previous_release_planned(written: dict[str, dict[str, list[bytes]]]) -> None:
    """``tjpipe replay`` over a history the previous release wrote finds no change: the version a plan was
    written in is not part of what it decided."""
    messages = written[PREVIOUS_RELEASE]
    recorded = [m.decode_apply(data) for data in messages["applies"]]
    for seq, data in ((1, messages["events"][0]), (2, messages["events"][1])):
        replanned = plan(m.decode_event(data), source_seq=seq).applies
        assert compare_plans([r for r in recorded if r.source_seq == seq], replanned) == {}, seq


def test_a_running_jobset_of_an_old_watchers_event_is_left_alone_and_not_reported(
    written: dict[str, dict[str, list[bytes]]],
) -> None:
    observed = m.decode_event(written[WATCHER_WITHOUT_IMMUTABLE_FIELDS]["events"][1])
    assert isinstance(observed, m.TrainJobObserved) and observed.jobset is not None
    job, jobset = msgspec.to_builtins(observed.trainjob), msgspec.to_builtins(observed.jobset)
    job["spec"]["suspend"] = False
    jobset["spec"]["suspend"] = False
    running = msgspec.structs.replace(
        observed, trainjob=msgspec.convert(job, TrainJob), jobset=msgspec.convert(jobset, JobSet)
    )
    planned = plan(running, source_seq=2)
    assert _jobset_applies(planned) == []
    assert conditions.REASON_IMMUTABLE_FIELDS_KEPT not in {c.get("reason") for c in _conditions(planned)}
