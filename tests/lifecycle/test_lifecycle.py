"""Issue #12: TrainJobs that run, finish, fail, resume, time out and get cleaned up, on the simulated cluster.

Every test drives a TrainJob through the pipeline while real controllers do the rest: JobSet v0.12.0's
manager (with its admission webhooks) makes Jobs, kube-controller-manager makes Pods and collects garbage,
kube-scheduler binds them, kwok runs them for a few seconds. Each test then compares the TrainJob's whole
status (conditions without their times, ``jobsStatus``) with what Trainer v2.3.0 writes in the same
situation (``trainer_status``), and the Complete/Failed conditions' times with the JobSet's.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import datetime as dt
import time

import pytest
from faults.support import (
    JOBSET,
    TRAINER,
    Pipeline,
    node_job,
    trainjob,
    until,
)
from kubernetes import client as kube_client
from kubernetes.client.exceptions import ApiException

from tjpipe.local.cluster import RUN_TIME_ANNOTATION, NodeShape, create_nodes
from tjpipe.local.crds import shipped_runtimes
from tjpipe.local.procs import wait_until

from .support import (
    FAIL,
    LONG_RUN,
    Obj,
    Reconciler,
    StatusTrail,
    annotated,
    jobset_condition,
    jobset_of,
    phases,
    pod_patch,
    pods_of,
)
from .trainer_status import (
    COMPLETE,
    DEADLINE_EXCEEDED,
    RESUMED,
    SUSPENDED,
    copied_from_jobset,
    expected,
    failed_jobs,
    job_status,
    jobs_status_of,
)

pytestmark = [pytest.mark.cluster, pytest.mark.nats]

STEP = 90.0
"""Upper bound for one step (a state every controller has to reach), generous for a loaded CI machine."""
HOLD = 10.0
"""How long a test watches that something does not happen."""
RUNNING_FOR = {RUN_TIME_ANNOTATION: "8s"}
"""Long enough for the running state to be seen, short enough to finish soon."""


async def _finished_like_trainer(p: Pipeline, trail: StatusTrail, want: Obj, *, what: str) -> Obj:
    """Wait for ``want``; then the conditions copied from the JobSet must carry its reason, message and
    lastTransitionTime, and ``jobsStatus`` must be the JobSet's replicatedJobsStatus. Returns the TrainJob."""
    await trail.until(p, want, timeout=STEP, what=what)
    print(f"{trail.name}: statuses seen {trail.seen}")
    tj = p.get(TRAINER, "TrainJob", trail.name)
    js = jobset_of(p, trail.name)
    assert js is not None
    assert copied_from_jobset(tj, js) == []
    assert jobs_status_of(js) == want["jobsStatus"]
    return tj


def _no_foreign_conditions(trail: StatusTrail, allowed: set[str]) -> None:
    """Nothing the pipeline adds of its own (ResourcesCreated, ComponentsApplied) appeared on the way."""
    seen = {c["type"] for status in trail.seen for c in status.get("conditions", [])}
    assert seen <= allowed, trail.seen


def _time(value: str) -> dt.datetime:
    return dt.datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC)


# ------------------------------------------------------------------------------------------ completion


async def test_a_torch_job_runs_and_completes(reconciler: Reconciler) -> None:
    p = reconciler.p
    await reconciler.ready()
    name = "torch"
    p.create(trainjob(name, num_nodes=2, patches=[annotated(RUNNING_FOR, "node")]))
    trail = StatusTrail(name)

    # Running: one Job whose two pods are ready; no condition at all (it was never suspended).
    await trail.until(p, expected(jobs=[job_status("node", ready=1, active=1)]), timeout=STEP, what="running")
    assert phases(pods_of(p, name)) == ["Running", "Running"]

    await _finished_like_trainer(p, trail, expected(COMPLETE, jobs=[job_status("node", succeeded=1)]), what="Complete")
    pods = pods_of(p, name)
    assert phases(pods) == ["Succeeded", "Succeeded"]
    assert all(pod["spec"].get("nodeName") for pod in pods)
    _no_foreign_conditions(trail, {"Complete"})


