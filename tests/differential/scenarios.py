"""The scenarios the differential runs under each controller, one TrainJob each, on one shipped runtime.

Each scenario only drives the TrainJob (creates, suspends, patches, deletes) and waits for states every
controller has to reach; what gets compared is what the controller wrote meanwhile (``recorder``), plus a
few facts a status does not show (did the JobSet take a runtime edit, was a deleted JobSet rebuilt). The
same code runs for both controllers; nothing here knows which one is reconciling.
"""

from __future__ import annotations

import asyncio
import copy
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from faults.support import JOBSET, TRAINER, Pipeline, trainjob
from kubernetes import client as kube_client
from kubernetes.client.exceptions import ApiException
from lifecycle.support import FAIL, LONG_RUN, annotated, jobset_of, pod_patch, pods_of

from tjpipe.local.cluster import RUN_TIME_ANNOTATION

from .recorder import Obj, StatusRecorder

NAME = "job"
STEP = 150.0
"""Upper bound for one state every controller has to reach, with all scenarios of a phase running at once."""
SETTLE = 4.0
"""How long a scenario keeps recording after its last state, for writes that follow it."""
DEADLINE_SECONDS = 60
RUNS_FOR = "40s"
"""How long the pods of a job that must be seen running, then finish by themselves, run: a pod of a loaded
simulated cluster can take well over ten seconds from creation to Ready, and one whose run time is over by
then succeeds without ever being Ready."""
EDITED = "example.com/edited"
RUNTIME_SEEN_SECONDS = 15.0
"""How long a TrainJob on a just-made namespaced runtime is offered again while Trainer's webhook says the
runtime does not exist yet."""
TUNE_INITIALIZER = {
    "dataset": {"storageUri": "hf://tatsu-lab/alpaca"},
    "model": {"storageUri": "hf://meta-llama/Llama-3.2-1B-Instruct"},
}


@dataclass
class Case:
    """One scenario on one runtime under one controller, in a namespace of its own (``p.namespace``)."""

    scenario: str
    runtime: str
    runtime_spec: Obj
    p: Pipeline
    recorder: StatusRecorder
    facts: dict[str, Any] = field(default_factory=dict)
    outcome: str = "done"

    @property
    def rjobs(self) -> list[str]:
        return [rjob["name"] for rjob in self.runtime_spec["template"]["spec"]["replicatedJobs"]]

    @property
    def trainers(self) -> list[str]:
        """The replicated jobs that train (all but the initializers): those a long run is put on."""
        return [rjob for rjob in self.rjobs if not rjob.endswith("-initializer")]

    def body(
        self,
        *,
        patches: list[Obj] | None = None,
        suspend: bool | None = None,
        extra_spec: Obj | None = None,
        namespaced_runtime: bool = False,
    ) -> Obj:
        tune = self.runtime.startswith("torchtune-")
        extra = dict(extra_spec or {})
        if tune:
            extra["initializer"] = TUNE_INITIALIZER
        return trainjob(
            NAME,
            runtime=self.runtime,
            runtime_kind="TrainingRuntime" if namespaced_runtime else None,
            trainer={} if tune else {"numNodes": 1, "image": "example.com/train:1.0"},
            patches=patches,
            suspend=suspend,
            extra_spec=extra,
        )

    def namespaced_copy(self, edit: Callable[[Obj], None] = lambda _: None) -> None:
        """The shipped runtime as a TrainingRuntime of the same name in the case's namespace, ``edit``ed."""
        spec = copy.deepcopy(self.runtime_spec)
        edit(spec)
        self.p.create(
            {"apiVersion": TRAINER, "kind": "TrainingRuntime", "metadata": {"name": self.runtime}, "spec": spec}
        )

    async def create_on_namespaced_copy(self, body: Obj) -> None:
        """Create the TrainJob ``body`` on the runtime ``namespaced_copy`` has just made.

        Trainer's webhook looks the runtime up in its informer cache, which can be a moment behind a
        TrainingRuntime just created (seen under load); it then refuses with "must be created before the
        TrainJob". That refusal alone is offered again, for ``RUNTIME_SEEN_SECONDS``; any other is the case's
        outcome.
        """
        deadline = time.monotonic() + RUNTIME_SEEN_SECONDS
        while True:
            try:
                self.p.create(body)
                return
            except ApiException as exc:
                not_seen_yet = exc.status == 403 and "must be created before the TrainJob" in str(exc.body)
                if not not_seen_yet or time.monotonic() > deadline:
                    raise
            await asyncio.sleep(0.2)

    async def until(self, check: Callable[[Obj | None], bool], what: str, timeout: float = STEP) -> None:
        try:
            await self.recorder.until(self.p.namespace, NAME, check, timeout=timeout, what=what)
        except AssertionError as exc:
            raise StepTimeout(what) from exc

    async def until_true(self, check: Callable[[], bool], what: str, timeout: float = STEP) -> None:
        deadline = time.monotonic() + timeout
        while not check():
            if time.monotonic() >= deadline:
                raise StepTimeout(what)
            await asyncio.sleep(0.5)

    def patch(self, body: Obj) -> None:
        self.p.merge_patch(TRAINER, "TrainJob", NAME, body)


