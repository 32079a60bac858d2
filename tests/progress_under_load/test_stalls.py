"""No stall is permanent or silent, on the real local stack.

- A component the API server refuses (here a ValidatingAdmissionPolicy standing in for JobSet's webhook,
  which refuses names that make pod hostnames too long) puts ``ComponentsApplied=False`` with the API
  server's reason on the TrainJob, not only a Warning Event; once it applies, the condition goes.
- A poisoned ledger claim (a ``source_version`` above anything the cluster holds) gets a condition while it
  lasts and is overwritten after the grace, instead of skipping the target as stale for ever.
- A plan too large for the bus's max payload is dead-lettered once, with ``ResourcesCreated=False``
  reason ``PlanTooLarge`` on the TrainJob, instead of being retried every second for ever.
- (Full work and record streams: ``test_full_streams_and_old_buses.py``.)
- JetStream registers a message id only for a message it stored, so a refused publish's retry (or a later
  resync of the same observation) is not dropped as a duplicate.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from pathlib import Path
from typing import Any

import msgspec
import nats
import nats.js.errors
import pytest
from faults.support import (
    JOBSET,
    TRAINER,
    Pipeline,
    condition_of,
    converged,
    dead_letters,
    jobset_admission_policy,
    jobset_matches,
    ledger_record,
    metric,
    quiet,
    services_ready,
    start_with_metrics,
    step_of,
    step_patch,
    trainjob,
    until,
)
from kubernetes.dynamic.exceptions import DynamicApiError, NotFoundError
from nats.js import api as js_api

from applier.ledger import ledger_key
from contracts import conditions, streams
from contracts.messages import AppliedRecord, Target
from plumbing import publishing
from tjpipe.local.natsd import start_nats

pytestmark = [pytest.mark.cluster, pytest.mark.nats, pytest.mark.timeout(240)]

POLICY = "tjpipe-test-hostname-length"
NAME_LIMIT = 40


# ------------------------------------------------------------------------------- a refused component


def hostname_policy(namespace: str) -> list[dict[str, Any]]:
    """JobSet's webhook refuses a JobSet whose pod hostnames would be too long; this policy stands in for it."""
    return jobset_admission_policy(
        POLICY,
        namespace,
        expression=f"object.metadata.name.size() <= {NAME_LIMIT}",
        message="JobSet name is too long: its pod hostnames would exceed 63 characters",
    )


async def test_a_component_the_api_server_refuses_is_a_condition_until_it_applies(pipeline: Pipeline) -> None:
    p = pipeline
    ns = p.namespace
    admission = "admissionregistration.k8s.io/v1"
    for obj in hostname_policy(ns):
        p.create(obj)
    probe = {"apiVersion": JOBSET, "kind": "JobSet", "metadata": {"name": "p" * 50}, "spec": {"replicatedJobs": []}}

    def enforced() -> bool:
        try:
            p.resource(JOBSET, "JobSet").create(body=probe, namespace=ns, dry_run="All")
        except DynamicApiError as exc:
            return exc.status == 422 and POLICY in (exc.body or "")
        return False

    try:
        await until(enforced, timeout=30, what="the hostname policy to be enforced")
        p.start_all()
        nc = await p.connect()
        try:
            js = nc.jetstream()
            await services_ready(js)
            long_name = "long-" + "x" * 50
            p.create(trainjob(long_name, num_nodes=1))

            def refused() -> dict[str, Any] | None:
                return condition_of(p.get(TRAINER, "TrainJob", long_name), conditions.CONDITION_COMPONENTS_APPLIED)

            cond = await until(refused, timeout=60, what="ComponentsApplied on the refused TrainJob")
            assert (cond["status"], cond["reason"]) == ("False", "Invalid"), cond
            assert cond["message"].startswith(f"JobSet {long_name}: "), cond
            assert "pod hostnames would exceed 63 characters" in cond["message"], cond
            owners = {m["manager"] for m in p.get(TRAINER, "TrainJob", long_name)["metadata"]["managedFields"]}
            assert conditions.APPLIER_FIELD_MANAGER in owners
            await quiet(p, js)  # and it settles: the condition's own change plans to the same answer
            dead = [dl for dl in await dead_letters(js, ns) if dl.reason == "permanent"]
            assert dead and all("Invalid" in dl.error for dl in dead)
            assert p.get_or_none(JOBSET, "JobSet", long_name) is None

            # A healthy TrainJob next to it never gets the condition.
            p.create(trainjob("short", num_nodes=1))
            await until(lambda: converged(p, ["short"]), timeout=60, what="the healthy TrainJob's JobSet")
            assert condition_of(p.get(TRAINER, "TrainJob", "short"), conditions.CONDITION_COMPONENTS_APPLIED) is None

            # The rule goes; the next plan applies the JobSet, and the condition goes with it.
            p.resource(admission, "ValidatingAdmissionPolicyBinding").delete(name=POLICY)
            p.resource(admission, "ValidatingAdmissionPolicy").delete(name=POLICY)
            await asyncio.sleep(2)  # the admission plugin notices from its informers
            p.merge_patch(TRAINER, "TrainJob", long_name, {"metadata": {"labels": {"retry": "1"}}})
            await until(lambda: converged(p, [long_name]), timeout=60, what="the JobSet once the rule is gone")
            await until(lambda: refused() is None, timeout=30, what="the condition to clear")
        finally:
            await nc.close()
    finally:
        for kind in ("ValidatingAdmissionPolicyBinding", "ValidatingAdmissionPolicy"):
            with contextlib.suppress(NotFoundError):
                p.resource(admission, kind).delete(name=POLICY)