async def test_an_mpi_job_with_a_launcher_completes(reconciler: Reconciler) -> None:
    """deepspeed-distributed: the launcher runs as a node and starts once the node Job is ready; the JobSet
    succeeds when the launcher does (its successPolicy)."""
    p = reconciler.p
    await reconciler.ready()
    name = "mpi"
    p.create(trainjob(name, runtime="deepspeed-distributed", num_nodes=2))
    trail = StatusTrail(name)
    tj = await _finished_like_trainer(
        p,
        trail,
        expected(COMPLETE, jobs=[job_status("launcher", succeeded=1), job_status("node", succeeded=1)]),
        what="Complete",
    )
    pods = pods_of(p, name)
    launchers = [
        pod for pod in pods if pod["metadata"]["labels"].get("jobset.sigs.k8s.io/replicatedjob-name") == "launcher"
    ]
    workers = [pod for pod in pods if pod not in launchers]
    assert len(launchers) == 1 and len(workers) == 1, [pod["metadata"]["name"] for pod in pods]
    assert phases(pods) == ["Succeeded", "Succeeded"]
    # The launcher waited for the node to be ready (dependsOn), so it started after the node pod.
    assert launchers[0]["metadata"]["creationTimestamp"] >= workers[0]["metadata"]["creationTimestamp"]
    # MPI's hostfile ConfigMap and SSH Secret, mounted by both pods, exist and belong to the TrainJob.
    uid = tj["metadata"]["uid"]
    for kind, suffix in (("ConfigMap", "-mpi-hostfile"), ("Secret", "-mpi-ssh-auth")):
        obj = p.get("v1", kind, name + suffix)
        assert [o["uid"] for o in obj["metadata"]["ownerReferences"]] == [uid], obj["metadata"]
    _no_foreign_conditions(trail, {"Complete"})


async def test_a_job_with_initializers_completes(reconciler: Reconciler) -> None:
    """torchtune-llama3.2-1b with a dataset and a model to initialize: both initializer Jobs complete
    before the trainer's Job is even created (dependsOn Complete), then the trainer completes."""
    p = reconciler.p
    await reconciler.ready()
    name = "tune"
    dataset, model = "hf://tatsu-lab/alpaca", "hf://meta-llama/Llama-3.2-1B-Instruct"
    p.create(
        trainjob(
            name,
            runtime="torchtune-llama3.2-1b",
            trainer={},
            extra_spec={"initializer": {"dataset": {"storageUri": dataset}, "model": {"storageUri": model}}},
        )
    )
    trail = StatusTrail(name)
    want = expected(
        COMPLETE,
        jobs=[
            job_status("dataset-initializer", succeeded=1),
            job_status("model-initializer", succeeded=1),
            job_status("node", succeeded=1),
        ],
    )
    await _finished_like_trainer(p, trail, want, what="Complete")
    pods = {pod["metadata"]["labels"]["jobset.sigs.k8s.io/replicatedjob-name"]: pod for pod in pods_of(p, name)}
    assert sorted(pods) == ["dataset-initializer", "model-initializer", "node"]
    assert phases(list(pods.values())) == ["Succeeded"] * 3
    for rjob, uri in (("dataset-initializer", dataset), ("model-initializer", model)):
        env = {e["name"]: e.get("value") for e in pods[rjob]["spec"]["containers"][0].get("env", [])}
        assert env.get("STORAGE_URI") == uri, (rjob, env)
    initialized = max(
        status["state"]["terminated"]["finishedAt"]
        for rjob in ("dataset-initializer", "model-initializer")
        for status in pods[rjob]["status"]["containerStatuses"]
    )
    assert pods["node"]["metadata"]["creationTimestamp"] >= initialized
    # The runtime's shared claim (JobSet names it <template>-<JobSet>), provisioned by the default class.
    claim = p.get("v1", "PersistentVolumeClaim", f"initializer-{name}")
    assert claim["status"]["phase"] == "Bound", claim
    assert [o["kind"] for o in claim["metadata"]["ownerReferences"]] == ["JobSet"]
    _no_foreign_conditions(trail, {"Complete"})


# --------------------------------------------------------------------------------------------- failure


