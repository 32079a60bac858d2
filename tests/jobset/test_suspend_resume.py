"""Issue #17: suspend, resume and runtime-patch changes under JobSet v0.12.0's real manager and webhooks.

Every shipped runtime goes through suspend -> add a patch (nodeSelector, tolerations) -> resume -> suspend
-> remove the patch -> resume, against JobSet's own mutating and validating webhooks (``failurePolicy:
Fail``). At each step the live JobSet's suspend flag and its ``node`` pod template must be what the TrainJob
asks for, and the TrainJob's conditions must not claim anything the JobSet lacks. Before the fix, the
torchtune runtimes' re-applies were refused (the webhook-defaulted ``retentionPolicy`` inside the atomic
``volumeClaimPolicies`` was dropped), and a removed patch's nodeSelector and tolerations stayed on the
JobSet.

A JobSet the webhook refuses at creation must leave the TrainJob a condition with the API server's reason.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from faults.support import (
    JOBSET,
    TRAINER,
    Pipeline,
    condition_of,
    no_dead_letters,
    node_job,
    quiet,
    services_ready,
    total_writes,
    trainjob,
    until,
)

from contracts import conditions
from tjpipe.local.crds import shipped_runtimes

pytestmark = [pytest.mark.cluster, pytest.mark.nats]

PATCH_MANAGER = "example.com/platform"
NODE_SELECTOR = {"example.com/pool": "a100"}
TOLERATIONS = [{"key": "example.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
STEP_TIMEOUT = 120.0
IDLE_SECONDS = 5.0


def _patch() -> list[dict[str, Any]]:
    pod_spec = {"nodeSelector": NODE_SELECTOR, "tolerations": TOLERATIONS}
    node = {"name": "node", "template": {"spec": {"template": {"spec": pod_spec}}}}
    return [{"manager": PATCH_MANAGER, "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [node]}}}}]


def _name(runtime: str) -> str:
    """Short: JobSet refuses names whose generated pod names would pass 63 characters."""
    return runtime.replace("-distributed", "").replace("-with-cache", "-cache").replace(".", "")


def _state(jobsets: dict[str, dict[str, Any]], name: str) -> tuple[bool, Any, Any] | None:
    """(suspend, nodeSelector, tolerations) of the live JobSet's node pod template; None without a JobSet."""
    js = jobsets.get(name)
    if js is None:
        return None
    pod = node_job(js)["template"]["spec"]["template"]["spec"]
    return bool(js["spec"].get("suspend", False)), pod.get("nodeSelector"), pod.get("tolerations")


def _truthful(tj: dict[str, Any], *, suspended: bool) -> list[str]:
    """What the TrainJob's conditions get wrong once its JobSet matches it (empty when nothing)."""
    wrong = []
    applied = condition_of(tj, conditions.CONDITION_COMPONENTS_APPLIED)
    if applied is not None:
        wrong.append(f"ComponentsApplied: {applied}")
    created = condition_of(tj, conditions.CONDITION_RESOURCES_CREATED)
    if created is not None and created.get("reason") == conditions.REASON_IMMUTABLE_FIELDS_KEPT:
        wrong.append(f"ResourcesCreated: {created}")
    cond = condition_of(tj, "Suspended")
    if suspended and (cond is None or cond["status"] != "True"):
        wrong.append(f"Suspended: {cond}")
    if not suspended and cond is not None and cond["status"] != "False":
        wrong.append(f"Suspended: {cond}")
    return wrong


async def _step(pipeline: Pipeline, names: list[str], *, suspend: bool, patched: bool, what: str) -> None:
    want = (suspend, NODE_SELECTOR if patched else None, TOLERATIONS if patched else None)

    def reached() -> bool:
        jobsets = pipeline.jobsets()
        trainjobs = pipeline.trainjobs()
        states = {n: _state(jobsets, n) for n in names}
        behind = {n: (s, (trainjobs[n].get("status") or {}).get("conditions")) for n, s in states.items() if s != want}
        if behind:
            raise AssertionError(f"JobSets not yet {want}: {behind}")
        wrong = {n: _truthful(trainjobs[n], suspended=suspend) for n in names}
        wrong = {n: w for n, w in wrong.items() if w}
        if wrong:
            raise AssertionError(f"conditions: {wrong}")
        return True

    try:
        await until(reached, timeout=STEP_TIMEOUT, what=what, interval=0.5)
    except AssertionError as error:
        raise AssertionError(f"{error}\n{pipeline.log_tails(20)}") from None


def _set_spec(pipeline: Pipeline, names: list[str], spec: dict[str, Any]) -> None:
    for name in names:
        pipeline.merge_patch(TRAINER, "TrainJob", name, {"spec": spec})