class StepTimeout(AssertionError):
    """A state the scenario waits for was not reached; ``what`` names it (the outcome compared)."""

    def __init__(self, what: str) -> None:
        super().__init__(what)
        self.what = what


# ------------------------------------------------------------------------------------------ states


def _conditions(tj: Obj | None) -> dict[str, str]:
    return {c["type"]: c["status"] for c in ((tj or {}).get("status") or {}).get("conditions") or []}


def finished(tj: Obj | None) -> bool:
    conditions = _conditions(tj)
    return conditions.get("Complete") == "True" or conditions.get("Failed") == "True"


def suspended(tj: Obj | None) -> bool:
    return _conditions(tj).get("Suspended") == "True"


def resumed(tj: Obj | None) -> bool:
    return _conditions(tj).get("Suspended") == "False"


def running(case: Case) -> Callable[[], bool]:
    """Every training replicated job has a ready Job, read from the live JobSet: a controller may never write
    that state into the TrainJob (it copies what it sees when it reconciles), and what it wrote is compared."""

    def check() -> bool:
        js = case.recorder.jobset(case.p.namespace, NAME)
        jobs = {j.get("name"): j for j in ((js or {}).get("status") or {}).get("replicatedJobsStatus") or []}
        return all((jobs.get(rjob) or {}).get("ready", 0) >= 1 for rjob in case.trainers)

    return check


def no_live_pods(case: Case) -> bool:
    """None of the job's pods is Pending or Running (a finished initializer's pod stays, Succeeded)."""
    return not [
        pod for pod in pods_of(case.p, NAME) if pod.get("status", {}).get("phase") not in ("Succeeded", "Failed")
    ]


def gone(tj: Obj | None) -> bool:
    return tj is None


def _templates(jobset: Obj | None) -> dict[str, Obj]:
    return {
        rjob["name"]: rjob["template"]["spec"]["template"]
        for rjob in (jobset or {}).get("spec", {}).get("replicatedJobs") or []
    }


def _no_active_jobs(jobset: Obj | None) -> bool:
    return not any(
        rjob.get("active") for rjob in ((jobset or {}).get("status") or {}).get("replicatedJobsStatus") or []
    )


def _annotations(template: Obj) -> dict[str, str]:
    return dict((template.get("metadata") or {}).get("annotations") or {})


# --------------------------------------------------------------------------------------- scenarios


async def runs_to_complete(case: Case) -> None:
    case.p.create(case.body())
    await case.until(finished, "Complete")


async def a_pod_fails(case: Case) -> None:
    """A pod fails; a namespaced copy of the runtime gives up at the first failed pod (with the default
    backoffLimit, the Job controller's growing back-off would take minutes). With a launcher, the launcher
    fails and the nodes run on: the launcher starts once the nodes are ready, so which Jobs exist when the
    JobSet fails does not depend on which pod the simulated cluster finishes first."""

    def fail_fast(spec: Obj) -> None:
        for rjob in spec["template"]["spec"]["replicatedJobs"]:
            rjob["template"]["spec"]["backoffLimit"] = 0

    case.namespaced_copy(fail_fast)
    if "launcher" in case.trainers:
        patches = [
            pod_patch(
                {"launcher": {"metadata": {"annotations": FAIL}}, "node": {"metadata": {"annotations": LONG_RUN}}}
            )
        ]
    else:
        patches = [annotated(FAIL, "node")]
    await case.create_on_namespaced_copy(case.body(patches=patches, namespaced_runtime=True))
    await case.until(finished, "Failed")


async def suspended_before_start_then_resumed(case: Case) -> None:
    case.p.create(case.body(suspend=True))
    await case.until(suspended, "Suspended")
    await asyncio.sleep(2)
    case.patch({"spec": {"suspend": False}})
    await case.until(finished, "Complete")


async def suspended_while_running_patched_resumed(case: Case) -> None:
    """Suspend a running job, change its runtime patch (the pods' run time) while suspended, resume."""
    case.p.create(case.body(patches=[annotated(LONG_RUN, *case.trainers)]))
    await case.until_true(running(case), "running")
    case.patch({"spec": {"suspend": True}})
    await case.until(suspended, "Suspended")
    await case.until_true(lambda: no_live_pods(case), "the suspended job's pods to go")
    # Trainer's webhook refuses a runtimePatches change while the JobSet still counts active Jobs.
    await case.until_true(
        lambda: _no_active_jobs(case.recorder.jobset(case.p.namespace, NAME)), "the JobSet to count no active Job"
    )
    short = {RUN_TIME_ANNOTATION: "3s"}
    case.patch({"spec": {"runtimePatches": [annotated(short, *case.trainers)]}})

    def patched() -> bool:
        templates = _templates(case.recorder.jobset(case.p.namespace, NAME))
        return all(_annotations(templates.get(rjob) or {}).get(RUN_TIME_ANNOTATION) == "3s" for rjob in case.trainers)

    try:
        await case.until_true(patched, "the new runtime patch on the suspended JobSet")
        case.facts["patch reached the suspended JobSet"] = True
    except StepTimeout:
        case.facts["patch reached the suspended JobSet"] = False
    case.patch({"spec": {"suspend": False}})
    await case.until(finished, "Complete")