def _fail_fast_runtime(p: Pipeline, name: str) -> None:
    """torch-distributed as a namespaced TrainingRuntime whose node Job gives up at the first failed pod
    (``backoffLimit: 0``); with the default of 6 retries and the Job controller's growing back-off, a
    failure would take minutes."""
    spec = copy.deepcopy(shipped_runtimes()["torch-distributed"]["spec"])
    for rjob in spec["template"]["spec"]["replicatedJobs"]:
        rjob["template"]["spec"]["backoffLimit"] = 0
    p.create({"apiVersion": TRAINER, "kind": "TrainingRuntime", "metadata": {"name": name}, "spec": spec})


async def test_a_pod_failure_fails_the_job_and_a_failed_job_is_never_rebuilt(reconciler: Reconciler) -> None:
    p = reconciler.p
    await reconciler.ready()
    runtime = "torch-fail-fast"
    _fail_fast_runtime(p, runtime)
    name = "fails"
    p.create(
        trainjob(name, runtime=runtime, runtime_kind="TrainingRuntime", num_nodes=2, patches=[annotated(FAIL, "node")])
    )
    trail = StatusTrail(name)
    failed = expected(failed_jobs(f"{name}-node-0"), jobs=[job_status("node", failed=1)])
    await _finished_like_trainer(p, trail, failed, what="Failed")
    assert jobset_condition(jobset_of(p, name), "Failed") is not None
    _no_foreign_conditions(trail, {"Failed"})
    status = p.get(TRAINER, "TrainJob", name)["status"]

    # Its JobSet goes (a user deletes it, or a TTL would). Trainer v2.3.0 un-fails the job and builds it
    # again (upstream #3737, fixed after v2.3.0): a deviation. Here a Failed job stays failed and nothing
    # is recreated.
    jobset = jobset_of(p, name)
    assert jobset is not None
    p.resource(JOBSET, "JobSet").delete(namespace=p.namespace, name=name)
    if reconciler.trainer:

        def rebuilt() -> bool:
            again = jobset_of(p, name)
            return again is not None and again["metadata"]["uid"] != jobset["metadata"]["uid"]

        await until(rebuilt, timeout=STEP, what="Trainer v2.3.0 to rebuild the failed job's JobSet (#3737)")
        return
    await until(lambda: jobset_of(p, name) is None, timeout=STEP, what="the failed JobSet to be deleted")
    await until(lambda: not pods_of(p, name), timeout=STEP, what="its pods to be collected")
    deadline = time.monotonic() + HOLD
    while time.monotonic() < deadline:
        assert jobset_of(p, name) is None, "the JobSet of a Failed TrainJob was recreated"
        assert not pods_of(p, name)
        assert p.get(TRAINER, "TrainJob", name)["status"] == status
        await asyncio.sleep(0.5)
    assert [dl for dl in await reconciler.dead_letters()] == []


# ------------------------------------------------------------------------------------- suspend / resume


DEDICATED = {"example.com/pool": "lifecycle"}
TAINT = {"key": "example.com/dedicated", "value": "lifecycle", "effect": "NoSchedule"}
TOLERATION = {"key": "example.com/dedicated", "operator": "Equal", "value": "lifecycle", "effect": "NoSchedule"}


def _dedicated_node(p: Pipeline) -> str:
    """One more simulated node, labelled ``DEDICATED`` and tainted ``TAINT``: only a pod with both the
    nodeSelector and the toleration can run there, and it can run nowhere else."""
    (node,) = create_nodes(p.api, count=1, shape=NodeShape(), prefix=f"{p.namespace}-dedicated-")
    core = kube_client.CoreV1Api(p.api)
    core.patch_node(node, {"metadata": {"labels": DEDICATED}, "spec": {"taints": [TAINT]}})
    wait_until(
        lambda: any(c.type == "Ready" and c.status == "True" for c in core.read_node(node).status.conditions or []),
        timeout=STEP,
        what=f"node {node} Ready",
    )
    return node


def _node_template(p: Pipeline, name: str) -> Obj:
    js = jobset_of(p, name)
    assert js is not None
    template: Obj = node_job(js)["template"]["spec"]["template"]
    return template


