"""``planner.runtime_info`` and ``planner.status`` helpers: pod sets, per-pod requests, conditions."""

from __future__ import annotations

from decimal import Decimal

import msgspec

from contracts.trainer import TrainingRuntime, TrainJob
from planner import status as st
from planner.runtime_info import new_runtime_info, pod_requests

from .builders import Obj, replicated_job


def test_pod_requests_containers_sum() -> None:
    spec = {
        "containers": [
            {"resources": {"requests": {"cpu": "500m", "memory": "1Gi"}}},
            {"resources": {"requests": {"cpu": "1"}}},
            {"name": "no-resources"},
        ]
    }
    assert pod_requests(spec) == {"cpu": Decimal("1.5"), "memory": Decimal(2**30)}


def test_pod_requests_init_peak_sidecars_and_overhead() -> None:
    spec = {
        "initContainers": [
            {"name": "big-init", "resources": {"requests": {"cpu": "4"}}},
            {"name": "sidecar", "restartPolicy": "Always", "resources": {"requests": {"cpu": "1", "memory": "1"}}},
            {"name": "late-init", "resources": {"requests": {"cpu": "2"}}},
        ],
        "containers": [{"resources": {"requests": {"cpu": "2", "memory": "3"}}}],
        "overhead": {"cpu": "100m"},
    }
    # running: 2 + sidecar 1 = 3 cpu, 3 + 1 = 4 memory; init peak: 4 cpu (alone), 1 + 2 = 3 cpu later.
    assert pod_requests(spec) == {"cpu": Decimal("4.1"), "memory": Decimal(4)}


def test_pod_requests_empty() -> None:
    assert pod_requests({}) == {}


def _runtime(ml_policy: Obj | None, parallelism: int | None = None) -> TrainingRuntime:
    node = {"name": "node", "image": "i", "resources": {"requests": {"cpu": "1"}}}
    jobs = [
        replicated_job(
            "init", [{"name": "dataset-initializer", "image": "d"}], ancestor="dataset-initializer", parallelism=3
        ),
        replicated_job("node", [node], ancestor="trainer", parallelism=parallelism),
        replicated_job("other", [{"name": "c", "image": "o"}], parallelism=0),
    ]
    body: Obj = {"template": {"spec": {"replicatedJobs": jobs}}}
    if ml_policy is not None:
        body["mlPolicy"] = ml_policy
    return msgspec.convert(
        {"kind": "ClusterTrainingRuntime", "metadata": {"name": "rt"}, "spec": body}, TrainingRuntime
    )


JOB = msgspec.convert({"metadata": {"name": "tj", "namespace": "ns"}, "spec": {"runtimeRef": {"name": "rt"}}}, TrainJob)


def test_pod_sets_index_aligned_with_counts() -> None:
    info = new_runtime_info(JOB, _runtime({"numNodes": 5}, parallelism=2))
    assert [(ps.name, ps.ancestor, ps.count) for ps in info.pod_sets] == [
        ("init", "dataset-initializer", 3),
        ("node", "trainer", 5),
        ("other", None, 1),  # parallelism 0 is clamped to 1
    ]
    assert info.pod_sets[1].single_pod_requests == {"cpu": Decimal(1)}
    assert info.trainer_container("node") is not None
    assert info.pod_set_by_name("other") is info.pod_sets[2]


def test_pod_sets_without_ml_policy_keep_parallelism() -> None:
    info = new_runtime_info(JOB, _runtime(None, parallelism=2))
    assert [ps.count for ps in info.pod_sets] == [3, 2, 1]
    info = new_runtime_info(JOB, _runtime({"torch": {}}, parallelism=2))
    assert [ps.count for ps in info.pod_sets] == [3, 1, 1]


def test_rfc3339_truncates_to_seconds_utc() -> None:
    assert st.rfc3339(0) == "1970-01-01T00:00:00Z"
    assert st.rfc3339(1_700_000_000.999) == "2023-11-14T22:13:20Z"


def test_set_condition_follows_set_status_condition() -> None:
    conditions: list[Obj] = []
    st.set_condition(conditions, {"type": "A", "status": "True", "reason": "R", "message": "m"}, now=60)
    assert conditions == [
        {"type": "A", "status": "True", "reason": "R", "message": "m", "lastTransitionTime": "1970-01-01T00:01:00Z"}
    ]
    # Same status: time kept, reason and message replaced, observedGeneration dropped when not given.
    conditions[0]["observedGeneration"] = 3
    st.set_condition(conditions, {"type": "A", "status": "True", "reason": "R2", "message": "m2"}, now=120)
    assert conditions == [
        {"type": "A", "status": "True", "reason": "R2", "message": "m2", "lastTransitionTime": "1970-01-01T00:01:00Z"}
    ]
    # Status flips: new time, or the time the new condition carries.
    st.set_condition(conditions, {"type": "A", "status": "False", "reason": "R3", "message": "m3"}, now=180)
    assert conditions[0]["lastTransitionTime"] == "1970-01-01T00:03:00Z"
    st.set_condition(
        conditions,
        {
            "type": "A",
            "status": "True",
            "reason": "R4",
            "message": "m4",
            "lastTransitionTime": "2020-01-01T00:00:00Z",
            "observedGeneration": 7,
        },
        now=240,
    )
    assert conditions == [
        {
            "type": "A",
            "status": "True",
            "reason": "R4",
            "message": "m4",
            "lastTransitionTime": "2020-01-01T00:00:00Z",
            "observedGeneration": 7,
        }
    ]