async def active_deadline_reached(case: Case) -> None:
    case.p.create(
        case.body(patches=[annotated(LONG_RUN, *case.trainers)], extra_spec={"activeDeadlineSeconds": DEADLINE_SECONDS})
    )
    await case.until(finished, "Failed/DeadlineExceeded", timeout=STEP + DEADLINE_SECONDS)


async def deleted_while_running(case: Case) -> None:
    case.p.create(case.body(patches=[annotated(LONG_RUN, *case.trainers)]))
    await case.until_true(running(case), "running")
    case.p.resource(TRAINER, "TrainJob").delete(namespace=case.p.namespace, name=NAME)  # background, as kubectl
    await case.until(gone, "the TrainJob gone")
    await case.until_true(lambda: case.recorder.jobset(case.p.namespace, NAME) is None, "the JobSet collected")
    await case.until_true(lambda: not pods_of(case.p, NAME), "the pods collected")
    case.facts["JobSet and pods collected"] = True


async def runtime_edited_after_start(case: Case) -> None:
    """The job's runtime (a namespaced copy) gets a new pod annotation while the job runs: the job keeps
    the runtime it started with (its JobSet never takes the edit) and completes."""
    case.namespaced_copy()
    await case.create_on_namespaced_copy(
        case.body(patches=[annotated({RUN_TIME_ANNOTATION: RUNS_FOR}, *case.trainers)], namespaced_runtime=True)
    )
    await case.until_true(running(case), "running")
    runtimes = case.p.resource(TRAINER, "TrainingRuntime")
    runtime = runtimes.get(namespace=case.p.namespace, name=case.runtime).to_dict()
    for rjob in runtime["spec"]["template"]["spec"]["replicatedJobs"]:
        pod = rjob["template"]["spec"]["template"]
        pod.setdefault("metadata", {}).setdefault("annotations", {})[EDITED] = "yes"
    runtimes.replace(body=runtime, namespace=case.p.namespace)
    took: set[str] = set()

    def watch_jobset() -> bool:
        for rjob, template in _templates(case.recorder.jobset(case.p.namespace, NAME)).items():
            if EDITED in _annotations(template):
                took.add(rjob)
        return finished(case.recorder.latest(case.p.namespace, NAME))

    await case.until_true(watch_jobset, "Complete")
    case.facts["replicated jobs that took the runtime edit"] = sorted(took)


async def jobset_deleted_while_running(case: Case) -> None:
    case.p.create(case.body(patches=[annotated({RUN_TIME_ANNOTATION: RUNS_FOR}, *case.trainers)]))
    await case.until_true(running(case), "running")
    first = jobset_of(case.p, NAME)
    assert first is not None
    case.p.resource(JOBSET, "JobSet").delete(namespace=case.p.namespace, name=NAME)
    await case.until(finished, "finished after the JobSet was deleted")
    again = jobset_of(case.p, NAME)
    case.facts["JobSet rebuilt"] = again is not None and again["metadata"]["uid"] != first["metadata"]["uid"]


SCENARIOS: dict[str, Callable[[Case], Awaitable[None]]] = {
    "complete": runs_to_complete,
    "pod-fails": a_pod_fails,
    "suspend-before-start": suspended_before_start_then_resumed,
    "suspend-running-patch-resume": suspended_while_running_patched_resumed,
    "active-deadline": active_deadline_reached,
    "trainjob-deleted": deleted_while_running,
    "runtime-edited": runtime_edited_after_start,
    "jobset-deleted": jobset_deleted_while_running,
}


async def run_case(case: Case) -> Case:
    """Run the case's scenario; a state not reached becomes its outcome (compared like the statuses)."""
    service_accounts = {
        rjob["template"]["spec"]["template"]["spec"].get("serviceAccountName")
        for rjob in case.runtime_spec["template"]["spec"]["replicatedJobs"]
    } - {None}
    for account in sorted(service_accounts):  # e.g. the cache initializer's, which Trainer's install makes
        ensure_service_account(case.p, account)
    try:
        await SCENARIOS[case.scenario](case)
    except StepTimeout as exc:
        case.outcome = f"not reached: {exc.what}"
    except ApiException as exc:  # a write refused (by a webhook, say): an outcome like any other
        case.outcome = f"refused: HTTP {exc.status} {exc.reason}"
        print(f"{case.scenario}/{case.runtime} ({case.p.namespace}): {exc.body}")
    await asyncio.sleep(SETTLE)
    return case


def ensure_service_account(p: Pipeline, name: str) -> None:
    core = kube_client.CoreV1Api(p.api)
    if not core.list_namespaced_service_account(p.namespace, field_selector=f"metadata.name={name}").items:
        core.create_namespaced_service_account(p.namespace, {"metadata": {"name": name}})
