"""The planner against Trainer v2.3.0 itself: every golden case was produced by Trainer's own code.

For each case the planner plans the same TrainJob and runtime, and its components must equal what Trainer
built, object by object and key by key; only the MPI Secret's key is left out, since it is random in
Trainer and made later, by the applier, here. Documented deviations are applied explicitly, each with its
upstream issue, so a difference that is not a deliberate fix fails the test. One is this pipeline's own:
every ConfigMap and Secret carries the label the watcher selects them by (``contracts.labels``); it is
checked to be there and then removed, and nothing else is.

The ``trainjob-status*`` cases ran Trainer with its ``TrainJobStatus`` feature gate on (``MANIFEST.json``
says which gates a case ran with); the planner then runs with the TrainJobStatus plugin, given the URL
Trainer derives from its default configuration and the CA from the webhook certificate's Secret in the
case's input, as the planner's shell reads its CA file. With the gate off, the planner's plans are the
same bytes as a planner that has never heard of the feature.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
from pathlib import Path
from typing import Any

import msgspec
import pytest
import yaml
from needs import unavailable

from contracts.jobset import JobSet
from contracts.labels import LABELLED_KINDS, MANAGED_BY, MANAGED_BY_LABEL
from contracts.messages import ApplyTrainJobStatus, ObjectApply, TrainJobObserved
from contracts.trainer import TrainingRuntime, TrainJob
from planner.core import FRAMEWORK, plan
from planner.framework import Framework
from planner.plugins import registry
from planner.plugins.trainjobstatus import StatusServer
from planner.service import PlannerSettings, framework_of

CASES = Path(__file__).parent / "cases"
Obj = dict[str, Any]
NOW = dt.datetime(2026, 1, 1, 0, 0, 5, tzinfo=dt.UTC).timestamp()

FRAMEWORK_ENVS = {
    "PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT",
    "JAX_NUM_PROCESSES", "JAX_PROCESS_ID", "JAX_COORDINATOR_ADDRESS",
    "DMLC_TRACKER_URI", "DMLC_TRACKER_PORT", "DMLC_TASK_ID", "DMLC_NUM_WORKER",
}  # fmt: skip


TRAINJOB_STATUS_GATE = "TrainJobStatus=true"
TRAINER_STATUS_SERVER_URL = "https://kubeflow-trainer-controller-manager.kubeflow-system.svc:10443"
"""What Trainer's plugin names the status server by with its default configuration: the webhook Service's
DNS name in the operator namespace (kubeflow-system outside a pod) and ``statusServer.port``."""
WEBHOOK_CERT_SECRET = ("kubeflow-system", "kubeflow-trainer-webhook-cert")


def case_dirs() -> list[Path]:
    return sorted(p.parent for p in CASES.glob("*/*/input.yaml"))


def feature_gates(case: Path) -> list[str]:
    manifest = json.loads((CASES / "MANIFEST.json").read_text())
    for summary in manifest["cases"]:
        if (summary["runtime"], summary["variant"]) == (case.parent.name, case.name):
            return list(summary.get("feature_gates", []))
    raise AssertionError(f"{case} is not in MANIFEST.json")


def framework_for(case: Path) -> Framework:
    """The planner's plugins for a case: TrainJobStatus too when Trainer ran with its gate on."""
    gates = feature_gates(case)
    assert set(gates) <= {TRAINJOB_STATUS_GATE}, f"a feature gate the planner does not know: {gates}"
    if not gates:
        return FRAMEWORK
    docs = [d for d in yaml.safe_load_all((case / "input.yaml").read_text()) if d]
    secret = next(
        d
        for d in docs
        if d["kind"] == "Secret" and (d["metadata"]["namespace"], d["metadata"]["name"]) == WEBHOOK_CERT_SECRET
    )
    ca = base64.b64decode(secret["data"]["ca.crt"]).decode()
    return Framework(registry(StatusServer(url=TRAINER_STATUS_SERVER_URL, ca_cert=ca)))


def load(case: Path) -> tuple[Obj, Obj, Obj | None]:
    docs = [d for d in yaml.safe_load_all((case / "input.yaml").read_text()) if d]
    job = next(d for d in docs if d["kind"] == "TrainJob")
    runtime = next(d for d in docs if d["kind"] in ("TrainingRuntime", "ClusterTrainingRuntime"))
    jobset = next((d for d in docs if d["kind"] == "JobSet"), None)
    return job, runtime, jobset


def normalise(value: Any) -> Any:
    """Drop the oracle's ``_kind`` hint; nothing else is changed."""
    if isinstance(value, dict):
        return {k: normalise(v) for k, v in value.items() if k != "_kind"}
    if isinstance(value, list):
        return [normalise(v) for v in value]
    return value


