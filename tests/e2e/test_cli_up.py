"""``tjpipe up --demo --detach`` and ``tjpipe down`` as a user runs them, in a fresh working directory.

The stack brings up its own NATS and kube-apiserver here (NATS_URL and KUBECONFIG are removed from the
environment), so this also checks the state folder a user is told about, and that ``down`` leaves nothing.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.cluster, pytest.mark.nats]


# Not cli.support.tjpipe: that drops NATS_*/KUBECONFIG and moves HOME; these pass decoys and keep HOME's Go cache.
def _tjpipe(*args: str, cwd: Path, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tjpipe", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split(") ", 1)[1][0] != "Z"


def test_up_detach_shows_the_demo_jobset_and_down_stops_everything(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("NATS_URL", "KUBECONFIG")}
    state = tmp_path / ".tjpipe"
    pids: list[int] = []
    try:
        up = _tjpipe("up", "--demo", "--detach", cwd=tmp_path, env=env)
        assert up.returncode == 0, up.stdout + up.stderr
        pid_files = sorted((state / "logs").glob("*.pid"))
        pids = [int(p.read_text().split()[0]) for p in pid_files]
        # The default stack is the whole simulated cluster (tjpipe.local.cluster); `down` must stop all of it.
        assert [p.stem for p in pid_files] == sorted(
            [
                *("applier", "etcd", "kube-apiserver", "nats", "planner", "watcher", "webhook", "history-server"),
                *("jobset-manager", "kube-controller-manager", "kube-scheduler", "kwok", "status-server"),
            ]
        )
        assert "ValidatingWebhookConfiguration tjpipe-validator.trainer.kubeflow.org registered" in up.stderr
        assert "ConfigMap kubeflow-system/kubeflow-trainer-public says v2.3.0" in up.stderr
        assert f"state folder: {state}" in up.stderr
        assert (state / "kubeconfig").is_file()
        env_lines = (state / "env").read_text().splitlines()
        assert any(line.startswith("export NATS_URL=nats://127.0.0.1:") for line in env_lines)
        assert f"export KUBECONFIG={state / 'kubeconfig'}" in env_lines
        assert f"export NATS_CREDS={state / 'creds' / 'reader.nk'}" in env_lines
        assert (state / "creds").stat().st_mode & 0o777 == 0o700
        assert {p.name: p.stat().st_mode & 0o777 for p in (state / "creds").iterdir()} == {
            f"{identity}.nk": 0o600
            for identity in (
                *("admin", "watcher", "planner", "applier", "reader", "dlq-operator", "status-server"),
                *("history-keeper", "log-keeper"),
            )
        }
        _check_demo_jobset(state)
        _check_demo_completes(state)
        first_uid = _demo_uid(state)
    finally:
        down = _tjpipe("down", cwd=tmp_path, env=env, timeout=120)
    assert down.returncode == 0, down.stderr
    assert "stopped:" in down.stdout + down.stderr
    assert not list((state / "logs").glob("*.pid"))
    assert [pid for pid in pids if _alive(pid)] == []
    # Started again on the same state folder (etcd kept the detached demo's TrainJobs): a fresh demo, never the
    # last run's finished one.
    try:
        again = _tjpipe("up", "--demo", "--detach", cwd=tmp_path, env=env)
        assert again.returncode == 0, again.stdout + again.stderr
        for name in ("mnist", "deepspeed"):
            assert f"removed the last run's TrainJob tjpipe-demo/{name} and what it owned" in again.stderr
        assert _demo_uid(state) != first_uid
        _check_demo_completes(state)
    finally:
        down = _tjpipe("down", cwd=tmp_path, env=env, timeout=120)
    assert down.returncode == 0, down.stderr


def _demo_uid(state: Path) -> str:
    from kubernetes import dynamic

    from tjpipe.local.kubeapi import new_api_client

    client = dynamic.DynamicClient(new_api_client(state / "kubeconfig"))
    trainjobs = client.resources.get(api_version="trainer.kubeflow.org/v1alpha1", kind="TrainJob")
    return str(trainjobs.get(namespace="tjpipe-demo", name="mnist").metadata.uid)


def test_up_one_process_runs_the_three_stages_as_one_controller_each_with_its_own_identity(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("NATS_URL", "KUBECONFIG")}
    state = tmp_path / ".tjpipe"
    pids: list[int] = []
    try:
        up = _tjpipe("up", "--demo", "--detach", "--control-plane-only", "--one-process", cwd=tmp_path, env=env)
        assert up.returncode == 0, up.stdout + up.stderr
        pid_files = sorted((state / "logs").glob("*.pid"))
        pids = [int(p.read_text().split()[0]) for p in pid_files]
        assert [p.stem for p in pid_files] == [
            "controller",
            "etcd",
            "history-server",
            "kube-apiserver",
            "nats",
            "status-server",
            "webhook",
        ]
        controller = _environ(pids[0])
        creds, keys = state / "creds", state / "keys"
        for stage in ("watcher", "planner", "applier"):
            assert controller[f"TJPIPE_{stage.upper()}_NATS_CREDS"] == str(creds / f"{stage}.nk")
        assert "NATS_CREDS" not in controller  # no single identity, and never the admin's
        assert not [v for v in controller.values() if v.endswith("admin.nk")]
        assert controller["TJPIPE_WATCHER_SIGNING_KEY"].startswith(str(keys / "watcher"))
        assert controller["TJPIPE_PLANNER_SIGNING_KEY"].startswith(str(keys / "planner"))
        assert "TJPIPE_SIGNING_KEY" not in controller
        _check_demo_jobset(state, log="controller")
    finally:
        down = _tjpipe("down", cwd=tmp_path, env=env, timeout=120)
    assert down.returncode == 0, down.stderr
    assert not list((state / "logs").glob("*.pid"))
    assert [pid for pid in pids if _alive(pid)] == []


def _check_demo_jobset(state: Path, *, log: str = "applier") -> None:
    from kubernetes import dynamic

    from tjpipe.local.kubeapi import new_api_client

    client = dynamic.DynamicClient(new_api_client(state / "kubeconfig"))
    jobsets = client.resources.get(api_version="jobset.x-k8s.io/v1alpha2", kind="JobSet")
    deadline = time.monotonic() + 60
    jobset = None
    while time.monotonic() < deadline and jobset is None:
        try:
            jobset = jobsets.get(namespace="tjpipe-demo", name="mnist").to_dict()
        except Exception:
            time.sleep(0.3)
    assert jobset is not None, (state / "logs" / f"{log}.log").read_text()[-2000:]
    node = jobset["spec"]["replicatedJobs"][0]
    assert node["template"]["spec"]["parallelism"] == 4
    container = node["template"]["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert {"name": "PET_NPROC_PER_NODE", "value": "auto"} in container["env"]
    log_lines = (state / "logs" / f"{log}.log").read_text().splitlines()
    records = [json.loads(line) for line in log_lines if line.startswith("{")]
    assert any(r.get("action") == "created" and r.get("trainjob") == "tjpipe-demo/mnist" for r in records)


def _registrations(state: Path) -> dict[str, str]:
    """kind/name -> process of every object the stack registered for one of its processes."""
    from kubernetes.client import AdmissionregistrationV1Api, CoreV1Api, StorageV1Api

    from tjpipe.local.kubeapi import new_api_client
    from tjpipe.local.registrations import REGISTERED_FOR

    found: dict[str, str] = {}
    with new_api_client(state / "kubeconfig") as api:
        admission = AdmissionregistrationV1Api(api)
        listings = {
            "MutatingWebhookConfiguration": admission.list_mutating_webhook_configuration(
                label_selector=REGISTERED_FOR
            ),
            "ValidatingWebhookConfiguration": admission.list_validating_webhook_configuration(
                label_selector=REGISTERED_FOR
            ),
            "StorageClass": StorageV1Api(api).list_storage_class(label_selector=REGISTERED_FOR),
            "Node": CoreV1Api(api).list_node(label_selector=REGISTERED_FOR),
        }
        for kind, listed in listings.items():
            for item in listed.items:
                found[f"{kind}/{item.metadata.name}"] = item.metadata.labels[REGISTERED_FOR]
    return found


def _cluster_objects(state: Path) -> tuple[list[str], list[str]]:
    """The ClusterTrainingRuntimes' names, and the cache initializer's objects Trainer's install makes."""
    from kubernetes import dynamic

    from tjpipe.local.kubeapi import new_api_client

    client = dynamic.DynamicClient(new_api_client(state / "kubeconfig"))
    runtimes = client.resources.get(api_version="trainer.kubeflow.org/v1alpha1", kind="ClusterTrainingRuntime")
    cache = []
    for api_version, kind, namespace in (
        ("rbac.authorization.k8s.io/v1", "ClusterRole", None),
        ("v1", "ServiceAccount", "default"),
        ("rbac.authorization.k8s.io/v1", "RoleBinding", "default"),
    ):
        got = client.resources.get(api_version=api_version, kind=kind).get(
            name="kubeflow-trainer-cache-initializer", namespace=namespace
        )
        cache.append(f"{kind}/{got.metadata.name}")
    return sorted(r.metadata.name for r in runtimes.get().items), cache