async def test_a_suspended_job_takes_new_node_placement_and_resumes_on_it(reconciler: Reconciler) -> None:
    """Suspend a running job; while suspended, change its runtime patch (nodeSelector, tolerations and a pod
    annotation: what JobSet lets change on a suspended JobSet); resume. JobSet's real webhook admits the
    planner's update (upstream #3008: Trainer's whole-JobSet re-apply is refused), JobSet carries the
    change into its Jobs on resume, and the new pods land on the only node that fits them."""
    p = reconciler.p
    await reconciler.ready()
    node = _dedicated_node(p)
    name = "moves"
    try:
        p.create(trainjob(name, num_nodes=2, patches=[annotated(LONG_RUN, "node")]))
        trail = StatusTrail(name)
        await trail.until(p, expected(jobs=[job_status("node", ready=1, active=1)]), timeout=STEP, what="running")
        first_pods = pods_of(p, name)
        assert phases(first_pods) == ["Running", "Running"]
        assert all(pod["spec"]["nodeName"] != node for pod in first_pods)

        p.merge_patch(TRAINER, "TrainJob", name, {"spec": {"suspend": True}})
        await trail.until(
            p, expected(SUSPENDED, jobs=[job_status("node", suspended=1)]), timeout=STEP, what="suspended"
        )
        await until(lambda: not pods_of(p, name), timeout=STEP, what="the suspended job's pods to go")

        placement = {
            "metadata": {"annotations": {RUN_TIME_ANNOTATION: "3s"}},
            "spec": {"nodeSelector": DEDICATED, "tolerations": [TOLERATION]},
        }
        p.merge_patch(TRAINER, "TrainJob", name, {"spec": {"runtimePatches": [pod_patch({"node": placement})]}})

        def patched() -> bool:
            template = _node_template(p, name)
            return (
                template["spec"].get("nodeSelector") == DEDICATED
                and template["spec"].get("tolerations") == [TOLERATION]
                and template["metadata"]["annotations"].get(RUN_TIME_ANNOTATION) == "3s"
            )

        await until(patched, timeout=STEP, what="the new placement on the suspended JobSet")
        assert jobset_of(p, name)["spec"]["suspend"] is True  # type: ignore[index]

        p.merge_patch(TRAINER, "TrainJob", name, {"spec": {"suspend": False}})
        await _finished_like_trainer(
            p, trail, expected(RESUMED, COMPLETE, jobs=[job_status("node", succeeded=1)]), what="resumed, Complete"
        )
        pods = pods_of(p, name)
        assert phases(pods) == ["Succeeded", "Succeeded"]
        for pod in pods:
            assert pod["spec"]["nodeName"] == node, pod["spec"]
            assert pod["spec"]["nodeSelector"] == DEDICATED
            assert TOLERATION in pod["spec"]["tolerations"]
            assert pod["metadata"]["annotations"][RUN_TIME_ANNOTATION] == "3s"

        tj = p.get(TRAINER, "TrainJob", name)
        suspended, resumed_at = (c["lastTransitionTime"] for c in tj["status"]["conditions"][:2])
        assert tj["status"]["conditions"][0]["type"] == "Suspended"
        assert _time(resumed_at) >= _time(suspended)
        _no_foreign_conditions(trail, {"Suspended", "Complete"})
        assert [dl for dl in await reconciler.dead_letters()] == []
        assert not [e for e in p.events() if e.get("type") == "Warning" and e["involvedObject"]["name"] == name]
    finally:
        with contextlib.suppress(ApiException):
            kube_client.CoreV1Api(p.api).delete_node(node)


# -------------------------------------------------------------------------------------------- deadline


