"""``applier.claim_round.decide``: what one claim round does, for a message, its target's ledger record and the
live object, as a table with a row for every ``Step`` it can answer.

The fenced apply (``applier.fence``) only performs these steps, so a row here is the whole of the judgement
behind one outcome; the real-server suites (tests/faults, tests/security, tests/e2e) check the performing.
"""

from __future__ import annotations

from typing import Any, Literal, get_args

import msgspec
import pytest

from applier import claim_round, outcomes, steps
from contracts import labels
from contracts import messages as m
from contracts.jobset import JobSet
from contracts.kube import ConfigMap, Secret
from contracts.trainer import TrainJob

UID = "uid-1"
STAMP = "cluster-a/1"
KEY = m.ObjectKey(namespace="ns", name="tj")
OWNER = {
    "apiVersion": "trainer.kubeflow.org/v1alpha1",
    "kind": "TrainJob",
    "name": "tj",
    "uid": UID,
    "controller": True,
}


def _message(kind: type[m.ObjectApply], api_version: str, obj: dict[str, Any], **fields: Any) -> Any:
    object_type = {m.ApplyJobSet: JobSet, m.ApplyConfigMap: ConfigMap, m.ApplySecret: Secret}.get(kind, TrainJob)
    subresource: Literal["status"] | None = "status" if kind is m.ApplyTrainJobStatus else None
    target = m.Target(api_version=api_version, kind=obj["kind"], namespace="ns", name="tj", subresource=subresource)
    return kind(
        trainjob=KEY,
        trainjob_uid=UID,
        source_seq=4,
        source_version=40,
        target=target,
        object=msgspec.convert(obj, object_type),
        **fields,
    )


def jobset(policy: m.ApplyPolicy = "always") -> m.ApplyJobSet:
    obj = {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": "tj", "namespace": "ns", "ownerReferences": [OWNER]},
        "spec": {"suspend": False},
    }
    message: m.ApplyJobSet = _message(m.ApplyJobSet, "jobset.x-k8s.io/v1alpha2", obj, policy=policy)
    return message


def configmap(policy: m.ApplyPolicy = "if-absent") -> m.ApplyConfigMap:
    meta = {
        "name": "tj",
        "namespace": "ns",
        "ownerReferences": [OWNER],
        "labels": {labels.MANAGED_BY_LABEL: labels.MANAGED_BY},
    }
    obj = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {"a": "b"}}
    message: m.ApplyConfigMap = _message(m.ApplyConfigMap, "v1", obj, policy=policy)
    return message


def secret() -> m.ApplySecret:
    obj = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "tj", "namespace": "ns", "ownerReferences": [OWNER]},
    }
    message: m.ApplySecret = _message(m.ApplySecret, "v1", obj, policy="if-absent")
    return message


def status(planned_from: str = "5") -> m.ApplyTrainJobStatus:
    obj = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "tj", "namespace": "ns", "resourceVersion": planned_from},
        "status": {"conditions": []},
    }
    message: m.ApplyTrainJobStatus = _message(m.ApplyTrainJobStatus, "trainer.kubeflow.org/v1alpha1", obj)
    return message


def planned(message: m.ObjectApply) -> bytes:
    return msgspec.json.encode(message.object)


def live(
    message: m.ObjectApply,
    *,
    rv: str = "7",
    owner_uid: str = UID,
    without_label: bool = False,
    changed: bool = False,
) -> bytes:
    """The live target as the API server returns it: the plan as applied by ``trainer``, plus metadata."""
    obj = msgspec.json.decode(planned(message))
    meta = obj["metadata"]
    meta["resourceVersion"] = rv
    if "ownerReferences" in meta:
        meta["ownerReferences"] = [{**OWNER, "uid": owner_uid}]
    if without_label:
        del meta["labels"]
    if changed:
        obj.setdefault("data", {})["a"] = "changed"
        obj.setdefault("spec", {})["suspend"] = True
    meta["managedFields"] = [{"manager": "trainer", "operation": "Apply", "fieldsV1": {"f:metadata": {"f:name": {}}}}]
    return msgspec.json.encode(obj)


def claim(message: m.ObjectApply, *, created_for: str = "") -> m.AppliedRecord:
    return m.AppliedRecord(
        source_version=40,
        source_seq=4,
        digest=claim_round.content_digest(planned(message)),
        state="claimed",
        created_for=created_for,
        cluster=STAMP,
    )


def applied(
    message: m.ObjectApply, live_raw: bytes, *, source_version: int = 30, cluster: str = STAMP
) -> m.AppliedRecord:
    """The record of an earlier apply of this very plan, whose managed fields the live object still shows."""
    managed = claim_round.managed_digest(live_raw, manager="trainer", subresource=message.target.subresource)
    return m.AppliedRecord(
        source_version=source_version,
        source_seq=3,
        digest=claim_round.content_digest(planned(message)),
        state="applied",
        resource_version="6",
        managed=managed,
        cluster=cluster,
    )