def test_a_stack_started_again_in_another_mode_keeps_no_registration_of_what_it_no_longer_runs(tmp_path: Path) -> None:
    """A full stack, stopped, then the control plane only on the same state: JobSet's webhooks (failurePolicy
    Fail, their port dead) must be gone, or every JobSet would be refused; then ``down --purge``."""
    env = {k: v for k, v in os.environ.items() if k not in ("NATS_URL", "KUBECONFIG")}
    state = tmp_path / ".tjpipe"
    pids: list[int] = []
    try:
        full = _tjpipe("up", "--detach", cwd=tmp_path, env=env)
        assert full.returncode == 0, full.stdout + full.stderr
        pids = [int(p.read_text().split()[0]) for p in (state / "logs").glob("*.pid")]
        registered = _registrations(state)
        assert sorted(set(registered.values())) == ["jobset-manager", "kube-controller-manager", "kwok", "webhook"]
        assert registered["MutatingWebhookConfiguration/tjpipe-jobset-mutating-webhook-configuration"] == (
            "jobset-manager"
        )
        assert registered["StorageClass/standard"] == "kube-controller-manager"
        assert sorted(k for k, v in registered.items() if v == "kwok") == [f"Node/sim-node-{i}" for i in range(4)]
        # Trainer's shipped runtimes without --demo, and what its install adds for the cache initializer.
        runtimes, cache = _cluster_objects(state)
        assert len(runtimes) == 9 and "torchtune-llama3.2-1b" in runtimes and "torch-distributed-with-cache" in runtimes
        assert cache == ["ClusterRole/kubeflow-trainer-cache-initializer"] + [
            f"{kind}/kubeflow-trainer-cache-initializer" for kind in ("ServiceAccount", "RoleBinding")
        ]
        down = _tjpipe("down", cwd=tmp_path, env=env, timeout=120)
        assert down.returncode == 0, down.stderr

        again = _tjpipe("up", "--detach", "--control-plane-only", "--demo", cwd=tmp_path, env=env)
        assert again.returncode == 0, again.stdout + again.stderr
        pids = [int(p.read_text().split()[0]) for p in (state / "logs").glob("*.pid")]
        text = " ".join(again.stderr.split())
        assert "removed what processes not running now had registered:" in text
        assert "validating_webhook_configuration/tjpipe-jobset-validating-webhook-configuration" in text
        assert _registrations(state) == {
            "ValidatingWebhookConfiguration/tjpipe-validator.trainer.kubeflow.org": "webhook"
        }
        _check_demo_jobset(state)  # JobSet's stale webhooks would have refused it (HTTP 500)
    finally:
        purge = _tjpipe("down", "--purge", cwd=tmp_path, env=env, timeout=120)
    assert purge.returncode == 0, purge.stderr
    assert f"deleted the state folder {state}" in purge.stdout
    assert not state.exists()
    assert [pid for pid in pids if _alive(pid)] == []


