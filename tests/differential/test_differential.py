"""Issue #26: what Trainer v2.3.0's controller writes to a TrainJob, step by step, against what the pipeline writes.

The lifecycle tests assert what someone thought to check. This records everything: each scenario
(``scenarios.SCENARIOS``) on each shipped runtime runs once under Trainer's own controller manager and once
under the pipeline, on one simulated cluster, in a fresh namespace per case and never both controllers at
once (Trainer reconciles the whole cluster and registers its webhooks for it). All cases of one controller
run together, so the wall time stays a few minutes. The sequences of statuses (``recorder``) and the
scenario's facts and outcome are then compared whole; a case that differs must be a listed deviation
(``DEVIATIONS``, also in the README), with the reason it is one.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from faults.support import Pipeline, close_pipeline, new_namespace, open_pipeline
from kubernetes import client as kube_client
from lifecycle.support import ready

from tjpipe.local.cluster import SimulatedCluster
from tjpipe.local.crds import shipped_runtimes
from tjpipe.local.trainer_controller import TrainerController

from .recorder import DELETED, Obj, StatusRecorder
from .scenarios import SCENARIOS, Case, run_case

pytestmark = [pytest.mark.cluster, pytest.mark.nats, pytest.mark.timeout(1800)]

NODES = 12
SHIPPED_NAMES = (
    "deepspeed-distributed",
    "jax-distributed",
    "mlx-distributed",
    "torch-distributed",
    "torch-distributed-with-cache",
    "torchtune-llama3.2-1b",
    "torchtune-llama3.2-3b",
    "torchtune-qwen2.5-1.5b",
    "xgboost-distributed",
)
PHASE_TIMEOUT = 600.0
CLEAN_UP_WITHIN = 180.0


@dataclass(frozen=True)
class Deviation:
    """A difference from Trainer v2.3.0 that is the pipeline's on purpose (or Trainer's bug); ``matches``
    says whether a case's difference is this one, from both sides' sequences."""

    reason: str
    matches: Callable[[dict[str, Any], dict[str, Any]], bool]


def _stuck_on_resume(theirs: dict[str, Any], mine: dict[str, Any]) -> bool:
    return (
        theirs["outcome"].startswith("not reached")
        and mine["outcome"] == "done"
        and _final_condition(mine) == "Complete"
    )


def _no_jobs_status_after_deadline(theirs: dict[str, Any], mine: dict[str, Any]) -> bool:
    return (
        condition_steps(theirs) == condition_steps(mine)
        and "jobsStatus" not in theirs["statuses"][-1]
        and theirs["outcome"] == mine["outcome"] == "done"
    )


def _final_condition(record: dict[str, Any]) -> str | None:
    conditions = (record["statuses"] or [{}])[-1].get("conditions") or []
    finished = [c["type"] for c in conditions if c["type"] in ("Complete", "Failed") and c["status"] == "True"]
    return finished[0] if finished else None


VOLUME_CLAIMS_3008 = Deviation(
    reason="#3008: Trainer v2.3.0 re-applies the whole JobSet on suspend and resume; for a runtime with "
    "volumeClaimPolicies (torchtune) JobSet refuses it (spec.volumeClaimPolicies: Value is immutable), so the "
    "job stays as it was. The pipeline keeps the fields JobSet does not let change and the job completes.",
    matches=_stuck_on_resume,
)
DEVIATIONS: dict[tuple[str, str], Deviation] = {
    **{
        (scenario, runtime): VOLUME_CLAIMS_3008
        for scenario in ("suspend-before-start", "suspend-running-patch-resume")
        for runtime in ("torchtune-llama3.2-1b", "torchtune-llama3.2-3b", "torchtune-qwen2.5-1.5b")
    },
    **{
        ("active-deadline", runtime): Deviation(
            reason="deadline race: a second reconcile of Trainer v2.3.0 working from a stale cache finds the "
            "job unfinished, builds the JobSet again and copies its empty replicatedJobsStatus; the pipeline "
            "keeps jobsStatus as last seen",
            matches=_no_jobs_status_after_deadline,
        )
        for runtime in SHIPPED_NAMES
    },
}
"""(scenario, runtime) -> the difference allowed there, with its reason (the README's deviations)."""


def condition_steps(record: dict[str, Any]) -> list[Any]:
    """The record's statuses reduced to their conditions, each change once (``DELETED`` kept)."""
    steps: list[Any] = []
    for status in record["statuses"]:
        step = status if status == DELETED else status.get("conditions", [])
        if not steps or steps[-1] != step:
            steps.append(step)
    return steps


def same_but_for_timing(theirs: dict[str, Any], mine: dict[str, Any]) -> bool:
    """The same conditions in the same order, the same last status, facts and outcome: the sequences differ
    only in which of the JobSet's intermediate counts (``jobsStatus`` while it runs) each controller copied.

    Why that is a difference of timing, not of behaviour: both copy the JobSet's ``replicatedJobsStatus``
    as it is when they reconcile, and how many of its changes a reconcile sees depends on the load (Trainer's
    informer cache and work queue coalesce them; the pipeline's watcher debounces them).
    """
    return (
        condition_steps(theirs) == condition_steps(mine)
        and theirs["statuses"][-1:] == mine["statuses"][-1:]
        and theirs["facts"] == mine["facts"]
        and theirs["outcome"] == mine["outcome"]
    )


def _has_default_storage_class(api: kube_client.ApiClient) -> bool:
    classes = kube_client.StorageV1Api(api).list_storage_class().items
    default = "storageclass.kubernetes.io/is-default-class"
    return any((c.metadata.annotations or {}).get(default) == "true" for c in classes)


def _needs_storage(spec: Obj) -> bool:
    return bool(spec["template"]["spec"].get("volumeClaimPolicies"))


@pytest.fixture(scope="module")
def harness(sim_cluster: SimulatedCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pipeline]:
    """Every shipped runtime installed, a nats-server and the pipeline's stack (services not started yet)."""
    pipe = open_pipeline(sim_cluster.kube, tmp_path_factory.mktemp("differential"), runtimes=shipped_runtimes())
    try:
        yield pipe
    finally:
        print(close_pipeline(pipe))


def _cases(p: Pipeline, runtimes: dict[str, Obj], recorder: StatusRecorder) -> list[Case]:
    """A case per scenario and runtime, each in a fresh namespace the recorder keeps."""
    cases = []
    for runtime, obj in runtimes.items():
        for scenario in SCENARIOS:
            namespace = new_namespace(p.api, prefix="d")
            recorder.namespaces.add(namespace)
            cases.append(
                Case(
                    scenario=scenario,
                    runtime=runtime,
                    runtime_spec=obj["spec"],
                    p=replace(p, namespace=namespace),
                    recorder=recorder,
                )
            )
    return cases


async def _run_phase(
    p: Pipeline, runtimes: dict[str, Obj], start: Callable[[set[str]], Any]
) -> tuple[dict[tuple[str, str], dict[str, Any]], set[str], float]:
    """Make a namespace per case, start the controller (``start`` gets the namespaces), run every case at
    once; the cases' records and the phase's wall time."""
    recorder = StatusRecorder(p.kube.kubeconfig).start()
    cases = _cases(p, runtimes, recorder)
    stop = await start(recorder.namespaces)
    started = time.monotonic()
    try:
        await asyncio.wait_for(asyncio.gather(*(run_case(case) for case in cases)), timeout=PHASE_TIMEOUT)
    finally:
        elapsed = time.monotonic() - started
        stop()
        recorder.stop()
    records = {
        (case.scenario, case.runtime): {
            "statuses": recorder.sequence(case.p.namespace, "job"),
            "facts": case.facts,
            "outcome": case.outcome,
        }
        for case in cases
    }
    return records, set(recorder.namespaces), elapsed


async def _delete_namespaces(p: Pipeline, namespaces: set[str]) -> None:
    """Delete the namespaces and wait (bounded) until they are gone, so the next controller finds nothing of
    the last one's cases and the cluster is done collecting them."""
    core = kube_client.CoreV1Api(p.api)
    for namespace in namespaces:
        core.delete_namespace(namespace)
    deadline = time.monotonic() + CLEAN_UP_WITHIN
    left: set[str] = set(namespaces)
    while time.monotonic() < deadline:
        left = {ns.metadata.name for ns in core.list_namespace().items} & namespaces
        if not left:
            return
        await asyncio.sleep(2)
    print(f"{len(left)} namespaces of the last phase still there after {CLEAN_UP_WITHIN:.0f}s")


async def test_every_scenario_writes_the_statuses_trainer_writes(
    harness: Pipeline,
    sim_cluster: SimulatedCluster,
    tmp_path: Path,
    uncaptured_progress: Callable[[str], None],
) -> None:
    p = harness
    sim_cluster.ensure_nodes(NODES)
    shipped = shipped_runtimes()
    assert sorted(shipped) == list(SHIPPED_NAMES)
    storage = _has_default_storage_class(p.api)
    runtimes = {name: obj for name, obj in shipped.items() if storage or not _needs_storage(obj["spec"])}
    left_out = sorted(set(shipped) - set(runtimes))

    trainer = TrainerController(
        kubeconfig=p.kube.kubeconfig, state_dir=tmp_path / "trainer", progress=uncaptured_progress
    )

    async def start_trainer(_: set[str]) -> Callable[[], None]:
        trainer.start()
        p.processes["trainer-controller"] = trainer.process  # type: ignore[assignment]
        return trainer.stop

    async def start_pipeline(_: set[str]) -> Callable[[], None]:
        # The watcher watches the whole cluster, as deployed (one informer per namespace would take one
        # watch per kind and namespace); Trainer's cases are gone by now.
        watcher = p.stack.start_service("watcher", extra=["--metrics-port", "0"])
        planner, applier = p.start("planner"), p.start("applier")
        p.processes["watcher"] = watcher
        await ready(p)

        def stop() -> None:
            for process in (watcher, planner, applier):
                process.stop(timeout=5)

        return stop

    reference, reference_namespaces, trainer_seconds = await _run_phase(p, runtimes, start_trainer)
    uncaptured_progress(f"differential: Trainer's controller ran {len(reference)} cases in {trainer_seconds:.0f}s")
    await _delete_namespaces(p, reference_namespaces)
    ours, _, pipeline_seconds = await _run_phase(p, runtimes, start_pipeline)
    uncaptured_progress(f"differential: the pipeline ran {len(ours)} cases in {pipeline_seconds:.0f}s")

    equal, equal_but_timing, deviating, different = [], [], [], []
    for key in sorted(reference):
        theirs, mine = reference[key], ours[key]
        deviation = DEVIATIONS.get(key)
        if theirs == mine:
            equal.append(key)
        elif same_but_for_timing(theirs, mine):
            equal_but_timing.append(key)
        elif deviation is not None and deviation.matches(theirs, mine):
            deviating.append(key)
        else:
            different.append(key)
    report = {
        "runtimes": sorted(runtimes),
        "left out (no storage on the cluster)": left_out,
        "cases": len(reference),
        "equal": len(equal),
        "equal but for intermediate jobsStatus": len(equal_but_timing),
        "listed deviations": {f"{s}/{r}": DEVIATIONS[(s, r)].reason for s, r in deviating},
        "different": [list(k) for k in different],
        "seconds": {"trainer": round(trainer_seconds, 1), "pipeline": round(pipeline_seconds, 1)},
        "records": {f"{s}/{r}": {"trainer": reference[(s, r)], "pipeline": ours[(s, r)]} for s, r in sorted(reference)},
    }
    out = tmp_path / "differential.json"
    out.write_text(json.dumps(report, indent=1))
    summary = {k: v for k, v in report.items() if k != "records"}
    uncaptured_progress(f"differential: {json.dumps(summary)} (all records in {out})")
    assert different == [], json.dumps({f"{s}/{r}": report["records"][f"{s}/{r}"] for s, r in different}, indent=1)
