"""The local infrastructure against real servers: nats-server, etcd and kube-apiserver, no mocks."""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Any

import nats
import pytest
from kubernetes import client as kube_client

from tjpipe.local.crds import apply_objects, crd_manifests, shipped_runtimes
from tjpipe.local.natsd import start_nats
from tjpipe.local.procs import ManagedProcess, spawn, stop_from_pid_files, wait_until
from tjpipe.local.toolchain import KUBERNETES_VERSION, ToolchainMissing, cache_root, ensure_kube_binaries

if TYPE_CHECKING:
    from conftest import KubeCluster

EXPECTED_CRDS = (
    "trainjobs.trainer.kubeflow.org",
    "trainingruntimes.trainer.kubeflow.org",
    "clustertrainingruntimes.trainer.kubeflow.org",
    "jobsets.jobset.x-k8s.io",
    "podgroups.scheduling.x-k8s.io",
    "podgroups.scheduling.volcano.sh",
)
EXPECTED_RUNTIMES = (
    "torch-distributed",
    "deepspeed-distributed",
    "mlx-distributed",
    "jax-distributed",
    "xgboost-distributed",
    "torchtune-llama3.2-1b",
    "torchtune-llama3.2-3b",
    "torchtune-qwen2.5-1.5b",
)


# --- NATS -----------------------------------------------------------------------------------------------


@pytest.mark.nats
async def test_jetstream_stream_accepts_publishes(nats_connect: Any) -> None:
    stream = f"INFRA_{secrets.token_hex(4).upper()}"
    connection = await nats_connect()
    try:
        jetstream = connection.jetstream()
        await jetstream.add_stream(name=stream, subjects=[f"{stream.lower()}.>"])
        acks = [await jetstream.publish(f"{stream.lower()}.event", f"m{i}".encode()) for i in range(3)]
        assert [ack.seq for ack in acks] == [1, 2, 3]
        info = await jetstream.stream_info(stream)
        assert info.state.messages == 3
        assert (await jetstream.get_msg(stream, seq=2)).data == b"m1"
        await jetstream.delete_stream(stream)
    finally:
        await connection.close()


@pytest.mark.nats
async def test_restarted_nats_keeps_stream_messages(tmp_path: Path) -> None:
    store_dir, log_dir = tmp_path / "store", tmp_path / "logs"
    first = start_nats(store_dir=store_dir, log_dir=log_dir, name="nats-restart")
    try:
        connection = await nats.connect(first.url)
        jetstream = connection.jetstream()
        await jetstream.add_stream(name="DURABLE", subjects=["durable.>"])
        for index in range(5):
            await jetstream.publish("durable.event", f"payload-{index}".encode())
        await connection.close()
    finally:
        first.stop()

    second = start_nats(store_dir=store_dir, log_dir=log_dir, name="nats-restart", port=first.port)
    try:
        assert second.url == first.url
        connection = await nats.connect(second.url)
        jetstream = connection.jetstream()
        info = await jetstream.stream_info("DURABLE")
        assert (info.state.messages, info.state.first_seq, info.state.last_seq) == (5, 1, 5)
        assert (await jetstream.get_msg("DURABLE", seq=5)).data == b"payload-4"
        await connection.close()
    finally:
        second.stop()


# --- Kubernetes API ---------------------------------------------------------------------------------------


@pytest.mark.cluster
def test_apiserver_reports_pinned_version(kube: KubeCluster) -> None:
    if kube.local is None:
        pytest.skip("KUBECONFIG points at an external cluster; its version is not ours to pin")
    with kube.api_client() as api_client:
        version = kube_client.VersionApi(api_client).get_code()
    assert version.git_version == f"v{KUBERNETES_VERSION}"


@pytest.mark.cluster
def test_project_crds_are_established(kube: KubeCluster) -> None:
    assert sorted(manifest["metadata"]["name"] for manifest in crd_manifests()) == sorted(EXPECTED_CRDS)
    with kube.api_client() as api_client:
        extensions = kube_client.ApiextensionsV1Api(api_client)
        for name in EXPECTED_CRDS:
            status = extensions.read_custom_resource_definition(name).status
            assert status is not None and status.conditions, name
            conditions = {condition.type: condition.status for condition in status.conditions}
            assert conditions.get("Established") == "True", (name, conditions)


@pytest.mark.cluster
def test_server_side_apply_of_a_shipped_runtime(kube: KubeCluster) -> None:
    runtime = shipped_runtimes()["torch-distributed"]
    runtime["metadata"]["name"] = f"torch-distributed-{secrets.token_hex(3)}"
    manager = "tjpipe-infra-test"
    with kube.api_client() as api_client:
        custom = kube_client.CustomObjectsApi(api_client)
        apply_objects(api_client, [runtime], field_manager=manager)
        stored = _as_dict(
            custom.get_cluster_custom_object(
                "trainer.kubeflow.org", "v1alpha1", "clustertrainingruntimes", runtime["metadata"]["name"]
            )
        )
        assert stored["spec"]["mlPolicy"]["numNodes"] == 1
        assert stored["metadata"]["labels"]["trainer.kubeflow.org/webhook-validation"] == "disabled"
        ours = [entry for entry in stored["metadata"]["managedFields"] if entry["manager"] == manager]
        assert [entry["operation"] for entry in ours] == ["Apply"]

        # Applying the same intent again is a no-op on the server.
        apply_objects(api_client, [runtime], field_manager=manager)
        again = _as_dict(
            custom.get_cluster_custom_object(
                "trainer.kubeflow.org", "v1alpha1", "clustertrainingruntimes", runtime["metadata"]["name"]
            )
        )
        assert again["metadata"]["resourceVersion"] == stored["metadata"]["resourceVersion"]


