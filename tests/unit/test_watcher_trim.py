"""What the watcher keeps of the objects it watches, and that the events it publishes plan as before.

The live objects here carry what a real API server adds (managedFields, last-applied annotations, server
defaults, status counters, other managers' fields), and each event the watcher publishes from its trimmed
cache must give exactly the plan of the event made from the objects as they came.
"""

from __future__ import annotations

import copy
import json
from types import SimpleNamespace
from typing import Any, cast

import msgspec
import pytest

from contracts import messages as m
from contracts.jobset import JobSet
from contracts.kube import ConfigMap
from contracts.trainer import TrainingRuntime, TrainJob
from planner.core import plan
from planner.immutability import IMMUTABLE_SPEC
from plumbing.informer import Cached, Informer
from plumbing.kube import KubeClient
from plumbing.signing import Signer, generate_private_key
from watcher import core, trim
from watcher.service import Watcher, WatcherSettings

from .builders import Obj, owner_reference, replicated_job, runtime_dict, trainjob_dict, trainjob_observed

NS, NAME, UID = "team", "tj", "tj-uid-1"
RUNTIME = "torch-distributed"
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
PRIVATE = "PRIVATE-KEY-MATERIAL-do-not-keep"

MANAGED_FIELDS = [
    {
        "manager": "trainer",
        "operation": "Apply",
        "apiVersion": "v1",
        "time": "2026-01-01T00:00:00Z",
        "fieldsType": "FieldsV1",
        "fieldsV1": {"f:spec": {"f:suspend": {}}},
    }
]


def runtime() -> Obj:
    rt = runtime_dict(
        [
            replicated_job(
                "node",
                [{"name": "node", "image": "example.com/torch"}],
                ancestor="trainer",
                replicas=1,
            )
        ],
        name=RUNTIME,
        ml_policy={"numNodes": 1, "torch": {}},
    )
    rt["metadata"].update(
        {"uid": "rt-uid", "resourceVersion": "3", "annotations": {LAST_APPLIED: "{}"}, "managedFields": MANAGED_FIELDS}
    )
    return rt


def trainjob(*, suspend: bool, num_nodes: int = 2, rv: str = "10") -> Obj:
    job = trainjob_dict(
        {"numNodes": num_nodes, "resourcesPerNode": {"requests": {"cpu": "2"}}},
        name=NAME,
        namespace=NS,
        uid=UID,
        runtime=RUNTIME,
        spec={"suspend": suspend},
        metadata={
            "resourceVersion": rv,
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "labels": {"team": "a"},
            "annotations": {"example.com/note": "kept", LAST_APPLIED: json.dumps({"spec": {"suspend": suspend}})},
            "managedFields": MANAGED_FIELDS,
        },
    )
    return job


def planned_jobset(job: Obj) -> Obj:
    """The JobSet the planner builds for ``job``: what the applier would have created."""
    p = plan(trainjob_observed(job, runtime()), source_seq=1)
    (message,) = [a for a in p.applies if isinstance(a, m.ApplyJobSet)]
    out: Obj = msgspec.to_builtins(message.object)
    return out


def live_jobset(job: Obj, *, suspended: bool, status: Obj | None = None) -> Obj:
    """The planned JobSet as the API server would hold it, with what servers and other managers add."""
    js = copy.deepcopy(planned_jobset(job))
    js["metadata"].update(
        {
            "uid": "js-uid",
            "resourceVersion": "12",
            "generation": 2,
            "creationTimestamp": "2026-01-01T00:00:01Z",
            "labels": {"example.com/team": "a"},
            "annotations": {LAST_APPLIED: json.dumps(js["spec"]), "example.com/x": "y"},
            "finalizers": ["example.com/keep"],
            "managedFields": MANAGED_FIELDS,
        }
    )
    spec = js["spec"]
    spec["suspend"] = suspended
    spec.setdefault("network", {"enableDNSHostnames": True, "publishNotReadyAddresses": True})
    spec["successPolicy"] = {"operator": "All"}
    spec["failurePolicy"] = {"maxRestarts": 0, "restartStrategy": "Recreate"}
    spec["startupPolicy"] = {"startupPolicyOrder": "AnyOrder"}
    spec["managedBy"] = "jobset.sigs.k8s.io/jobset-controller"
    spec["ttlSecondsAfterFinished"] = 3600
    for rj in spec["replicatedJobs"]:
        job_spec = rj["template"]["spec"]
        job_spec.update({"backoffLimit": 0, "completionMode": "Indexed"})
        pod = job_spec["template"].setdefault("spec", {})
        pod["restartPolicy"] = "OnFailure"
        pod.setdefault("volumes", []).append({"name": "foreign", "emptyDir": {}})  # another manager's field
        for container in pod["containers"]:
            container["terminationMessagePath"] = "/dev/termination-log"
    js["status"] = status or {
        "restarts": 1,
        "restartsCountTowardsMax": 1,
        "terminalState": "",
        "conditions": [
            {
                "type": "Suspended",
                "status": "True" if suspended else "False",
                "reason": "x",
                "message": "y",
                "lastTransitionTime": "2026-01-01T00:00:02Z",
            }
        ],
        "replicatedJobsStatus": [
            {
                "name": "node",
                "ready": 1,
                "succeeded": 0,
                "failed": 1,
                "active": 1,
                "suspended": 0,
                "jobRestarts": [1, 0],
                "jobRestartsCountTowardsMax": [1, 0],
            }
        ],
    }
    return js