def by_identity(objects: list[Obj]) -> dict[tuple[str, str], Obj]:
    out: dict[tuple[str, str], Obj] = {}
    for obj in objects:
        obj = normalise(obj)
        if obj["kind"] == "Secret" and obj["metadata"]["name"].endswith("-mpi-ssh-auth"):
            obj.pop("data", None)  # random in Trainer; made by our applier, never planned
        out[(obj["kind"], obj["metadata"]["name"])] = obj
    return out


def without_our_label(ours: dict[tuple[str, str], Obj]) -> None:
    """Remove this pipeline's label from our ConfigMaps and Secrets, asserting it is there to remove."""
    for (kind, name), obj in ours.items():
        labels = obj["metadata"].get("labels", {})
        if kind not in LABELLED_KINDS:
            assert MANAGED_BY_LABEL not in labels, (kind, name)
            continue
        assert labels.pop(MANAGED_BY_LABEL) == MANAGED_BY, (kind, name)
        if not labels:
            del obj["metadata"]["labels"]


def without_framework_env(ours: dict[tuple[str, str], Obj], runtime: Obj) -> None:
    """Upstream #4076: with ``spec.trainer`` omitted Trainer injects no framework env or port; we do.

    The fix is checked here by removing exactly those envs and ports from our JobSet before comparing, and
    asserting that they are there to remove.
    """
    js = ours.get(("JobSet", "job"))
    if js is None:
        return
    removed = 0
    for rjob in js["spec"]["replicatedJobs"]:
        for container in rjob["template"]["spec"]["template"]["spec"].get("containers", []):
            env = container.get("env", [])
            kept = [e for e in env if e["name"] not in FRAMEWORK_ENVS]
            removed += len(env) - len(kept)
            if kept:
                container["env"] = kept
            else:
                container.pop("env", None)
            ports = [p for p in container.get("ports", []) if p.get("containerPort") != 29500]
            if ports:
                container["ports"] = ports
            else:
                container.pop("ports", None)
    policy = runtime["spec"].get("mlPolicy") or {}
    if any(kind in policy for kind in ("torch", "jax", "xgboost")):
        assert removed > 0, "the #4076 fix should have added the framework env"


def event(job: Obj, runtime: Obj, jobset: Obj | None) -> TrainJobObserved:
    return TrainJobObserved(
        trainjob=msgspec.convert(job, TrainJob),
        runtime=msgspec.convert(runtime, TrainingRuntime),
        runtime_source="snapshot",
        jobset=msgspec.convert(jobset, JobSet) if jobset is not None else None,
        observed_at=NOW,
    )