def adopted(message: m.ObjectApply, live_raw: bytes) -> m.AppliedRecord:
    managed = claim_round.managed_digest(live_raw, manager="trainer", subresource=None)
    return msgspec.structs.replace(claim(message), state="applied", resource_version="7", managed=managed)


RUNNING = live(jobset("while-suspended"))
HELD = live(jobset())
UNLABELLED = live(configmap(), without_label=True)
CHANGED = live(jobset(), changed=True)
STATUS_LIVE = live(status(), rv="5")
OLD_SECRET = m.AppliedRecord(
    source_version=30, source_seq=3, digest="d", state="applied", created_for=UID, cluster=STAMP
)

# (what the row shows, message, ledger record, live object, the step decided)
TABLE: list[tuple[str, m.ObjectApply, m.AppliedRecord | None, bytes | None, steps.Step]] = [
    (
        "a live target another owner controls is refused",
        jobset(),
        None,
        live(jobset(), owner_uid="someone-else"),
        steps.Refuse(why="existing JobSet ns/tj is controlled by TrainJob tj, not by TrainJob ns/tj"),
    ),
    (
        "the applied record is this plan and the live object still holds it: the record advances",
        jobset(),
        applied(jobset(), HELD),
        HELD,
        steps.Advance(
            record=msgspec.structs.replace(applied(jobset(), HELD), source_version=40, source_seq=4),
            resource_version="7",
        ),
    ),
    (
        "the record was made in another epoch: advancing it restamps it",
        jobset(),
        applied(jobset(), HELD, cluster="cluster-a/0"),
        HELD,
        steps.Advance(
            record=msgspec.structs.replace(applied(jobset(), HELD), source_version=40, source_seq=4),
            resource_version="7",
        ),
    ),
    (
        "while-suspended and the live JobSet runs: left as it is",
        jobset("while-suspended"),
        None,
        RUNNING,
        steps.Leave(resource_version="7", reason="running and not suspended; left as it is"),
    ),
    (
        "if-absent and the object exists with the label: left as it is",
        configmap(),
        None,
        live(configmap()),
        steps.Leave(resource_version="7", reason="exists already; created once and never changed"),
    ),
    (
        "if-absent and the object exists without the label: only the label is added",
        configmap(),
        None,
        UNLABELLED,
        steps.Leave(
            resource_version="7",
            reason="exists already; created once and never changed; labelled",
            label=claim_round.OWNED_LABEL_PATCH,
        ),
    ),
    (
        "no record, and the live object already holds the plan: recorded, not written",
        jobset(),
        None,
        HELD,
        steps.Adopt(record=adopted(jobset(), HELD)),
    ),
    (
        "the live object holds the plan but for the label: recorded, and the label added",
        configmap("always"),
        None,
        UNLABELLED,
        steps.Adopt(record=adopted(configmap("always"), UNLABELLED), label=True),
    ),
    (
        "a Secret with no record: created, for nobody known",
        secret(),
        None,
        None,
        steps.Create(claim=claim(secret())),
    ),
    (
        "a Secret this cluster's record says was created for this TrainJob: the claim keeps that",
        secret(),
        OLD_SECRET,
        None,
        steps.Create(claim=claim(secret(), created_for=UID), known=OLD_SECRET),
    ),
    (
        "a Secret whose record is another cluster's: what it names is not believed",
        secret(),
        msgspec.structs.replace(OLD_SECRET, cluster="cluster-b/1"),
        None,
        steps.Create(claim=claim(secret())),
    ),
    (
        "a status planned from another TrainJob version than the live one: claimed, then skipped",
        status(planned_from="4"),
        msgspec.structs.replace(applied(status(planned_from="4"), STATUS_LIVE), managed="other"),
        STATUS_LIVE,
        steps.SkipStatus(claim=claim(status(planned_from="4")), resource_version="5"),
    ),
    (
        "an absent target: claimed and written with no precondition",
        jobset(),
        None,
        None,
        steps.Write(claim=claim(jobset()), precondition="", before=""),
    ),
    (
        "a live target that differs from the plan: written on condition of the version read",
        jobset(),
        None,
        CHANGED,
        steps.Write(claim=claim(jobset()), precondition="7", before="7"),
    ),
    (
        "a record of another plan: written, even though the live object looks the same",
        jobset(),
        msgspec.structs.replace(applied(jobset(), CHANGED), digest="another-plan"),
        CHANGED,
        steps.Write(claim=claim(jobset()), precondition="7", before="7"),
    ),
    (
        "a status of the live TrainJob version: written, its own version the precondition",
        status(),
        msgspec.structs.replace(applied(status(), STATUS_LIVE), managed="other"),
        STATUS_LIVE,
        steps.Write(claim=claim(status()), precondition="", before="5"),
    ),
    (
        "a status with no record is not read: written",
        status(),
        None,
        None,
        steps.Write(claim=claim(status()), precondition="", before=""),
    ),
]


