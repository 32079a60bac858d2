"""``contracts.messages``: every message kind survives the wire, unknown tags are refused, keys parse."""

from __future__ import annotations

import json

import msgspec
import pytest

from contracts import messages as m
from contracts.jobset import JobSet
from contracts.kube import ConfigMap, Secret
from contracts.trainer import TrainingRuntime, TrainJob

KEY = m.ObjectKey(namespace="ns", name="tj")

TRAINJOB = msgspec.convert(
    {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "tj", "namespace": "ns", "uid": "u", "resourceVersion": "3"},
        "spec": {
            "runtimeRef": {"name": "torch"},
            "suspend": True,
            "trainer": {"numNodes": 2, "env": [{"name": "A", "value": "1"}]},
        },
        "status": {
            "conditions": [
                {
                    "type": "Suspended",
                    "status": "True",
                    "reason": "Suspended",
                    "message": "TrainJob is suspended",
                    "lastTransitionTime": "2024-01-01T00:00:00Z",
                }
            ]
        },
    },
    TrainJob,
)
RUNTIME = msgspec.convert(
    {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "ClusterTrainingRuntime",
        "metadata": {"name": "torch"},
        "spec": {"mlPolicy": {"numNodes": 1, "torch": {}}},
    },
    TrainingRuntime,
)
JOBSET = msgspec.convert(
    {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": "tj", "namespace": "ns"},
        "spec": {"suspend": False},
        "status": {
            "replicatedJobsStatus": [
                {"name": "node", "ready": 1, "succeeded": 0, "failed": 0, "active": 1, "suspended": 0}
            ]
        },
    },
    JobSet,
)


def target(kind: str, api_version: str, name: str = "tj", subresource: str | None = None) -> m.Target:
    return m.Target(api_version=api_version, kind=kind, namespace="ns", name=name, subresource=subresource)  # type: ignore[arg-type]


EVENTS: list[m.Event] = [
    m.TrainJobObserved(
        trainjob=TRAINJOB, runtime=RUNTIME, jobset=JOBSET, observed_at=1.5, cause="resync", trace_id="t"
    ),
    m.TrainJobObserved(trainjob=TRAINJOB, observed_at=2.0),
    m.TrainJobDeleted(key=KEY, uid="u", observed_at=3.0, trace_id="t"),
]

APPLIES: list[m.ApplyMessage] = [
    m.ApplyJobSet(
        trainjob=KEY,
        trainjob_uid="u",
        source_seq=7,
        policy="while-suspended",
        trace_id="t",
        target=target("JobSet", "jobset.x-k8s.io/v1alpha2"),
        object=JOBSET,
    ),
    m.ApplyTrainJobStatus(
        trainjob=KEY,
        trainjob_uid="u",
        source_seq=8,
        target=target("TrainJob", "trainer.kubeflow.org/v1alpha1", subresource="status"),
        object=TRAINJOB,
    ),
    m.ApplyConfigMap(
        trainjob=KEY,
        trainjob_uid="u",
        source_seq=9,
        target=target("ConfigMap", "v1", "tj-mpi-hostfile"),
        object=msgspec.convert({"metadata": {"name": "tj-mpi-hostfile"}, "data": {"hostfile": "x"}}, ConfigMap),
    ),
    m.ApplySecret(
        trainjob=KEY,
        trainjob_uid="u",
        source_seq=10,
        policy="if-absent",
        field_manager="other",
        force=False,
        target=target("Secret", "v1", "tj-mpi-ssh-auth"),
        object=msgspec.convert(
            {
                "metadata": {"name": "tj-mpi-ssh-auth"},
                "data": {"k": "AAEC"},
                "type": "kubernetes.io/ssh-auth",
                "immutable": True,
            },
            Secret,
        ),
    ),
]


@pytest.mark.parametrize("event", EVENTS, ids=lambda e: type(e).__name__)
def test_event_round_trip(event: m.Event) -> None:
    data = m.encode(event)
    decoded = m.decode_event(data)
    assert type(decoded) is type(event)
    assert decoded == event
    assert m.encode(decoded) == data


def test_event_tags_on_the_wire() -> None:
    assert json.loads(m.encode(EVENTS[0]))["type"] == "trainjob.observed"
    assert json.loads(m.encode(EVENTS[2]))["type"] == "trainjob.deleted"