async def test_every_shipped_runtime_suspends_resumes_and_drops_a_removed_patch(pipeline: Pipeline) -> None:
    pipeline.start_all()
    nc = await pipeline.connect()
    js = nc.jetstream()
    try:
        await services_ready(js)
        names = []
        for runtime in shipped_runtimes():
            name = _name(runtime)
            names.append(name)
            pipeline.create(trainjob(name, runtime=runtime, trainer={}, suspend=False))
        await _step(pipeline, names, suspend=False, patched=False, what="every JobSet created, running")

        _set_spec(pipeline, names, {"suspend": True})
        await _step(pipeline, names, suspend=True, patched=False, what="every JobSet suspended")

        _set_spec(pipeline, names, {"runtimePatches": _patch()})
        await _step(pipeline, names, suspend=True, patched=True, what="the patch on every suspended JobSet")

        _set_spec(pipeline, names, {"suspend": False})
        await _step(pipeline, names, suspend=False, patched=True, what="every patched JobSet resumed")

        _set_spec(pipeline, names, {"suspend": True})
        await _step(pipeline, names, suspend=True, patched=True, what="every patched JobSet suspended again")

        _set_spec(pipeline, names, {"runtimePatches": None})
        await _step(pipeline, names, suspend=True, patched=False, what="the removed patch gone from every JobSet")

        _set_spec(pipeline, names, {"suspend": False})
        await _step(pipeline, names, suspend=False, patched=False, what="every JobSet resumed without the patch")

        await no_dead_letters(js, pipeline.namespace)
        before = await quiet(pipeline, js)
        await asyncio.sleep(IDLE_SECONDS)
        idle = pipeline.writes() - before
        assert total_writes(idle) == 0, idle.summary()

        # A restart of the whole pipeline with everything settled costs no request: every TrainJob is listed
        # and planned again, the MPI and Flux Secrets included, and the ledger says each was made already.
        restart_from = pipeline.writes()
        for service in ("watcher", "planner", "applier"):
            pipeline.kill(service)
        pipeline.start_all()
        await services_ready(js)
        await asyncio.sleep(IDLE_SECONDS)
        restart = await quiet(pipeline, js) - restart_from
        assert restart.all_writes() == {}, restart.all_writes()

        warnings = [e for e in pipeline.events() if e.get("type") == "Warning"]
        assert warnings == [], [(e["involvedObject"]["name"], e.get("message")) for e in warnings]
    finally:
        await nc.close()


async def test_a_jobset_refused_at_creation_is_a_condition_with_the_api_servers_reason(pipeline: Pipeline) -> None:
    """JobSet's webhook refuses a JobSet whose generated Job names pass 63 characters."""
    pipeline.start_all()
    nc = await pipeline.connect()
    js = nc.jetstream()
    try:
        await services_ready(js)
        name = "long-" + "x" * 55
        pipeline.create(trainjob(name, runtime="torch-distributed", trainer={}))

        def refused() -> dict[str, Any] | None:
            return condition_of(pipeline.get(TRAINER, "TrainJob", name), conditions.CONDITION_COMPONENTS_APPLIED)

        cond = await until(refused, timeout=STEP_TIMEOUT, what="ComponentsApplied on the TrainJob")
        assert cond["status"] == "False", cond
        assert cond["reason"] == "Invalid", cond
        assert cond["message"].startswith(f"JobSet {name}: "), cond
        assert "too long" in cond["message"], cond
        assert pipeline.get_or_none(JOBSET, "JobSet", name) is None
    finally:
        await nc.close()


async def test_what_jobset_refuses_to_change_stays_reported_after_resume(pipeline: Pipeline) -> None:
    """A patch that adds a volume (immutable) and a nodeSelector (mutable) to a suspended JobSet: the
    nodeSelector lands, the volume is kept out, and ``ImmutableFieldsKept`` keeps saying so once it runs."""
    pipeline.start_all()
    nc = await pipeline.connect()
    js = nc.jetstream()
    name = "kept"
    try:
        await services_ready(js)
        pipeline.create(trainjob(name, runtime="torch-distributed", trainer={}, suspend=True))
        await _step(pipeline, [name], suspend=True, patched=False, what="the JobSet created, suspended")
        patch = _patch()
        pod_spec = patch[0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]
        pod_spec["template"]["spec"]["volumes"] = [{"name": "scratch", "emptyDir": {}}]
        _set_spec(pipeline, [name], {"runtimePatches": patch, "suspend": False})

        def kept() -> dict[str, Any] | None:
            if _state(pipeline.jobsets(), name) != (False, NODE_SELECTOR, TOLERATIONS):
                return None
            cond = condition_of(pipeline.get(TRAINER, "TrainJob", name), conditions.CONDITION_RESOURCES_CREATED)
            return cond if cond and cond["reason"] == conditions.REASON_IMMUTABLE_FIELDS_KEPT else None

        await until(kept, timeout=STEP_TIMEOUT, what="the patched JobSet resumed, the volume reported as kept")
        await quiet(pipeline, js)
        live = pipeline.get(JOBSET, "JobSet", name)
        assert "volumes" not in node_job(live)["template"]["spec"]["template"]["spec"]
        cond = condition_of(pipeline.get(TRAINER, "TrainJob", name), conditions.CONDITION_RESOURCES_CREATED)
        assert cond is not None and cond["reason"] == conditions.REASON_IMMUTABLE_FIELDS_KEPT, cond
        assert "template.spec.volumes" in cond["message"], cond
        assert condition_of(pipeline.get(TRAINER, "TrainJob", name), conditions.CONDITION_COMPONENTS_APPLIED) is None
        await no_dead_letters(js, pipeline.namespace)
    finally:
        await nc.close()
