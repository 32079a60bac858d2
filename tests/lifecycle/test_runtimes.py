"""Issue #26: every ClusterTrainingRuntime Trainer v2.3.0 ships lives its whole life on the simulated cluster.

For each of the nine runtimes one TrainJob runs to Complete: its initializers (torchtune, the data cache)
before the trainer, an MPI launcher once its nodes are ready, each as the runtime's ``dependsOn`` says, and
torchtune's shared claim provisioned and bound. A second TrainJob per runtime fails: its trainer's pods carry
the simulated cluster's fail annotation (a runtime patch), so the TrainJob ends Failed after its
initializers completed. The shipped runtimes leave a Job's ``backoffLimit`` at Kubernetes' default of 6, and
the Job controller's growing back-off would take about ten minutes to give up; the failing TrainJobs
therefore use each runtime's spec as a namespaced TrainingRuntime with ``backoffLimit: 0``, which changes
nothing else on their way to Failed.

All eighteen TrainJobs run at once on the session's cluster (``outcomes``), once with the pipeline and once
with Trainer v2.3.0's own controller (``reconciler``), and each test then reads its own TrainJob's result:
the whole status as Trainer writes it, conditions copied from the JobSet, and the pods.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Awaitable
from dataclasses import dataclass

import pytest
from faults.support import TRAINER, Pipeline, trainjob

from tjpipe.local.crds import apply_objects, cache_initializer_namespace_objects, shipped_runtimes

from .support import FAIL, Obj, Reconciler, StatusTrail, annotated, jobset_of, pods_of
from .trainer_status import COMPLETE, copied_from_jobset, expected, failed_jobs, job_status, jobs_status_of

pytestmark = [pytest.mark.cluster, pytest.mark.nats]

SHIPPED = {
    "deepspeed-distributed": "deepspeed",
    "jax-distributed": "jax",
    "mlx-distributed": "mlx",
    "torch-distributed": "torch",
    "torch-distributed-with-cache": "torch-cache",
    "torchtune-llama3.2-1b": "tune-1b",
    "torchtune-llama3.2-3b": "tune-3b",
    "torchtune-qwen2.5-1.5b": "tune-qwen",
    "xgboost-distributed": "xgboost",
}
"""Every runtime Trainer v2.3.0 ships, and the short name of its TrainJobs here."""
ALL_FINISHED_WITHIN = 300.0
STEP_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"
RJOB_LABEL = "jobset.sigs.k8s.io/replicatedjob-name"
CACHE_SERVICE_ACCOUNT = "kubeflow-trainer-cache-initializer"


@dataclass(frozen=True)
class Scenario:
    runtime: str
    name: str
    fails: bool
    want: Obj

    @property
    def key(self) -> tuple[str, bool]:
        return (self.runtime, self.fails)


@dataclass(frozen=True)
class Outcome:
    scenario: Scenario
    trail: StatusTrail
    error: BaseException | None


def _rjobs(runtime: Obj) -> list[Obj]:
    rjobs: list[Obj] = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    return rjobs


def _trainer_step(runtime: Obj) -> str:
    """The replicated job that trains (the launcher of an MPI runtime, else the nodes)."""
    (name,) = [
        rjob["name"]
        for rjob in _rjobs(runtime)
        if ((rjob["template"].get("metadata") or {}).get("labels") or {}).get(STEP_LABEL) == "trainer"
    ]
    return name


def _is_mpi(runtime: Obj) -> bool:
    return "mpi" in runtime["spec"]["mlPolicy"]


def _trainjob(runtime_name: str, runtime: Obj, name: str, *, fails: bool) -> Obj:
    patches = [annotated(FAIL, _trainer_step(runtime))] if fails else None
    kind = "TrainingRuntime" if fails else None
    ref = _fail_fast_name(runtime_name) if fails else runtime_name
    if runtime_name.startswith("torchtune-"):
        # A BuiltinTrainer job as the SDK writes one: no trainer image or node count of its own.
        return trainjob(name, runtime=ref, runtime_kind=kind, trainer={}, patches=patches)
    # MPI runs its launcher as one of the nodes: two nodes make one launcher and one node pod.
    return trainjob(name, runtime=ref, runtime_kind=kind, num_nodes=2 if _is_mpi(runtime) else 1, patches=patches)


def _fail_fast_name(runtime_name: str) -> str:
    return f"{runtime_name}-fail-fast"


def _fail_fast(runtime_name: str, runtime: Obj) -> Obj:
    spec = copy.deepcopy(runtime["spec"])
    for rjob in spec["template"]["spec"]["replicatedJobs"]:
        rjob["template"]["spec"]["backoffLimit"] = 0
    return {
        "apiVersion": TRAINER,
        "kind": "TrainingRuntime",
        "metadata": {"name": _fail_fast_name(runtime_name)},
        "spec": spec,
    }


def _want(runtime: Obj, name: str, *, fails: bool) -> Obj:
    """Trainer's status at the end: one Job per replicated job, each succeeded; or, failing, the trainer's
    Job failed after everything it depends on succeeded (an MPI node pod, started before its launcher and
    running as long, has succeeded by then)."""
    trainer = _trainer_step(runtime)
    if not fails:
        return expected(COMPLETE, jobs=[job_status(rjob["name"], succeeded=1) for rjob in _rjobs(runtime)])
    jobs = [
        job_status(rjob["name"], failed=1) if rjob["name"] == trainer else job_status(rjob["name"], succeeded=1)
        for rjob in _rjobs(runtime)
    ]
    return expected(failed_jobs(f"{name}-{trainer}-0"), jobs=jobs)


def _scenarios() -> list[Scenario]:
    runtimes = shipped_runtimes()
    assert sorted(runtimes) == sorted(SHIPPED)
    return [
        Scenario(runtime=runtime, name=name, fails=fails, want=_want(runtimes[runtime], name, fails=fails))
        for runtime, short in SHIPPED.items()
        for fails, name in ((False, short), (True, f"{short}-fails"))
    ]


async def _settle(p: Pipeline, scenario: Scenario) -> Outcome:
    trail = StatusTrail(scenario.name)
    error: BaseException | None = None
    try:
        await trail.until(p, scenario.want, timeout=ALL_FINISHED_WITHIN, what=scenario.name, interval=1.0)
    except AssertionError as exc:
        error = exc
    return Outcome(scenario=scenario, trail=trail, error=error)


@pytest.fixture(scope="module")
async def outcomes(reconciler: Reconciler) -> dict[tuple[str, bool], Outcome]:
    """Every scenario started at once, then each awaited until its status is the one Trainer writes."""
    p = reconciler.p
    await reconciler.ready()
    p.stack.install_runtimes()  # all nine, and the cache initializer's ServiceAccount in namespace default
    # ...which Trainer's data-cache overlay tells its users to add to every namespace that uses the cache.
    apply_objects(p.api, cache_initializer_namespace_objects(p.namespace), field_manager="example.com/lifecycle")
    runtimes = shipped_runtimes()
    scenarios = _scenarios()
    for runtime_name, runtime in runtimes.items():
        p.create(_fail_fast(runtime_name, runtime))
    for scenario in scenarios:
        p.create(_trainjob(scenario.runtime, runtimes[scenario.runtime], scenario.name, fails=scenario.fails))
    settled: list[Awaitable[Outcome]] = [_settle(p, scenario) for scenario in scenarios]
    results = await asyncio.gather(*settled)
    return {outcome.scenario.key: outcome for outcome in results}


def _finished_like_trainer(reconciler: Reconciler, outcome: Outcome) -> tuple[Obj, list[Obj]]:
    """The scenario reached its status; its conditions and jobsStatus are the JobSet's. Returns the TrainJob
    and its pods."""
    if outcome.error is not None:
        raise outcome.error
    p, name = reconciler.p, outcome.scenario.name
    print(f"{name}: statuses seen {outcome.trail.seen}")
    tj = p.get(TRAINER, "TrainJob", name)
    js = jobset_of(p, name)
    assert js is not None
    assert copied_from_jobset(tj, js) == []
    assert jobs_status_of(js) == outcome.scenario.want["jobsStatus"]
    seen = {c["type"] for status in outcome.trail.seen for c in status.get("conditions", [])}
    assert seen == {"Failed" if outcome.scenario.fails else "Complete"}, outcome.trail.seen
    return tj, pods_of(p, name)


def _by_rjob(pods: list[Obj]) -> dict[str, list[Obj]]:
    grouped: dict[str, list[Obj]] = {}
    for pod in pods:
        grouped.setdefault(pod["metadata"]["labels"][RJOB_LABEL], []).append(pod)
    return grouped


def _finished_at(pods: list[Obj]) -> str:
    return max(
        status["state"]["terminated"]["finishedAt"] for pod in pods for status in pod["status"]["containerStatuses"]
    )


def _started_in_order(runtime: Obj, pods: dict[str, list[Obj]]) -> None:
    """Each replicated job's pods were made only once what it depends on was Complete (its pods had finished)
    or Ready (its pods existed)."""
    for rjob in _rjobs(runtime):
        for dependency in rjob.get("dependsOn") or []:
            made = min(pod["metadata"]["creationTimestamp"] for pod in pods[rjob["name"]])
            if dependency["status"] == "Complete":
                assert made >= _finished_at(pods[dependency["name"]]), (rjob["name"], dependency)
            else:
                earliest = min(pod["metadata"]["creationTimestamp"] for pod in pods[dependency["name"]])
                assert made >= earliest, (rjob["name"], dependency)


def _claims_bound(p: Pipeline, runtime: Obj, name: str, pods: dict[str, list[Obj]]) -> None:
    """Each claim of the runtime's volumeClaimPolicies is bound, owned by the JobSet, and mounted by the pods
    of every replicated job that mounts it."""
    for policy in runtime["spec"]["template"]["spec"].get("volumeClaimPolicies") or []:
        for template in policy["templates"]:
            claim_name = f"{template['metadata']['name']}-{name}"
            claim = p.get("v1", "PersistentVolumeClaim", claim_name)
            assert claim["status"]["phase"] == "Bound", claim
            assert [o["kind"] for o in claim["metadata"]["ownerReferences"]] == ["JobSet"]
            for rjob_pods in pods.values():
                for pod in rjob_pods:
                    claims = [
                        v["persistentVolumeClaim"]["claimName"]
                        for v in pod["spec"].get("volumes", [])
                        if "persistentVolumeClaim" in v
                    ]
                    assert claims == [claim_name], pod["metadata"]["name"]


@pytest.mark.parametrize("runtime_name", sorted(SHIPPED))
def test_a_shipped_runtime_runs_to_complete(
    runtime_name: str, reconciler: Reconciler, outcomes: dict[tuple[str, bool], Outcome]
) -> None:
    outcome = outcomes[(runtime_name, False)]
    _, pods = _finished_like_trainer(reconciler, outcome)
    runtime = shipped_runtimes()[runtime_name]
    grouped = _by_rjob(pods)
    assert sorted(grouped) == sorted(rjob["name"] for rjob in _rjobs(runtime))
    assert all(pod["status"]["phase"] == "Succeeded" and pod["spec"].get("nodeName") for pod in pods), pods
    _started_in_order(runtime, grouped)
    _claims_bound(reconciler.p, runtime, outcome.scenario.name, grouped)
    if runtime_name == "torch-distributed-with-cache":
        (initializer,) = grouped["dataset-initializer"]
        assert initializer["spec"]["serviceAccountName"] == CACHE_SERVICE_ACCOUNT
        assert reconciler.p.get("v1", "ServiceAccount", CACHE_SERVICE_ACCOUNT)["metadata"]["name"]


@pytest.mark.parametrize("runtime_name", sorted(SHIPPED))
def test_a_shipped_runtime_fails_when_its_trainers_pod_fails(
    runtime_name: str, reconciler: Reconciler, outcomes: dict[tuple[str, bool], Outcome]
) -> None:
    outcome = outcomes[(runtime_name, True)]
    _, pods = _finished_like_trainer(reconciler, outcome)
    runtime = shipped_runtimes()[runtime_name]
    grouped = _by_rjob(pods)
    trainer = _trainer_step(runtime)
    (failed,) = grouped[trainer]
    assert failed["status"]["phase"] == "Failed"
    assert failed["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 1
    for rjob, rjob_pods in grouped.items():
        if rjob != trainer:
            assert [pod["status"]["phase"] for pod in rjob_pods] == ["Succeeded"], rjob
    _started_in_order(runtime, grouped)