DECOY_SERVER = "https://192.0.2.1:6443"  # TEST-NET-1: routed nowhere


def _decoy_env(tmp_path: Path) -> dict[str, str]:
    """The environment of a user whose shell points at a real cluster and a real NATS server."""
    decoy = tmp_path / "decoy-kubeconfig"
    decoy.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "prod", "cluster": {"server": DECOY_SERVER}}],
                "users": [{"name": "me", "user": {"token": "decoy-token"}}],
                "contexts": [{"name": "prod-admin", "context": {"cluster": "prod", "user": "me"}}],
                "current-context": "prod-admin",
            }
        )
    )
    env = dict(os.environ)
    env.update(
        KUBECONFIG=str(decoy),
        NATS_URL="nats://127.0.0.1:1",
        NATS_TLS_CA=str(tmp_path / "no-such-ca.crt"),  # the stack's own NATS has no TLS: a service using this fails
    )
    return env


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)


def test_up_ignores_an_exported_kubeconfig_and_nats_url(tmp_path: Path) -> None:
    env = _decoy_env(tmp_path)
    state = tmp_path / ".tjpipe"
    pids: list[int] = []
    try:
        up = _tjpipe("up", "--detach", cwd=tmp_path, env=env)
        assert up.returncode == 0, up.stdout + up.stderr
        assert "NATS: its own nats-server on 127.0.0.1" in up.stderr
        assert "Kubernetes: its own etcd and kube-apiserver on 127.0.0.1" in up.stderr
        assert "KUBECONFIG and NATS_URL from the environment are not used" in up.stderr
        assert DECOY_SERVER not in up.stderr and "EXISTING" not in up.stderr
        pid_files = {p.stem: int(p.read_text().split()[0]) for p in (state / "logs").glob("*.pid")}
        pids = list(pid_files.values())
        assert {"etcd", "kube-apiserver", "nats", "watcher", "planner", "applier", "webhook"} <= set(pid_files)
        own_kubeconfig = str(state / "kubeconfig")
        env_lines = (state / "env").read_text().splitlines()
        assert f"export KUBECONFIG={own_kubeconfig}" in env_lines
        (nats_line,) = [line for line in env_lines if line.startswith("export NATS_URL=")]
        own_nats = nats_line.removeprefix("export NATS_URL=")
        assert own_nats.startswith("nats://127.0.0.1:") and own_nats != env["NATS_URL"]
        # No process of the stack sees the user's servers: the services get the stack's, the servers none.
        # Each service that talks to the API server does so as its own ServiceAccount; the planner not at all.
        identities = state / "kube-identities"
        for name, pid in pid_files.items():
            child = _environ(pid)
            assert child.get("KUBECONFIG") in (None, own_kubeconfig, str(identities / f"{name}.kubeconfig")), name
            assert child.get("NATS_URL") in (None, own_nats), name
            assert "NATS_TLS_CA" not in child, name
            if name in ("watcher", "applier", "webhook"):
                assert child["KUBECONFIG"] == str(identities / f"{name}.kubeconfig"), name
            if name in ("watcher", "planner", "applier"):
                assert child["NATS_URL"] == own_nats, name
            if name == "planner":
                assert "KUBECONFIG" not in child
            if name in ("etcd", "kube-apiserver", "nats"):
                assert "KUBECONFIG" not in child and "NATS_URL" not in child, name
    finally:
        down = _tjpipe("down", cwd=tmp_path, env=env, timeout=120)
    assert down.returncode == 0, down.stderr
    assert [pid for pid in pids if _alive(pid)] == []


