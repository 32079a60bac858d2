"""(f) Another field manager takes fields we set; (g) a TrainJob whose runtime does not exist yet.

(f) Trainer applies the JobSet with field manager ``trainer`` and ``force``. When someone else takes a
field over, by a forced apply or by a plain update, the JobSet changes, the watcher publishes, and the
next plan is applied again with force while the TrainJob is suspended: the field and its ownership come
back. A *running* JobSet is left alone, as Trainer does (a JobSet's replicated jobs are immutable once
running, and Trainer only applies a JobSet that is absent or suspended): the foreign value stays.

(g) A TrainJob that names a missing runtime gets ``ResourcesCreated=False`` with reason
``RuntimeNotFound``; creating the runtime later makes the watcher re-publish the TrainJob, and it is built.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from typing import Any

import pytest

from tjpipe.local.crds import shipped_runtimes

from .support import (
    JOBSET,
    TRAINER,
    Pipeline,
    assert_ledger_holds_live,
    assert_repeats_cost_nothing,
    condition_of,
    converged,
    jobset_matches,
    no_dead_letters,
    quiet,
    report,
    rv,
    services_ready,
    step_of,
    step_patch,
    trainjob,
    until,
)

pytestmark = [pytest.mark.cluster, pytest.mark.nats, pytest.mark.timeout(120)]


def foreign_apply(p: Pipeline, name: str, body: dict[str, Any], *, manager: str = "someone-else") -> dict[str, Any]:
    """A forced server-side apply by another manager; returns the object as that apply left it."""
    obj = {"apiVersion": JOBSET, "kind": "JobSet", "metadata": {"name": name, "namespace": p.namespace}, **body}
    return p.dyn.server_side_apply(  # type: ignore[no-any-return]
        p.resource(JOBSET, "JobSet"),
        body=obj,
        name=name,
        namespace=p.namespace,
        field_manager=manager,
        force_conflicts=True,
    ).to_dict()


def owns(obj: dict[str, Any], manager: str, *path: str) -> bool:
    """Whether ``manager`` (any operation) owns the field at ``path`` (``f:`` keys) on the main resource."""
    for entry in obj["metadata"].get("managedFields") or []:
        if entry["manager"] != manager or entry.get("subresource"):
            continue
        node: Any = entry.get("fieldsV1") or {}
        for key in path:
            if not isinstance(node, dict) or key not in node:
                node = None
                break
            node = node[key]
        if node is not None:
            return True
    return False


LABEL = ("f:metadata", "f:labels", "f:step")
SUSPEND = ("f:spec", "f:suspend")


async def test_f_foreign_field_manager_loses_to_our_forced_apply_while_suspended(pipeline: Pipeline) -> None:
    p = pipeline
    started = time.monotonic()
    p.start_all()
    nc = await p.connect()
    try:
        bus = nc.jetstream()
        await services_ready(bus)
        spec_rv = rv(p.create(trainjob("f-own", num_nodes=2, suspend=True, patches=step_patch("ours"))))
        await until(lambda: step_of(p, "f-own") == ("ours", "ours"), timeout=30, what="f-own's JobSet")
        w0 = await quiet(p, bus)
        js = p.get(JOBSET, "JobSet", "f-own")
        assert owns(js, "trainer", *LABEL) and owns(js, "trainer", *SUSPEND)

        # 1. A forced server-side apply by someone else: label and spec.suspend change hands.
        js = foreign_apply(p, "f-own", {"metadata": {"labels": {"step": "theirs"}}, "spec": {"suspend": False}})
        assert js["metadata"]["labels"]["step"] == "theirs" and js["spec"]["suspend"] is False
        assert not owns(js, "trainer", *LABEL) and owns(js, "someone-else", *LABEL)
        assert not owns(js, "trainer", *SUSPEND) and owns(js, "someone-else", *SUSPEND)

        def won_back() -> bool:
            live = p.get(JOBSET, "JobSet", "f-own")
            return (
                (live["metadata"].get("labels") or {}).get("step") == "ours"
                and live["spec"].get("suspend") is True
                and owns(live, "trainer", *LABEL)
                and owns(live, "trainer", *SUSPEND)
                and not owns(live, "someone-else", *LABEL)
                and not owns(live, "someone-else", *SUSPEND)
            )

        await until(won_back, timeout=30, what="trainer to take the label and spec.suspend back")
        w1 = await quiet(p, bus)
        await assert_ledger_holds_live(p, bus, "f-own", spec_version=spec_rv)

        # 2. Touching the TrainJob now plans the same JobSet again: recognised, no JobSet write.
        p.merge_patch(TRAINER, "TrainJob", "f-own", {"metadata": {"labels": {"touched": "1"}}})
        await asyncio.sleep(1.0)
        w2 = await quiet(p, bus)
        assert (w2 - w1).writes("jobsets") == 0, (w2 - w1).summary()

        # 3. A plain update (merge patch, operation Update) of the label by another manager.
        edited = (
            p.resource(JOBSET, "JobSet")
            .patch(
                namespace=p.namespace,
                name="f-own",
                body={"metadata": {"labels": {"step": "edited"}}},
                content_type="application/merge-patch+json",
                field_manager="kubectl-edit",
            )
            .to_dict()
        )
        assert owns(edited, "kubectl-edit", *LABEL) and not owns(edited, "trainer", *LABEL)
        await until(
            lambda: (
                (p.get(JOBSET, "JobSet", "f-own")["metadata"].get("labels") or {}).get("step") == "ours"
                and owns(p.get(JOBSET, "JobSet", "f-own"), "trainer", *LABEL)
                and not owns(p.get(JOBSET, "JobSet", "f-own"), "kubectl-edit", *LABEL)
            ),
            timeout=30,
            what="trainer to take the label back from a plain update",
        )
        touched = rv(p.merge_patch(TRAINER, "TrainJob", "f-own", {"metadata": {"labels": {"touched": "2"}}}))
        w3 = await quiet(p, bus)
        # The touch was planned and recognised as already applied: the record moved to its version.
        record = await assert_ledger_holds_live(p, bus, "f-own", spec_version=touched)
        assert jobset_matches(p.get(JOBSET, "JobSet", "f-own"), p.get(TRAINER, "TrainJob", "f-own"))

        # 4. A running JobSet: Trainer leaves it alone, and so do we; the foreign label stays.
        p.create(trainjob("f-run", num_nodes=3, patches=step_patch("ours")))
        await until(lambda: step_of(p, "f-run") == ("ours", "ours"), timeout=30, what="f-run's JobSet")
        w4 = await quiet(p, bus)
        taken = foreign_apply(p, "f-run", {"metadata": {"labels": {"step": "theirs"}}})
        assert owns(taken, "someone-else", *LABEL) and not owns(taken, "trainer", *LABEL)
        p.merge_patch(TRAINER, "TrainJob", "f-run", {"metadata": {"labels": {"touched": "1"}}})
        await asyncio.sleep(1.5)
        w5 = await quiet(p, bus)
        live = p.get(JOBSET, "JobSet", "f-run")
        assert (live["metadata"].get("labels") or {}).get("step") == "theirs"
        assert owns(live, "someone-else", *LABEL) and not owns(live, "trainer", *LABEL)
        assert (w5 - w4).writes("jobsets") == 1, (w5 - w4).summary()  # the foreign apply only
        assert live["spec"].get("suspend") in (False, None)
        await no_dead_letters(bus, p.namespace)

        replayed, repeat, ambiguous = await assert_repeats_cost_nothing(p, bus)
        report(
            "f",
            seconds=round(time.monotonic() - started, 1),
            writes_foreign_apply_and_win_back=(w1 - w0).summary(),
            writes_touch=(w2 - w1).summary(),
            writes_plain_update_and_win_back=(w3 - w2).summary(),
            writes_running_foreign_apply=(w5 - w4).summary(),
            ledger=record,
            replayed=replayed,
            repeat_writes=repeat.summary(),
            equal_version_status_plans=ambiguous,
        )
    finally:
        await nc.close()


async def test_g_missing_runtime_then_created(pipeline: Pipeline) -> None:
    p = pipeline
    started = time.monotonic()
    suffix = secrets.token_hex(3)
    cluster_name = f"late-cluster-{suffix}"
    ns_name = f"late-ns-{suffix}"
    p.start_all()
    nc = await p.connect()
    try:
        bus = nc.jetstream()
        await services_ready(bus)
        spec_rv = {
            "g-cluster": rv(p.create(trainjob("g-cluster", num_nodes=3, runtime=cluster_name))),
            "g-ns": rv(p.create(trainjob("g-ns", num_nodes=2, runtime=ns_name, runtime_kind="TrainingRuntime"))),
        }

        def not_found(name: str, runtime: str) -> dict[str, Any] | None:
            cond = condition_of(p.get(TRAINER, "TrainJob", name), "ResourcesCreated")
            return cond if cond and cond["status"] == "False" and cond["reason"] == "RuntimeNotFound" else None

        cond = await until(lambda: not_found("g-cluster", cluster_name), timeout=30, what="RuntimeNotFound")
        assert f"ClusterTrainingRuntime/{cluster_name} not found" in cond["message"], cond
        cond = await until(lambda: not_found("g-ns", ns_name), timeout=30, what="RuntimeNotFound")
        assert f"TrainingRuntime/{ns_name} not found" in cond["message"], cond
        assert p.get_or_none(JOBSET, "JobSet", "g-cluster") is None
        assert p.get_or_none(JOBSET, "JobSet", "g-ns") is None
        w0 = await quiet(p, bus)

        runtime = shipped_runtimes()["torch-distributed"]
        runtime["metadata"]["name"] = cluster_name
        p.create(runtime)
        namespaced = shipped_runtimes()["torch-distributed"]
        namespaced["kind"] = "TrainingRuntime"
        namespaced["metadata"] = {"name": ns_name, "labels": namespaced["metadata"]["labels"]}
        p.create(namespaced)

        await until(lambda: converged(p, ["g-cluster", "g-ns"]), timeout=30, what="both JobSets")

        def created(name: str) -> bool:
            cond = condition_of(p.get(TRAINER, "TrainJob", name), "ResourcesCreated")
            return bool(cond and cond["status"] == "True" and cond["reason"] == "ResourcesCreated")

        await until(lambda: created("g-cluster") and created("g-ns"), timeout=30, what="ResourcesCreated=True")
        w1 = await quiet(p, bus)
        for name in ("g-cluster", "g-ns"):
            await assert_ledger_holds_live(p, bus, name, spec_version=spec_rv[name])
            assert p.get(JOBSET, "JobSet", name)["metadata"]["generation"] == 1
        assert (w1 - w0).writes("jobsets") == 2, (w1 - w0).summary()
        await no_dead_letters(bus, p.namespace)
        replayed, repeat, ambiguous = await assert_repeats_cost_nothing(p, bus)
        report(
            "g",
            seconds=round(time.monotonic() - started, 1),
            writes_after_runtime_created=(w1 - w0).summary(),
            replayed=replayed,
            repeat_writes=repeat.summary(),
            equal_version_status_plans=ambiguous,
        )
    finally:
        await nc.close()
        p.resource(TRAINER, "ClusterTrainingRuntime").delete(name=cluster_name)