@pytest.mark.parametrize("case", case_dirs(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_planner_builds_what_trainer_builds(case: Path) -> None:
    job, runtime, jobset = load(case)
    result = plan(event(job, runtime, jobset), source_seq=1, framework=framework_for(case))
    validation = json.loads((case / "expected.validate.json").read_text())
    if validation.get("errors"):
        # Trainer's webhook would refuse this TrainJob; with no webhook in front, the planner fails it.
        assert not [m for m in result.applies if isinstance(m, ObjectApply) and not isinstance(m, ApplyTrainJobStatus)]
        (status,) = [m for m in result.applies if isinstance(m, ApplyTrainJobStatus)]
        failed = [c for c in msgspec.to_builtins(status.object)["status"]["conditions"] if c["type"] == "Failed"]
        assert failed and failed[0]["reason"] == "ValidationFailed"
        for error in validation["errors"]:
            assert error["detail"].split(":")[0][:40] in failed[0]["message"], error
        return

    expected = by_identity(json.loads((case / "expected.json").read_text()))
    ours = by_identity(
        [msgspec.to_builtins(m.object) for m in result.applies if not isinstance(m, ApplyTrainJobStatus)]
    )
    without_our_label(ours)
    if "trainer" not in job["spec"]:
        without_framework_env(ours, runtime)
    if jobset is not None:
        # Trainer leaves an existing, running JobSet alone; so do we (the message is not even sent).
        expected.pop(("JobSet", "job"), None)
        expected_status = json.loads((case / "expected.status.json").read_text())
        (status,) = [m for m in result.applies if isinstance(m, ApplyTrainJobStatus)]
        assert msgspec.to_builtins(status.object)["status"] == expected_status
    assert sorted(ours) == sorted(expected)
    for identity, obj in expected.items():
        assert ours[identity] == obj, identity


def test_every_shipped_runtime_is_covered() -> None:
    from tjpipe.local.crds import shipped_runtimes
    from tjpipe.local.toolchain import ToolchainMissing

    try:
        names = set(shipped_runtimes())
    except ToolchainMissing as exc:  # the one expected absence: no Go toolchain to read Trainer's module with
        unavailable(f"cannot read the shipped runtimes: {exc}")
    assert names <= {p.name for p in CASES.iterdir() if p.is_dir()}


TODAYS_PLUGINS = ["coscheduling", "flux", "volcano", "mpi", "plainml", "torch", "jobset", "jax", "xgboost"]


@pytest.mark.parametrize("case", case_dirs(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_the_feature_off_changes_no_byte_of_a_plan(case: Path) -> None:
    """With the setting off, the planner runs the nine plugins it ran before the feature, and its plans are
    the same bytes as a framework of exactly those plugins gives."""
    job, runtime, jobset = load(case)
    off = framework_of(PlannerSettings(nats_url="nats://127.0.0.1:4222"))
    assert [p.name for p in off.plugins] == TODAYS_PLUGINS
    without = Framework([entry for entry in registry() if entry[0] in TODAYS_PLUGINS])
    ours = plan(event(job, runtime, jobset), source_seq=1, framework=off)
    before = plan(event(job, runtime, jobset), source_seq=1, framework=without)
    assert msgspec.json.encode(ours) == msgspec.json.encode(before)


@pytest.mark.parametrize("case", case_dirs(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_the_feature_on_adds_only_what_the_plugin_adds(case: Path) -> None:
    """On, every golden TrainJob's plan gains the tls-config ConfigMap, and its JobSet gains the env, mount
    and volume on the trainer pods; everything else is the plan with the feature off."""
    job, runtime, jobset = load(case)
    server = StatusServer(url="https://127.0.0.1:10443", ca_cert="-----BEGIN CERTIFICATE-----\nx\n")
    off = plan(event(job, runtime, jobset), source_seq=1, framework=FRAMEWORK)
    on = plan(event(job, runtime, jobset), source_seq=1, framework=Framework(registry(server)))
    off_objects = {(m.object.kind, m.object.metadata.name): msgspec.to_builtins(m.object) for m in off.applies}
    on_objects = {(m.object.kind, m.object.metadata.name): msgspec.to_builtins(m.object) for m in on.applies}
    if ("ConfigMap", "job-tls-config") not in on_objects:  # nothing built (validation failed): no change at all
        assert not [k for k in off_objects if k[0] != "TrainJob"]
        assert msgspec.json.encode(on) == msgspec.json.encode(off)
        return
    config_map = on_objects.pop(("ConfigMap", "job-tls-config"))
    assert config_map["data"] == {"ca.crt": server.ca_cert}
    assert config_map["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"]
    if ("JobSet", "job") not in off_objects:
        # A running JobSet is left alone, with or without the feature; the plan says what it then lacks.
        assert jobset is not None and on_objects == off_objects
        assert ".template.spec.template.spec.volumes" in on.warnings[0]
        return
    assert on.warnings == off.warnings
    on_jobset, off_jobset = on_objects.pop(("JobSet", "job")), off_objects.pop(("JobSet", "job"))
    assert on_objects == off_objects
    on_rjobs, off_rjobs = on_jobset["spec"]["replicatedJobs"], off_jobset["spec"]["replicatedJobs"]
    trainer = next((i for i, rjob in enumerate(off_rjobs) if _ancestor(rjob) == "trainer"), None)
    for index, (on_rjob, off_rjob) in enumerate(zip(on_rjobs, off_rjobs, strict=True)):
        if index != trainer:
            assert on_rjob == off_rjob  # only the first trainer pod set is touched, as in Trainer
            continue
        on_pod, off_pod = _pod(on_rjob), _pod(off_rjob)
        (volume,) = [v for v in on_pod["volumes"] if v["name"] == "kubeflow-trainer-token"]
        token = volume["projected"]["sources"][0]["serviceAccountToken"]
        assert token["audience"] == "trainer.kubeflow.org/v1alpha1/namespaces/golden/trainjobs/job/status"
        assert on_pod.get("initContainers") == off_pod.get("initContainers")
        for on_c, off_c in zip(on_pod["containers"], off_pod["containers"], strict=True):
            added = {e["name"] for e in on_c["env"] if e not in off_c.get("env", [])}
            assert {"KUBEFLOW_TRAINER_SERVER_CA_CERT", "KUBEFLOW_TRAINER_SERVER_TOKEN"} <= added <= STATUS_ENV
            assert STATUS_MOUNT in on_c["volumeMounts"]


STATUS_ENV = {"KUBEFLOW_TRAINER_SERVER_URL", "KUBEFLOW_TRAINER_SERVER_CA_CERT", "KUBEFLOW_TRAINER_SERVER_TOKEN"}
STATUS_MOUNT = {"name": "kubeflow-trainer-token", "mountPath": "/var/run/secrets/kubeflow/trainer", "readOnly": True}


def _ancestor(rjob: Obj) -> str | None:
    labels = rjob["template"].get("metadata", {}).get("labels", {})
    value = labels.get("trainer.kubeflow.org/trainjob-ancestor-step")
    return str(value) if value is not None else None


def _pod(rjob: Obj) -> Obj:
    pod: Obj = rjob["template"]["spec"]["template"]["spec"]
    return pod