async def test_a_running_job_past_its_deadline_fails_and_loses_its_jobset(reconciler: Reconciler) -> None:
    p = reconciler.p
    await reconciler.ready()
    name = "late"
    seconds = 8
    p.create(
        trainjob(
            name, num_nodes=2, patches=[annotated(LONG_RUN, "node")], extra_spec={"activeDeadlineSeconds": seconds}
        )
    )
    trail = StatusTrail(name)
    running = [job_status("node", ready=1, active=1)]
    await trail.until(p, expected(jobs=running), timeout=STEP, what="running")
    first = jobset_of(p, name)
    assert first is not None

    # Failed/DeadlineExceeded; jobsStatus stays as last seen, since the JobSet is gone.
    await trail.until(
        p,
        expected(DEADLINE_EXCEEDED, jobs=running),
        alternatives=_trainer_race(reconciler, expected(DEADLINE_EXCEEDED)),
        timeout=STEP,
        what="DeadlineExceeded",
    )
    await until(lambda: _uid(jobset_of(p, name)) != _uid(first), timeout=STEP, what="the JobSet to be deleted")
    tj = p.get(TRAINER, "TrainJob", name)
    (failed,) = tj["status"]["conditions"]
    assert _time(failed["lastTransitionTime"]) >= _time(tj["metadata"]["creationTimestamp"]) + dt.timedelta(
        seconds=seconds
    )
    # ConfigMaps (here the runtime snapshot) and Secrets are kept, as Trainer keeps them.
    assert p.get("v1", "ConfigMap", f"{name}-runtime-snapshot")["metadata"]["ownerReferences"][0]["name"] == name
    if reconciler.trainer:
        await _trainer_after_deadline(p, trail, name)
        return
    await until(lambda: not pods_of(p, name), timeout=STEP, what="the pods to be collected")
    deadline = time.monotonic() + HOLD
    while time.monotonic() < deadline:
        assert jobset_of(p, name) is None, "the JobSet of a job past its deadline was recreated"
        assert trail.record(p) == expected(DEADLINE_EXCEEDED, jobs=running), trail.seen
        await asyncio.sleep(0.5)
    _no_foreign_conditions(trail, {"Failed"})


async def test_a_deadline_counts_from_the_resume_not_from_creation(reconciler: Reconciler) -> None:
    """A job created suspended, and kept suspended longer than its activeDeadlineSeconds, is not failed at
    resume: Trainer starts the clock when it sets Suspended=False/Resumed, in the same reconcile that
    checks the deadline, and stops it while the job is suspended."""
    p = reconciler.p
    await reconciler.ready()
    name = "resumed-late"
    seconds = 6
    p.create(
        trainjob(
            name,
            num_nodes=1,
            suspend=True,
            patches=[annotated(LONG_RUN, "node")],
            extra_spec={"activeDeadlineSeconds": seconds},
        )
    )
    trail = StatusTrail(name)
    suspended = expected(SUSPENDED, jobs=[job_status("node", suspended=1)])
    await trail.until(p, suspended, timeout=STEP, what="suspended")
    await asyncio.sleep(seconds + 2)  # past the deadline counted from creation, but suspended all along
    assert trail.record(p) == suspended, trail.seen

    p.merge_patch(TRAINER, "TrainJob", name, {"spec": {"suspend": False}})
    running = [job_status("node", ready=1, active=1)]
    await trail.until(
        p,
        expected(RESUMED, DEADLINE_EXCEEDED, jobs=running),
        alternatives=_trainer_race(reconciler, expected(RESUMED, DEADLINE_EXCEEDED)),
        timeout=STEP,
        what="DeadlineExceeded",
    )
    assert trail.was(expected(RESUMED, jobs=running)), trail.seen  # it ran after the resume
    conditions = p.get(TRAINER, "TrainJob", name)["status"]["conditions"]
    resumed, failed = (_time(c["lastTransitionTime"]) for c in conditions)
    assert failed >= resumed + dt.timedelta(seconds=seconds), conditions
    _no_foreign_conditions(trail, {"Suspended", "Failed"})


def _trainer_race(reconciler: Reconciler, without_jobs: Obj) -> list[Obj]:
    """The status Trainer v2.3.0 sometimes ends with after a deadline, besides the expected one: no
    ``jobsStatus`` at all (about one run of the package in three on a busy machine, never with the
    pipeline). Its log then shows two reconciles 0.2 s apart both finding the deadline exceeded, so the
    second saw the TrainJob still unfinished in its informer cache. Our reading: that reconcile built the
    JobSet again (the job looked unfinished and the JobSet absent), copied the new JobSet's empty
    ``replicatedJobsStatus`` (merge-patched as ``jobsStatus: null``) and deleted it again. The pipeline
    keeps the last ``jobsStatus``, as Trainer's own rule for a finished job whose JobSet is gone intends."""
    return [without_jobs] if reconciler.trainer else []