COMPLETED = {
    "terminalState": "Completed",
    "conditions": [
        {
            "type": "Completed",
            "status": "True",
            "reason": "AllJobsCompleted",
            "message": "jobset completed successfully",
            "lastTransitionTime": "2026-01-01T00:10:00Z",
        }
    ],
    "replicatedJobsStatus": [{"name": "node", "ready": 0, "succeeded": 2, "failed": 0, "active": 0, "suspended": 0}],
}


def snapshot_config_map(job: Obj, rt: Obj) -> Obj:
    """The runtime snapshot as it is stored, with extra keys and metadata no reader needs."""
    text = next(
        a.object.data["runtime"]  # type: ignore[index]
        for a in plan(trainjob_observed(job, rt), source_seq=1).applies
        if isinstance(a, m.ApplyConfigMap)
    )
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": NAME + "-runtime-snapshot",
            "namespace": NS,
            "uid": "cm-uid",
            "resourceVersion": "11",
            "ownerReferences": [owner_reference(NAME, UID)],
            "labels": {"a": "b"},
            "annotations": {LAST_APPLIED: "{}"},
            "managedFields": MANAGED_FIELDS,
        },
        "data": {"runtime": text, "other": "x" * 500},
        "binaryData": {"blob": "AAAA"},
    }


def encoded(obj: Obj) -> bytes:
    return json.dumps(obj).encode()


# ------------------------------------------------------------------------------------------- trimming


def test_jobset_keeps_what_the_planner_reads_and_drops_the_rest() -> None:
    job = trainjob(suspend=True)
    full = msgspec.convert(live_jobset(job, suspended=True), JobSet)
    kept = trim.jobset(full)
    assert isinstance(kept.metadata, msgspec.Struct) and isinstance(full.metadata, msgspec.Struct)
    assert (kept.metadata.name, kept.metadata.namespace, kept.metadata.uid, kept.metadata.resource_version) == (
        full.metadata.name,
        full.metadata.namespace,
        full.metadata.uid,
        full.metadata.resource_version,
    )
    assert kept.metadata.owner_references == full.metadata.owner_references
    assert core.controlling_trainjob(kept) == NAME
    have, had = msgspec.to_builtins(kept), msgspec.to_builtins(full)
    assert set(have["metadata"]) == {"name", "namespace", "uid", "resourceVersion", "ownerReferences"}
    # The replicated jobs and the fields JobSet never lets change are kept whole: an update carries the live
    # ones over as they are; ttlSecondsAfterFinished, which the planner does not read, goes.
    assert have["spec"] == {
        "replicatedJobs": had["spec"]["replicatedJobs"],
        "suspend": True,
        **{key: had["spec"][key] for key in IMMUTABLE_SPEC if key in had["spec"]},
    }
    assert set(IMMUTABLE_SPEC) - {"volumeClaimPolicies"} <= set(have["spec"])
    assert have["status"] == {
        "conditions": had["status"]["conditions"],
        "replicatedJobsStatus": [
            {"name": "node", "ready": 1, "succeeded": 0, "failed": 1, "active": 1, "suspended": 0}
        ],
    }


def test_jobset_without_spec_or_status_stays_without() -> None:
    bare = msgspec.convert({"metadata": {"name": "x"}}, JobSet)
    assert msgspec.to_builtins(trim.jobset(bare)) == {"metadata": {"name": "x"}}