@pytest.mark.parametrize(
    ("message", "record", "live_raw", "expected"), [row[1:] for row in TABLE], ids=[row[0] for row in TABLE]
)
def test_decide(
    message: m.ObjectApply, record: m.AppliedRecord | None, live_raw: bytes | None, expected: steps.Step
) -> None:
    assert claim_round.decide(message, record, live_raw, planned=planned(message), stamp=STAMP) == expected


def test_the_table_covers_every_step() -> None:
    assert {type(row[-1]) for row in TABLE} == set(get_args(steps.Step))


@pytest.mark.parametrize(
    ("message", "record", "reads"),
    [
        (jobset(), None, True),
        (jobset(), applied(jobset(), HELD), True),
        (status(), None, False),
        (status(), applied(status(), STATUS_LIVE), True),
        (secret(), None, False),
        (secret(), OLD_SECRET, False),
    ],
    ids=["component", "component-recorded", "status", "status-recorded", "secret", "secret-recorded"],
)
def test_what_a_round_reads_before_deciding(
    message: m.ObjectApply, record: m.AppliedRecord | None, reads: bool
) -> None:
    """A component is always read, a status only when a record might still hold, a Secret never."""
    assert claim_round.reads_live(message, record) is reads


def _rechecked(recheck: str, *, uid: str = UID) -> m.ApplySecret:
    return msgspec.structs.replace(secret(), recheck=recheck, trainjob_uid=uid)


def _created(message: m.ApplySecret) -> m.AppliedRecord:
    """The record the applier leaves after creating ``message``'s Secret (or finding it made, 409)."""
    digest = claim_round.create_only_digest(message, planned(message))
    return msgspec.structs.replace(OLD_SECRET, digest=digest)


def test_a_repeated_secret_plan_sends_nothing() -> None:
    """After a restart or a resync every TrainJob is planned again; a Secret the ledger records as made
    for this very plan is left without a create (which the API server would answer 409) or a ledger write."""
    message = _rechecked("1/labels")
    step = claim_round.decide(message, _created(message), None, planned=planned(message), stamp=STAMP)
    assert step == steps.Leave(resource_version="", reason=outcomes.ALREADY_CREATED)


@pytest.mark.parametrize(
    ("why", "record_of", "message"),
    [
        ("someone changed the TrainJob: a Secret deleted by hand is made again", "1/labels", _rechecked("2/labels")),
        ("another TrainJob of the same name", "1/labels", _rechecked("1/labels", uid="another-uid")),
        ("an older planner's plan carries no recheck", "", _rechecked("")),
    ],
)
def test_a_secret_plan_is_created_again(why: str, record_of: str, message: m.ApplySecret) -> None:
    record = _created(_rechecked(record_of))
    step = claim_round.decide(message, record, None, planned=planned(message), stamp=STAMP)
    assert isinstance(step, steps.Create), why


def test_a_secret_claimed_but_not_created_is_created() -> None:
    message = _rechecked("1/labels")
    record = msgspec.structs.replace(_created(message), state="claimed")
    assert isinstance(claim_round.decide(message, record, None, planned=planned(message), stamp=STAMP), steps.Create)


@pytest.mark.parametrize(
    ("why", "record", "known", "expected"),
    [
        (
            "a repeat of the status last written, which moved the TrainJob on: the record advances, no read",
            applied(status(), STATUS_LIVE),
            "6",
            steps.Advance(
                record=msgspec.structs.replace(applied(status(), STATUS_LIVE), source_version=40, source_seq=4),
                resource_version="6",
            ),
        ),
        (
            "another status, planned from a TrainJob version the watch has seen pass: claimed, then skipped",
            msgspec.structs.replace(applied(status(), STATUS_LIVE), digest="another-plan"),
            "6",
            steps.SkipStatus(claim=claim(status()), resource_version="6"),
        ),
        (
            "the watch has seen nothing newer (it may lag): written, the planned version the precondition",
            msgspec.structs.replace(applied(status(), STATUS_LIVE), digest="another-plan"),
            "5",
            steps.Write(claim=claim(status()), precondition="", before="5"),
        ),
    ],
)
def test_a_status_is_judged_by_the_watched_version_without_a_read(
    why: str, record: m.AppliedRecord, known: str, expected: steps.Step
) -> None:
    assert not claim_round.reads_live(status(), record, known_version=known)
    step = claim_round.decide(status(), record, None, planned=planned(status()), stamp=STAMP, known_version=known)
    assert step == expected, why


def test_a_status_is_read_when_the_watch_does_not_know_the_trainjob() -> None:
    assert claim_round.reads_live(status(), applied(status(), STATUS_LIVE), known_version="")