@pytest.mark.parametrize("message", APPLIES, ids=lambda a: type(a).__name__)
def test_apply_round_trip(message: m.ApplyMessage) -> None:
    data = m.encode(message)
    decoded = m.decode_apply(data)
    assert type(decoded) is type(message)
    assert decoded == message
    assert m.encode(decoded) == data


def test_apply_tags_and_component_names() -> None:
    tags = [json.loads(m.encode(a))["component"] for a in APPLIES]
    assert tags == ["jobset", "trainjob-status", "configmap", "secret"]
    assert [m.component_of(a) for a in APPLIES] == [
        "jobset",
        "trainjob-status",
        "configmap.tj-mpi-hostfile",
        "secret.tj-mpi-ssh-auth",
    ]


def test_apply_defaults() -> None:
    decoded = m.decode_apply(m.encode(APPLIES[1]))
    assert decoded.field_manager == "trainer" == m.FIELD_MANAGER
    assert decoded.force is True
    assert decoded.policy == "always"


def test_result_and_dead_letter_round_trip() -> None:
    result = m.ApplyResult(
        trainjob=KEY,
        target=target("JobSet", "jobset.x-k8s.io/v1alpha2"),
        component="jobset",
        source_seq=4,
        action="configured",
        attempts=2,
        duration_ms=3.5,
        resource_version="9",
        reason="",
        finished_at=10.0,
        trace_id="t",
    )
    assert m.decode_result(m.encode(result)) == result
    dead = m.DeadLetter(
        stage="applier",
        reason="permanent",
        error="422 Invalid",
        subject="tj.apply.1.ns.tj.jobset",
        payload=b"\x00\x01binary{}",
        headers={"Nats-Msg-Id": "x"},
        stream_seq=3,
        deliveries=5,
        dead_at=11.0,
    )
    assert m.decode_dead_letter(m.encode(dead)) == dead


def test_plan_round_trip() -> None:
    p = m.Plan(trainjob=KEY, trainjob_uid="u", source_seq=1, applies=tuple(APPLIES), warnings=("w",))
    assert msgspec.json.decode(m.encode(p), type=m.Plan) == p


def test_unknown_event_tag_is_refused() -> None:
    payload = json.loads(m.encode(EVENTS[2]))
    payload["type"] = "trainjob.exploded"
    with pytest.raises(msgspec.ValidationError):
        m.decode_event(json.dumps(payload).encode())


def test_unknown_apply_tag_is_refused() -> None:
    payload = json.loads(m.encode(APPLIES[0]))
    payload["component"] = "no-such-component"
    with pytest.raises(msgspec.ValidationError):
        m.decode_apply(json.dumps(payload).encode())


def test_missing_tag_is_refused() -> None:
    payload = json.loads(m.encode(EVENTS[2]))
    del payload["type"]
    with pytest.raises(msgspec.ValidationError):
        m.decode_event(json.dumps(payload).encode())


def test_event_on_apply_decoder_is_refused() -> None:
    with pytest.raises(msgspec.ValidationError):
        m.decode_apply(m.encode(EVENTS[0]))


def test_bad_policy_is_refused() -> None:
    payload = json.loads(m.encode(APPLIES[0]))
    payload["policy"] = "sometimes"
    with pytest.raises(msgspec.ValidationError):
        m.decode_apply(json.dumps(payload).encode())


@pytest.mark.parametrize(
    ("text", "expected"),
    [("ns/tj", KEY), ("kube-system/a.b-c", m.ObjectKey(namespace="kube-system", name="a.b-c"))],
)
def test_object_key_parse(text: str, expected: m.ObjectKey) -> None:
    assert m.ObjectKey.parse(text) == expected
    assert str(expected) == text


@pytest.mark.parametrize("text", ["", "tj", "/tj", "ns/", "/", "ns/tj/x", "a//b"])
def test_object_key_parse_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        m.ObjectKey.parse(text)


def test_target_parts() -> None:
    t = target("JobSet", "jobset.x-k8s.io/v1alpha2")
    assert (t.group, t.version) == ("jobset.x-k8s.io", "v1alpha2")
    assert str(t) == "JobSet ns/tj"
    core = target("ConfigMap", "v1", "cm")
    assert (core.group, core.version) == ("", "v1")
    status = target("TrainJob", "trainer.kubeflow.org/v1alpha1", subresource="status")
    assert str(status) == "TrainJob/status ns/tj"