def _uid(obj: Obj | None) -> str | None:
    return None if obj is None else str(obj["metadata"]["uid"])


async def _trainer_after_deadline(p: Pipeline, trail: StatusTrail, name: str) -> None:
    """What Trainer v2.3.0 does once the deadline has deleted its JobSet: its conditions stay as they are.

    Only those are pinned for Trainer (see ``_trainer_race``). A JobSet present at the end is printed.
    """
    deadline = time.monotonic() + HOLD
    while time.monotonic() < deadline:
        status = trail.record(p)
        assert status.get("conditions") == [DEADLINE_EXCEEDED], trail.seen
        await asyncio.sleep(0.5)
    again = jobset_of(p, name)
    if again is not None:
        print(f"Trainer v2.3.0 rebuilt the JobSet after the deadline: {again['metadata']}; statuses {trail.seen}")


# ------------------------------------------------------------------------------------- delete cascade


def _owned(p: Pipeline, uid: str) -> dict[tuple[str, str], Obj]:
    """(kind, name) of every ConfigMap and Secret the TrainJob controls."""
    out = {}
    for kind in ("ConfigMap", "Secret"):
        for obj in p.list("v1", kind):
            if any(o.get("uid") == uid for o in obj["metadata"].get("ownerReferences") or []):
                out[(kind, obj["metadata"]["name"])] = obj
    return out


def _left_of(p: Pipeline, name: str, owned: dict[tuple[str, str], Obj]) -> list[str]:
    """What is still there of a deleted TrainJob: itself, its JobSet, Jobs, pods, Service, ConfigMaps, Secrets."""
    left = []
    if p.get_or_none(TRAINER, "TrainJob", name) is not None:
        left.append("TrainJob")
    if jobset_of(p, name) is not None:
        left.append("JobSet")
    selector = f"jobset.sigs.k8s.io/jobset-name={name}"
    jobs = kube_client.BatchV1Api(p.api).list_namespaced_job(p.namespace, label_selector=selector).items
    left += [f"Job {j.metadata.name}" for j in jobs]
    left += [f"Pod {pod['metadata']['name']}" for pod in pods_of(p, name)]
    if p.get_or_none("v1", "Service", name) is not None:
        left.append(f"Service {name}")
    left += [f"{kind} {n}" for kind, n in owned if p.get_or_none("v1", kind, n) is not None]
    return left


async def test_deleting_a_running_job_collects_everything_it_owned(reconciler: Reconciler) -> None:
    p = reconciler.p
    await reconciler.ready()
    name = "gone"
    p.create(
        trainjob(name, runtime="deepspeed-distributed", num_nodes=2, patches=[annotated(LONG_RUN, "node", "launcher")])
    )
    trail = StatusTrail(name)
    running = [job_status("launcher", ready=1, active=1), job_status("node", ready=1, active=1)]
    await trail.until(p, expected(jobs=running), timeout=STEP, what="running")
    uid = p.get(TRAINER, "TrainJob", name)["metadata"]["uid"]
    owned = _owned(p, uid)
    assert set(owned) >= {
        ("ConfigMap", f"{name}-mpi-hostfile"),
        ("ConfigMap", f"{name}-runtime-snapshot"),
        ("Secret", f"{name}-mpi-ssh-auth"),
    }, sorted(owned)
    assert len(pods_of(p, name)) == 2

    p.resource(TRAINER, "TrainJob").delete(namespace=p.namespace, name=name)  # as kubectl does: background
    await until(lambda: _left_of(p, name, owned) == [], timeout=STEP, what="the garbage collector")
    deadline = time.monotonic() + HOLD / 2
    while time.monotonic() < deadline:  # and nothing comes back
        assert _left_of(p, name, owned) == []
        await asyncio.sleep(0.5)
    assert [dl for dl in await reconciler.dead_letters()] == []
