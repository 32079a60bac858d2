"""The operator commands on a running pipeline: history, replay, plan and the dead-letter queue."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest
import yaml
from faults.support import jobset_admission_policy
from kubernetes import dynamic

from contracts import streams, subjects
from contracts.messages import ApplyJobSet, decode_apply
from planner import service as planner_service
from planner.framework import Framework
from planner.info import RuntimeInfo
from planner.plugins import REGISTRY
from plumbing.bus_history import read_stream
from tjpipe import operator_commands, settings
from tjpipe.cli import build_parser
from tjpipe.local.stack import Stack

from .support import TRAINER, create, eventually, get

pytestmark = [pytest.mark.cluster, pytest.mark.nats]


def tjpipe(*args: str, stack: Stack, timeout: float = 60, identity: str = "reader") -> subprocess.CompletedProcess[str]:
    """``tjpipe`` as an operator runs it: the read-only NATS identity unless told otherwise."""
    env = dict(os.environ, NATS_URL=stack.nats_url, KUBECONFIG=str(stack.kubeconfig))
    if stack.credentials is not None:
        env["NATS_CREDS"] = str(stack.credentials.seed_file(identity))
    return subprocess.run(
        [sys.executable, "-m", "tjpipe", *args], env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


def trainjob(name: str, namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": TRAINER,
        "kind": "TrainJob",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"runtimeRef": {"name": "torch-distributed"}, "suspend": True, "trainer": {"numNodes": 2}},
    }


@pytest.fixture(scope="module")
def recorded(pipeline: Stack, dyn: dynamic.DynamicClient, kube: Any) -> tuple[str, str]:
    """A TrainJob that went through the pipeline and changed once, so its history has some length."""
    namespace = "ops-" + os.urandom(3).hex()
    dyn.resources.get(api_version="v1", kind="Namespace").create(
        body={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
    )
    create(dyn, trainjob("hist", namespace))
    eventually(lambda: get(dyn, "jobset.x-k8s.io/v1alpha2", "JobSet", namespace, "hist"), what="the JobSet")
    dyn.resources.get(api_version=TRAINER, kind="TrainJob").patch(
        namespace=namespace,
        name="hist",
        body={"metadata": {"labels": {"touched": "yes"}}},
        content_type="application/merge-patch+json",
    )
    eventually(
        lambda: any(
            c["type"] == "Suspended" for c in get(dyn, TRAINER, "TrainJob", namespace, "hist")["status"]["conditions"]
        ),
        what="the Suspended condition",
    )
    return namespace, "hist"


def test_history_shows_events_plans_and_results(pipeline: Stack, recorded: tuple[str, str]) -> None:
    namespace, name = recorded
    done = tjpipe("history", f"{namespace}/{name}", "-o", "json", stack=pipeline)
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)
    kinds = {r["kind"] for r in rows}
    assert {"event", "plan", "result"} <= kinds
    plans = [r for r in rows if r["kind"] == "plan"]
    assert any(r["detail"]["component"] == "jobset" for r in plans)
    results = [r for r in rows if r["kind"] == "result"]
    assert any(r["detail"]["action"] == "created" and r["detail"]["component"] == "jobset" for r in results)
    assert [r["time"] for r in rows] == sorted(r["time"] for r in rows)
    table = tjpipe("history", f"{namespace}/{name}", stack=pipeline)
    assert table.returncode == 0 and "history of TrainJob" in table.stdout


def test_replay_reproduces_the_recorded_plans(pipeline: Stack, recorded: tuple[str, str]) -> None:
    namespace, name = recorded
    done = tjpipe("replay", f"{namespace}/{name}", stack=pipeline)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 TrainJob(s): 1 unchanged, 0 changed" in done.stdout
    everything = tjpipe("replay", "--all", "-o", "json", stack=pipeline)
    assert everything.returncode == 0, everything.stdout
    assert json.loads(everything.stdout)["jobs_changed"] == []


class _ExtraLabel:
    """A deliberately changed planner: every JobSet pod gets one more label."""

    name = "extra-label"

    def enforce_pod_group_policy(self, info: RuntimeInfo, job: Any) -> None:
        info.pod_labels["example.com/replayed"] = "yes"


def test_a_changed_planner_makes_replay_report_the_fields_and_fail(
    pipeline: Stack, recorded: tuple[str, str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    namespace, name = recorded
    # The framework a planner with the default settings runs (planner.service.framework_of / framework_with),
    # which replay builds from the same settings.
    monkeypatch.setattr(planner_service, "FRAMEWORK", Framework([*REGISTRY, ("extra-label", _ExtraLabel)]))
    argv = ["replay", f"{namespace}/{name}", "-o", "json", "--nats-url", pipeline.nats_url]
    if pipeline.credentials:
        argv += ["--nats-creds", str(pipeline.credentials.seed_file("reader"))]
    args = settings.resolve(build_parser().parse_args(argv), {})
    code = operator_commands.run("replay", args)
    assert code == 1
    report = json.loads(capsys.readouterr().out)
    assert report["jobs_changed"] == [f"{namespace}/{name}"]
    assert any(
        field.startswith("jobset: object.spec.replicatedJobs.node.template.spec.template.metadata")
        for field in report["fields_changed"]
    ), report["fields_changed"]


async def test_plan_prints_what_the_pipeline_applies(
    pipeline: Stack, dyn: dynamic.DynamicClient, recorded: tuple[str, str], tmp_path: Path
) -> None:
    namespace, name = recorded
    live = get(dyn, TRAINER, "TrainJob", namespace, name)
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump({k: live[k] for k in ("apiVersion", "kind", "metadata", "spec")}))
    done = tjpipe("plan", "-f", str(job_file), "--from-cluster", stack=pipeline)
    assert done.returncode == 0, done.stderr
    planned = {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(done.stdout) if d}
    nc = await pipeline.connect("reader")
    try:
        stored = await read_stream(
            nc.jetstream(), streams.APPLY_HISTORY.name, subjects.trainjob_apply_filter(namespace, name)
        )
    finally:
        await nc.close()
    applied = [m for m in map(lambda s: decode_apply(s.data), stored) if isinstance(m, ApplyJobSet)]
    first = msgspec.to_builtins(applied[0].object)
    assert planned[("JobSet", name)] == first
    assert ("ConfigMap", f"{name}-runtime-snapshot") in planned


async def test_a_fixed_dead_letter_retried_converges(pipeline: Stack, dyn: dynamic.DynamicClient) -> None:
    """An admission policy refuses a TrainJob's JobSet for good (a dead letter); the operator relaxes the
    policy and sends the dead letter back; the JobSet is made."""
    namespace = "later-" + os.urandom(3).hex()
    name = "held"
    dyn.resources.get(api_version="v1", kind="Namespace").create(
        body={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
    )
    admission = "admissionregistration.k8s.io/v1"
    policy = f"tjpipe-test-no-jobsets-{namespace}"
    for body in jobset_admission_policy(
        policy, namespace, expression="false", message="no JobSets here yet", operations=("CREATE",)
    ):
        dyn.resources.get(api_version=body["apiVersion"], kind=body["kind"]).create(body=body)
    jobsets = dyn.resources.get(api_version="jobset.x-k8s.io/v1alpha2", kind="JobSet")
    probe = {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": "probe"}, "spec": {}}

    def enforced() -> bool:
        try:
            jobsets.create(body=probe, namespace=namespace, dry_run="All")
        except dynamic.exceptions.DynamicApiError as exc:
            return exc.status == 422 and policy in str(exc.body)
        return False

    eventually(enforced, what="the admission policy to be enforced")
    create(dyn, trainjob(name, namespace))

    def dead_letter_seqs() -> list[int]:
        listed = tjpipe("dlq", "list", "-o", "json", stack=pipeline)
        rows = json.loads(listed.stdout)
        return sorted(int(r["seq"]) for r in rows if f".{namespace}." in r["subject"] and r["reason"] == "permanent")

    eventually(dead_letter_seqs, what="the dead letter")
    time.sleep(2)  # the TrainJob's condition makes one more plan, refused the same way: retry the newest
    seq = dead_letter_seqs()[-1]
    shown = tjpipe("dlq", "show", str(seq), stack=pipeline)
    assert shown.returncode == 0 and "payload:" in shown.stdout and namespace in shown.stdout
    dyn.resources.get(api_version=admission, kind="ValidatingAdmissionPolicyBinding").delete(name=policy)
    dyn.resources.get(api_version=admission, kind="ValidatingAdmissionPolicy").delete(name=policy)
    eventually(lambda: not enforced(), what="the policy to be gone")  # the fix
    refused = tjpipe("dlq", "retry", str(seq), stack=pipeline)  # the read-only identity may not
    assert refused.returncode == 3, refused.stderr  # exit code 3: the command failed (refused)
    assert refused.stderr == (
        f"error: no answer for dead letter {seq}: the NATS identity in use may not resend dead letters "
        "(use the dlq-operator identity, e.g. NATS_CREDS=.tjpipe/creds/dlq-operator.nk)\n"
    )
    retried = tjpipe("dlq", "retry", str(seq), stack=pipeline, identity="dlq-operator")
    assert retried.returncode == 0, retried.stderr
    eventually(lambda: get(dyn, "jobset.x-k8s.io/v1alpha2", "JobSet", namespace, name), what="the retried JobSet")
    assert seq not in dead_letter_seqs()