# ------------------------------------------------------------------------------------ a poisoned ledger


async def test_a_poisoned_ledger_claim_is_a_condition_then_overwritten(pipeline: Pipeline) -> None:
    p = pipeline
    ns = p.namespace
    grace = 8.0
    ports = start_with_metrics(p, applier=["--stale-claim-grace", str(grace)])
    nc = await p.connect()
    try:
        js = nc.jetstream()
        await services_ready(js)
        p.create(trainjob("poisoned", num_nodes=1, suspend=True, patches=step_patch("1")))
        await until(lambda: converged(p, ["poisoned"]), timeout=60, what="the suspended JobSet")
        await quiet(p, js)
        key = ledger_key(Target(api_version=JOBSET, kind="JobSet", namespace=ns, name="poisoned"))
        kv = await js.key_value(streams.APPLIED_BUCKET)
        poison = AppliedRecord(source_version=10**15, source_seq=1, digest="forged", state="applied")
        await kv.put(key, msgspec.json.encode(poison))

        # A change the JobSet must follow while suspended.
        p.merge_patch(TRAINER, "TrainJob", "poisoned", {"spec": {"runtimePatches": step_patch("2")}})

        def claim_condition() -> dict[str, Any] | None:
            return condition_of(p.get(TRAINER, "TrainJob", "poisoned"), conditions.CONDITION_COMPONENTS_APPLIED)

        cond = await until(claim_condition, timeout=30, what="the StaleLedgerClaim condition")
        assert (cond["status"], cond["reason"]) == ("False", conditions.REASON_STALE_LEDGER_CLAIM), cond
        assert step_of(p, "poisoned") == ("1", "1")  # held, not applied, while the claim lasts
        await until(lambda: step_of(p, "poisoned") == ("2", "2"), timeout=60, what="the JobSet after the overwrite")
        await until(lambda: claim_condition() is None, timeout=30, what="the condition to clear")
        record = await ledger_record(js, key)
        assert record is not None and record.source_version < 10**15, record
        # In that order: held while the grace lasted (the applier's own count), then overwritten, once.
        stale = metric(ports["applier"], "tjpipe_stale_ledger_claims_total")
        assert stale.get('{action="held"}', 0) >= 1, stale
        assert stale.get('{action="overwritten"}', 0) == 1, stale
        assert "nothing in the cluster accounts for" in p.log_text("applier")
        assert jobset_matches(p.get(JOBSET, "JobSet", "poisoned"), p.get(TRAINER, "TrainJob", "poisoned"))
    finally:
        await nc.close()


# ------------------------------------------------------------------------------------ a plan too large


def oversized_runtime(name: str) -> dict[str, Any]:
    """A runtime whose snapshot ConfigMap is far larger than the event that carries it.

    The event carries the runtime as UTF-8 JSON (3 bytes a character here); the snapshot renders it as YAML,
    which escapes each such character as ``\\uXXXX``, and that inside a JSON string (7 bytes). The event fits
    the default 1 MB max payload; the snapshot's apply message does not.
    """
    from tjpipe.local import crds

    runtime: dict[str, Any] = msgspec.json.decode(msgspec.json.encode(crds.shipped_runtimes()["torch-distributed"]))
    runtime["metadata"] = {"name": name}
    pod = runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    pod["containers"][0]["env"] = [{"name": "BIG", "value": "訓" * 170_000}]
    return runtime