@pytest.mark.cluster
def test_namespace_fixture_creates_a_namespace(kube: KubeCluster, namespace: str) -> None:
    with kube.api_client() as api_client:
        created = kube_client.CoreV1Api(api_client).read_namespace(namespace)
    assert created.status is not None and created.status.phase == "Active"


def _as_dict(value: object) -> dict[str, Any]:
    assert isinstance(value, dict)
    return value


# --- manifests from Go modules ----------------------------------------------------------------------------


def test_shipped_runtimes_as_the_runtimes_overlay_renders_them() -> None:
    runtimes = shipped_runtimes()
    assert set(EXPECTED_RUNTIMES) <= set(runtimes)
    assert "torch-distributed-with-cache" in runtimes
    for name, runtime in runtimes.items():
        assert runtime["kind"] == "ClusterTrainingRuntime"
        assert runtime["metadata"]["labels"]["trainer.kubeflow.org/webhook-validation"] == "disabled", name
        images = re.findall(r'"image": "([^"]+)"', json.dumps(runtime))
        assert images, name
        for image in images:
            if image.startswith("ghcr.io/kubeflow/trainer/"):
                assert image.endswith(":v2.3.0"), (name, image)
    torchtune_images = re.findall(r'"image": "([^"]+)"', json.dumps(runtimes["torchtune-llama3.2-1b"]))
    assert "ghcr.io/kubeflow/trainer/torchtune-trainer:v2.3.0" in torchtune_images


# --- processes ----------------------------------------------------------------------------------------


def _group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes in a process group, from /proc."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if fields[0] != "Z" and int(fields[2]) == pgid:
            members.append(int(entry.name))
    return members


def _is_alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def _spawn_sleepers(log_dir: Path, *, name: str, ignore_term: bool = False) -> ManagedProcess:
    trap = 'trap "" TERM; ' if ignore_term else ""
    process = spawn(name=name, argv=["sh", "-c", f"{trap}sleep 100 & sleep 100 & echo started; wait"], log_dir=log_dir)
    wait_until(lambda: len(_group_members(process.pid)) == 3, timeout=5, what="sleepers", process=process)
    return process


def test_stop_from_pid_files_stops_the_whole_group(tmp_path: Path) -> None:
    process = _spawn_sleepers(tmp_path, name="sleepers")
    members = _group_members(process.pid)
    assert (tmp_path / "sleepers.pid").exists()

    assert stop_from_pid_files(tmp_path, timeout=5) == ["sleepers"]

    process.popen.wait(timeout=5)
    assert _group_members(process.pid) == []
    assert [pid for pid in members if _is_alive(pid)] == []
    assert not (tmp_path / "sleepers.pid").exists()


def test_stop_from_pid_files_spares_a_recycled_pid(tmp_path: Path) -> None:
    bystander = spawn(name="bystander", argv=["sleep", "100"], log_dir=tmp_path)
    try:
        # Same pid, different start time: what a pid file looks like after the pid was reused.
        pid, start_time = (tmp_path / "bystander.pid").read_text().split()
        (tmp_path / "bystander.pid").write_text(f"{pid} {int(start_time) + 1}\n")

        assert stop_from_pid_files(tmp_path, timeout=1) == []

        assert bystander.is_running()
        assert not (tmp_path / "bystander.pid").exists()
    finally:
        bystander.stop()


@pytest.mark.parametrize("ignore_term", [False, True], ids=["terminates", "ignores-sigterm"])
def test_managed_process_stop_leaves_no_child_behind(tmp_path: Path, ignore_term: bool) -> None:
    process = _spawn_sleepers(tmp_path, name="group", ignore_term=ignore_term)
    children = [pid for pid in _group_members(process.pid) if pid != process.pid]
    assert len(children) == 2

    process.stop(timeout=1)

    assert not process.is_running()
    assert _group_members(process.pid) == []
    assert [pid for pid in children if _is_alive(pid)] == []
    assert not (tmp_path / "group.pid").exists()
    expected_signal = signal.SIGKILL if ignore_term else signal.SIGTERM
    assert process.popen.returncode == -expected_signal
    process.stop()  # idempotent


def test_wait_until_reports_a_dead_process_with_its_log(tmp_path: Path) -> None:
    process = spawn(name="crasher", argv=["sh", "-c", "echo boom-from-child; exit 3"], log_dir=tmp_path)
    with pytest.raises(RuntimeError, match="boom-from-child") as raised:
        wait_until(lambda: False, timeout=10, what="something that never happens", process=process)
    assert "exited with code 3" in str(raised.value)
    with pytest.raises(TimeoutError, match="the impossible"):
        wait_until(lambda: False, timeout=0.2, what="the impossible")
    process.stop()


# --- toolchain --------------------------------------------------------------------------------------------


def test_missing_go_and_binaries_raise_one_clear_sentence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TJPIPE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty-path"))
    assert cache_root() == tmp_path / "cache"
    with pytest.raises(ToolchainMissing) as raised:
        ensure_kube_binaries(progress=lambda line: None)
    message = str(raised.value)
    assert message.startswith("kube-apiserver and etcd are not built yet and no Go toolchain was found")
    assert "tjpipe up --kubeconfig PATH" in message and message.count(". ") == 0 and message.endswith(".")
    assert os.environ["PATH"] == str(tmp_path / "empty-path")