def test_up_use_env_names_the_existing_cluster_before_writing(tmp_path: Path) -> None:
    """Told to adopt the environment, ``up`` says which cluster and NATS it writes to before it tries."""
    env = _decoy_env(tmp_path)
    process = subprocess.Popen(
        [sys.executable, "-m", "tjpipe", "up", "--use-env", "--demo"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    seen: list[str] = []
    try:
        assert process.stderr is not None
        for line in process.stderr:
            seen.append(line)
            if "adopting the existing server(s)" in line:  # it is about to connect to the decoy NATS
                break
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)
    text = "".join(seen)
    assert "NATS: the EXISTING server(s) nats://127.0.0.1:1" in text, text
    assert f"Kubernetes: the EXISTING cluster at {DECOY_SERVER}, context 'prod-admin'" in text, text
    assert "kube-apiserver" not in text and not list((tmp_path / ".tjpipe" / "logs").glob("*.pid"))


def _check_demo_completes(state: Path) -> None:
    """On the simulated cluster the demo's pods run and succeed, so the pipeline reports the TrainJob Complete."""
    from kubernetes import dynamic

    from tjpipe.local.kubeapi import new_api_client

    client = dynamic.DynamicClient(new_api_client(state / "kubeconfig"))
    trainjobs = client.resources.get(api_version="trainer.kubeflow.org/v1alpha1", kind="TrainJob")
    deadline = time.monotonic() + 120
    status: Any = {}
    while time.monotonic() < deadline:
        status = trainjobs.get(namespace="tjpipe-demo", name="mnist").to_dict().get("status") or {}
        conditions = {c["type"]: c for c in status.get("conditions") or []}
        if conditions.get("Complete", {}).get("status") == "True":
            break
        time.sleep(0.5)
    conditions = {c["type"]: c for c in status.get("conditions") or []}
    assert conditions.get("Complete", {}).get("reason") == "AllJobsCompleted", status
    assert status.get("jobsStatus") == [
        {"name": "node", "active": 0, "ready": 0, "succeeded": 1, "failed": 0, "suspended": 0}
    ], status


def test_up_demo_runs_to_complete_shows_the_cascade_and_ctrl_c_leaves_no_process(tmp_path: Path) -> None:
    """What `bash scripts/up.sh` shows a new user, in the foreground, then Ctrl-C."""
    env = {k: v for k, v in os.environ.items() if k not in ("NATS_URL", "KUBECONFIG")}
    env["PYTHONUNBUFFERED"] = "1"
    output = tmp_path / "up.out"
    with output.open("w") as sink:
        up = subprocess.Popen(
            [sys.executable, "-m", "tjpipe", "up", "--demo", "--pod-run-seconds", "2"],
            cwd=tmp_path,
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    pids: list[int] = []
    try:
        deadline = time.monotonic() + 300
        while "demo finished" not in output.read_text():
            assert up.poll() is None and time.monotonic() < deadline, output.read_text()[-4000:]
            time.sleep(0.5)
        pids = [int(p.read_text().split()[0]) for p in (tmp_path / ".tjpipe" / "logs").glob("*.pid")]
        assert len(pids) == 13  # the simulated cluster, the services, the webhook, history and status servers
    finally:
        up.send_signal(signal.SIGINT)
        try:
            up.wait(timeout=120)
        except subprocess.TimeoutExpired:
            _kill_stack(up, tmp_path / ".tjpipe" / "logs")  # never leave a stack running under the rest of the suite
            raise
    text = " ".join(output.read_text().split())  # rich wraps long lines
    assert "condition Complete=True reason=AllJobsCompleted: jobset completed successfully" in text
    assert "jobsStatus node: active=0 ready=0 succeeded=1 failed=0 suspended=0" in text
    for removed in ("JobSet/mnist", "ConfigMap/mnist-runtime-snapshot", "Job/mnist-node-0", "Pod/mnist-node-0-0-"):
        assert f"removed by the garbage collector: {removed}" in text
    # The MPI demo TrainJob (deepspeed-distributed) also owns a hostfile ConfigMap and an SSH-key Secret.
    assert "jobsStatus launcher: active=0 ready=0 succeeded=1 failed=0 suspended=0" in text
    for removed in ("JobSet/deepspeed", "ConfigMap/deepspeed-mpi-hostfile", "Secret/deepspeed-mpi-ssh-auth"):
        assert f"removed by the garbage collector: {removed}" in text
    assert "TrainJob tjpipe-demo/deepspeed and everything it owned are gone" in text
    assert "stopped; no process left running" in text
    assert up.returncode == 0
    assert [pid for pid in pids if _alive(pid)] == []
    assert not list((tmp_path / ".tjpipe" / "logs").glob("*.pid"))


def _kill_stack(up: subprocess.Popen[bytes], logs: Path) -> None:
    for pid_file in logs.glob("*.pid"):
        with contextlib.suppress(ValueError, ProcessLookupError):
            os.kill(int(pid_file.read_text().split()[0]), signal.SIGKILL)
    up.kill()
    up.wait(timeout=30)