async def test_a_plan_too_large_for_the_bus_is_a_dead_letter_and_a_condition_not_a_loop(pipeline: Pipeline) -> None:
    p = pipeline
    ns = p.namespace
    ports = start_with_metrics(p)
    nc = await p.connect()
    try:
        js = nc.jetstream()
        await services_ready(js)
        p.create(oversized_runtime("huge-runtime"))
        p.create(trainjob("too-large", num_nodes=1, runtime="huge-runtime", runtime_kind="ClusterTrainingRuntime"))

        def too_large() -> dict[str, Any] | None:
            cond = condition_of(p.get(TRAINER, "TrainJob", "too-large"), "ResourcesCreated")
            return cond if cond and cond["reason"] == conditions.REASON_PLAN_TOO_LARGE else None

        cond = await until(too_large, timeout=60, what="ResourcesCreated=False, PlanTooLarge")
        assert cond["status"] == "False"
        assert "runtime-snapshot" in cond["message"] and "bytes" in cond["message"], cond
        await quiet(p, js)
        dead = [dl for dl in await dead_letters(js, ns) if dl.reason == "plan-too-large"]
        assert dead and {dl.stage for dl in dead} == {"planner"}
        # No loop: nothing more happens on its own.
        await asyncio.sleep(5)
        assert len([dl for dl in await dead_letters(js, ns) if dl.reason == "plan-too-large"]) == len(dead)
        # Its creation and its own status change; the condition names a size that does not change from one
        # plan to the next, so the status change plans to the same status and nothing follows. A third comes
        # when the watcher's two watches see the TrainJob before its runtime: the runtime's arrival is fanned
        # out to the TrainJobs that use it, one more observation. Nothing after those (the wait above).
        assert len(dead) <= 3, [dl.error for dl in dead]
        planned = metric(ports["planner"], "tjpipe_plans_total")
        assert planned.get('{outcome="too-large"}', 0) == len(dead)
        assert "will be redelivered" not in p.log_text("planner")
        # The TrainJob's deletion leaves nothing to retry.
        p.resource(TRAINER, "TrainJob").delete(namespace=ns, name="too-large")
        await quiet(p, js)
    finally:
        await nc.close()
        p.resource(TRAINER, "ClusterTrainingRuntime").delete(name="huge-runtime")


# ------------------------------------------------------------------------------------------ full streams


async def test_a_refused_publish_leaves_no_message_id_behind(tmp_path: Path) -> None:
    """Why a resync is not swallowed by the duplicate window after a refusal: only stored ids count.

    With discard new, a refused message was never stored and its id never registered, so the publisher's
    retry (or the next resync, which carries the same id) is stored. With discard old, a stored message the
    limit later deletes keeps its id in the window, and a republish of it is dropped as a duplicate; that
    is one reason work streams do not use it.
    """
    server = start_nats(store_dir=tmp_path / "store", log_dir=tmp_path / "logs", name="nats-dedupe")
    try:
        nc = await nats.connect(server.url)
        js = nc.jetstream()
        await js.add_stream(
            js_api.StreamConfig(
                name="FULL",
                subjects=["full.>"],
                max_bytes=2_000,
                discard=js_api.DiscardPolicy.NEW,
                duplicate_window=60,
            )
        )
        stored = 0
        with pytest.raises(nats.js.errors.APIError) as refusal:
            while True:
                await js.publish("full.x", b"x" * 300, headers={"Nats-Msg-Id": f"id-{stored}"})
                stored += 1
        assert publishing.is_refused(refusal.value)
        assert refusal.value.err_code == publishing.STREAM_FULL_CODE
        refused_id = f"id-{stored}"
        await js.purge_stream("FULL")  # room again
        again = await js.publish("full.x", b"x" * 300, headers={"Nats-Msg-Id": refused_id})
        assert not again.duplicate  # the refused id was never registered
        removed = await js.publish("full.x", b"x" * 300, headers={"Nats-Msg-Id": "id-0"})
        assert removed.duplicate  # a stored-then-removed id still is
        # publish_stored waits out a full stream instead of failing or dropping.
        await js.update_stream(
            js_api.StreamConfig(
                name="FULL", subjects=["full.>"], max_bytes=2_000, discard=js_api.DiscardPolicy.NEW, duplicate_window=60
            )
        )
        while True:
            try:
                await js.publish("full.x", b"x" * 300, headers={"Nats-Msg-Id": str(uuid.uuid4())})
            except nats.js.errors.APIError:
                break
        waiting = asyncio.create_task(publishing.publish_stored(js, "full.x", b"late", stream="FULL"))
        await asyncio.sleep(1.0)
        assert not waiting.done()
        await js.purge_stream("FULL")
        ack = await asyncio.wait_for(waiting, timeout=15)
        assert ack.seq and not ack.duplicate
        await nc.close()
    finally:
        server.stop()