def test_snapshot_config_map_keeps_only_the_runtime_key() -> None:
    job, rt = trainjob(suspend=False), runtime()
    raw = snapshot_config_map(job, rt)
    kept = trim.config_map(msgspec.convert(raw, ConfigMap))
    have = msgspec.to_builtins(kept)
    assert have["data"] == {"runtime": raw["data"]["runtime"]}
    assert set(have) == {"apiVersion", "kind", "metadata", "data"}
    assert set(have["metadata"]) == {"name", "namespace", "uid", "resourceVersion", "ownerReferences"}
    tj = msgspec.convert(job, TrainJob)
    assert core.runtime_from_snapshot(tj, kept) == core.runtime_from_snapshot(tj, msgspec.convert(raw, ConfigMap))


def test_snapshot_without_the_runtime_key_still_reads_as_missing_it() -> None:
    job = msgspec.convert(trainjob(suspend=False), TrainJob)
    raw = {
        "metadata": {
            "name": NAME + "-runtime-snapshot",
            "namespace": NS,
            "ownerReferences": [owner_reference(NAME, UID)],
        },
        "data": {"other": "x"},
    }
    full = msgspec.convert(raw, ConfigMap)
    kept = trim.config_map(full)
    assert kept.data is msgspec.UNSET
    assert core.runtime_from_snapshot(job, kept) == core.runtime_from_snapshot(job, full)
    assert core.runtime_from_snapshot(job, kept)[1].startswith("invalid runtime snapshot: snapshot ConfigMap missing")


def test_other_config_maps_keep_no_data() -> None:
    raw = {
        "metadata": {"name": NAME + "-mpi-hostfile", "namespace": NS, "ownerReferences": [owner_reference(NAME, UID)]},
        "data": {"hostfile": "tj-node-0-0.tj slots=1\n"},
    }
    kept = msgspec.to_builtins(trim.config_map(msgspec.convert(raw, ConfigMap)))
    assert kept == {"metadata": raw["metadata"]}


def test_trainjob_loses_only_the_last_applied_annotation() -> None:
    raw = trainjob(suspend=False)
    raw["metadata"].pop("managedFields")
    kept = msgspec.to_builtins(trim.trainjob(msgspec.convert(raw, TrainJob)))
    expected = copy.deepcopy(raw)
    del expected["metadata"]["annotations"][LAST_APPLIED]
    assert kept == expected
    raw["metadata"]["annotations"] = {LAST_APPLIED: "{}"}
    assert "annotations" not in msgspec.to_builtins(trim.trainjob(msgspec.convert(raw, TrainJob)))["metadata"]
    unchanged = msgspec.convert(trainjob_dict(name=NAME, namespace=NS, runtime=RUNTIME), TrainJob)
    assert trim.trainjob(unchanged) is unchanged


# ------------------------------------------------------------------------------ the watcher's events


class _FakeJetStream:
    def __init__(self) -> None:
        self.published: list[tuple[str, bytes, dict[str, str]]] = []

    async def publish(self, subject: str, payload: bytes, *, headers: dict[str, str], timeout: float) -> Any:
        self.published.append((subject, payload, headers))
        return SimpleNamespace(duplicate=False, seq=len(self.published))


def _watcher() -> tuple[Watcher, _FakeJetStream]:
    js = _FakeJetStream()
    # The informers are never run: their caches are filled through the same decode-and-trim path a list or
    # a watch event takes.
    watcher = Watcher(
        WatcherSettings(nats_url="nats://unused"),
        cast(KubeClient, None),
        cast(Any, js),
        signer=Signer(generate_private_key()),
    )
    return watcher, js


def _put(informer: Informer[Any], raw: Obj) -> None:
    decoded = informer._decode(encoded(raw))
    assert decoded is not None
    informer.cache[decoded[0]] = decoded[1]


async def _published_event(watcher: Watcher, js: _FakeJetStream, job: Obj) -> m.TrainJobObserved:
    cached = watcher._trainjob((NS, NAME))
    assert cached is not None
    await watcher.publish_observation(cached.obj, cause="test")
    event = m.decode_event(js.published[-1][1])
    assert isinstance(event, m.TrainJobObserved)
    return event


SCENARIOS = {
    # TrainJob suspended, JobSet suspended: the plan is restricted to the live JobSet's mutable fields, and a
    # changed node count is reported as kept.
    "suspended": (dict(suspend=True, num_nodes=3), dict(suspended=True)),
    # TrainJob resumed, JobSet still suspended: the same rule, on resume.
    "resuming": (dict(suspend=False, num_nodes=2), dict(suspended=True)),
    # Running: the JobSet is left alone and only its status is read.
    "running": (dict(suspend=False, num_nodes=2), dict(suspended=False)),
    # Finished: the JobSet's Completed condition becomes the TrainJob's.
    "completed": (dict(suspend=False, num_nodes=2), dict(suspended=False, status=COMPLETED)),
}


@pytest.mark.parametrize("with_snapshot", [False, True], ids=["live-runtime", "snapshot"])
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
async def test_event_from_the_trimmed_cache_plans_as_the_full_objects_do(scenario: str, with_snapshot: bool) -> None:
    job_args, js_args = SCENARIOS[scenario]
    job = trainjob(**job_args)  # type: ignore[arg-type]
    js_raw = live_jobset(trainjob(suspend=True, num_nodes=2), **js_args)  # type: ignore[arg-type]
    rt = runtime()
    watcher, bus = _watcher()
    _put(watcher.cluster_runtimes, rt)
    _put(watcher.jobsets[0], js_raw)
    _put(watcher.trainjobs[0], job)
    cm_raw = snapshot_config_map(job, rt) if with_snapshot else None
    if cm_raw is not None:
        _put(watcher.config_maps[0], cm_raw)

    event = await _published_event(watcher, bus, job)

    # The same observation made of the objects exactly as the API server sent them.
    full_job = msgspec.convert(job, TrainJob)
    full_runtime = msgspec.convert(rt, TrainingRuntime)
    if cm_raw is not None:
        snapshot_runtime, error = core.runtime_from_snapshot(full_job, msgspec.convert(cm_raw, ConfigMap))
        assert snapshot_runtime is not None, error
        full_runtime = snapshot_runtime
    full = msgspec.structs.replace(
        event, trainjob=full_job, jobset=msgspec.convert(js_raw, JobSet), runtime=full_runtime
    )
    assert event.runtime_source == ("snapshot" if with_snapshot else "live")
    assert plan(event, source_seq=7) == plan(full, source_seq=7)
    if scenario == "suspended":
        assert any("JobSet keeps these fields" in w for w in plan(event, source_seq=7).warnings)

    # And it is the smaller for it: no managedFields, no copies of the object in annotations.
    assert event.jobset is not None and msgspec.to_builtins(event.jobset)["metadata"].keys() == {
        "name",
        "namespace",
        "uid",
        "resourceVersion",
        "ownerReferences",
    }
    for part in (event.trainjob, event.jobset):
        text = m.encode(part)
        assert b"managedFields" not in text and LAST_APPLIED.encode() not in text
    if not with_snapshot:
        # A live runtime is kept whole, annotations and all: the planner copies it into the snapshot.
        assert event.runtime is not None
        assert LAST_APPLIED in (msgspec.to_builtins(event.runtime)["metadata"].get("annotations") or {})
    assert len(bus.published[-1][1]) < len(m.encode(full))


async def test_message_id_still_names_every_version() -> None:
    job = trainjob(suspend=False)
    rt = runtime()
    watcher, bus = _watcher()
    _put(watcher.cluster_runtimes, rt)
    _put(watcher.jobsets[0], live_jobset(job, suspended=False))
    _put(watcher.trainjobs[0], job)
    _put(watcher.config_maps[0], snapshot_config_map(job, rt))
    await _published_event(watcher, bus, job)
    assert bus.published[-1][2]["Nats-Msg-Id"] == f"{UID}/10;js=12;rt=ClusterTrainingRuntime:3;snap=11"


def test_the_watcher_has_no_secret_informer() -> None:
    """A role that may list or watch Secrets reads their data, so the watcher asks for none at all."""
    watcher, _ = _watcher()
    informers = [
        *watcher.trainjobs,
        *watcher.jobsets,
        *watcher.runtimes,
        watcher.cluster_runtimes,
        *watcher.config_maps,
        *watcher.owned,
        watcher.priority_classes,
    ]
    assert all(inf.resource.kind != "Secret" for inf in informers)


def test_cached_objects_take_less_than_their_json() -> None:
    job = trainjob(suspend=False)
    watcher, _ = _watcher()
    _put(watcher.jobsets[0], live_jobset(job, suspended=False))
    _put(watcher.trainjobs[0], job)
    js_cached = watcher.jobsets[0].cache[(NS, NAME)]
    tj_cached = watcher.trainjobs[0].cache[(NS, NAME)]
    assert isinstance(js_cached, Cached) and isinstance(tj_cached, Cached)
    assert js_cached.size < len(m.encode(js_cached.obj)) / 2
    assert tj_cached.size < len(m.encode(tj_cached.obj))
