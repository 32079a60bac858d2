"""``tjpipe up --real-node``: one real Kubernetes node, and the demo's training code reporting from its pod.

What a user runs (``bash scripts/node-images.sh``, then ``tjpipe up --real-node --demo --detach``), in a fresh
working directory: the node registers with the kubelet of the apiserver's release, the demo TrainJob's pod runs
the training image under containerd and runc with an address on the node's bridge, the training script reports
its progress with the Kubeflow SDK from inside the container (only what Trainer's plugin gave the pod), and that
progress lands in ``status.trainerStatus``; ``tjpipe down`` then leaves no process, container or bridge behind.

Where the machine cannot run a node (not root, no Docker engine for the images, a missing command) the test
skips with the reason, and fails where ``CI=true`` (``tests/needs.py``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client import CoreV1Api, CustomObjectsApi

from tjpipe.local import realnode, toolchain
from tjpipe.local.kubeapi import new_api_client

pytestmark = [pytest.mark.cluster, pytest.mark.nats, pytest.mark.timeout(2400)]


def _tjpipe(*args: str, cwd: Path, timeout: float = 1200) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("NATS_URL", "KUBECONFIG")}
    return subprocess.run(
        [sys.executable, "-m", "tjpipe", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def test_a_trainjob_runs_on_the_real_node_and_reports_its_progress_from_the_pod(
    node_images: None, tmp_path: Path
) -> None:
    toolchain.ensure_node_binaries(progress=print)
    state = tmp_path / ".tjpipe"
    try:
        up = _tjpipe("up", "--real-node", "--demo", "--detach", cwd=tmp_path)
        assert up.returncode == 0, up.stdout[-4000:] + up.stderr[-4000:]
        assert f"real node {realnode.NODE_NAME} Ready" in up.stderr
        with new_api_client(state / "kubeconfig") as api:
            core = CoreV1Api(api)
            node: Any = core.read_node(realnode.NODE_NAME)
            assert node.status.node_info.kubelet_version == f"v{toolchain.KUBERNETES_VERSION}"
            assert node.status.node_info.container_runtime_version == f"containerd://{toolchain.CONTAINERD_VERSION}"
            assert [a.address for a in node.status.addresses if a.type == "InternalIP"] == [realnode.NODE_IP]
            # The apiserver advertises the bridge's address: the `kubernetes` Service leads pods there.
            endpoints: Any = core.read_namespaced_endpoints("kubernetes", "default")
            assert [a.ip for s in endpoints.subsets for a in s.addresses] == [realnode.NODE_IP], endpoints
            status = _wait_for_complete(CustomObjectsApi(api), timeout=600)
            progress = status.get("trainerStatus") or {}
            # Written by the pod's last report: the script retries until its 100 % goes out.
            assert progress.get("progressPercentage") == 100, status
            metrics = {m["name"]: m["value"] for m in progress.get("metrics") or []}
            assert float(metrics["loss"]) < 0.05 and metrics["step"] == "12", progress
            pods: Any = core.list_namespaced_pod("tjpipe-demo", label_selector="jobset.sigs.k8s.io/jobset-name=mnist")
            assert len(pods.items) == 1
            pod = pods.items[0]
            assert pod.status.phase == "Succeeded"
            assert pod.spec.node_name == realnode.NODE_NAME
            assert pod.status.pod_ip.startswith(realnode.NODE_IP.rsplit(".", 1)[0] + ".")
            (container,) = pod.status.container_statuses
            assert container.container_id.startswith("containerd://")
            assert container.image == realnode.TRAINING_IMAGE or container.image.endswith(realnode.TRAINING_IMAGE)
            # The logs come from the kubelet, through the apiserver (its client certificate).
            logs = core.read_namespaced_pod_log(pod.metadata.name, "tjpipe-demo")
            assert "progress reports: True" in logs, logs
            assert "step 12/12" in logs and "done: loss" in logs, logs
            _check_a_service_by_its_dns_name(core)
        _check_the_history_shows_the_pods_progress(up.stderr + up.stdout, pod_name=pod.metadata.name)
        _check_the_pods_log_is_kept_after_the_trainjob_is_gone(
            up.stderr + up.stdout, pod_name=pod.metadata.name, kubeconfig=state / "kubeconfig"
        )
    finally:
        down = _tjpipe("down", cwd=tmp_path, timeout=300)
    assert down.returncode == 0, down.stderr
    leftovers = subprocess.run(["ip", "link", "show", realnode.BRIDGE], capture_output=True, check=False)
    assert leftovers.returncode != 0, "the node's bridge is still there after tjpipe down"
    assert not list((state / "logs").glob("*.pid"))
    # No runc shim of this node's containerd is left waiting (the echo pod was still running at down).
    socket = str(realnode.containerd_socket(state / "kube" / "node"))
    shims = subprocess.run(["pgrep", "-f", f"containerd-shim-runc-v2 .*{socket}"], capture_output=True, text=True)
    assert shims.stdout.split() == [], "runc shims left after tjpipe down"
    # Nothing mounted or kept outside the state folder (the kubelet's root, containerd's socket folder).
    assert [p for p in realnode.host_dirs(state / "kube" / "node") if p.exists()] == []


def _wait_for_complete(custom: CustomObjectsApi, *, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    status: dict[str, Any] = {}
    while time.monotonic() < deadline:
        trainjob: Any = custom.get_namespaced_custom_object(
            "trainer.kubeflow.org", "v1alpha1", "tjpipe-demo", "trainjobs", "mnist"
        )
        status = trainjob.get("status") or {}
        conditions = {c["type"]: c["status"] for c in status.get("conditions") or []}
        if conditions.get("Complete") == "True" or conditions.get("Failed") == "True":
            break
        time.sleep(1)
    conditions = {c["type"]: c for c in status.get("conditions") or []}
    assert conditions.get("Complete", {}).get("status") == "True", status
    return status


_SERVER = "import http.server as h; h.ThreadingHTTPServer(('', 8080), h.SimpleHTTPRequestHandler).serve_forever()"
_CLIENT = """
import json, os, socket, ssl, urllib.request
print("service address", socket.gethostbyname("echo.tjpipe-demo.svc.cluster.local"))
with urllib.request.urlopen("http://echo.tjpipe-demo.svc.cluster.local:8080/", timeout=20) as answer:
    print("status", answer.status)
account = "/var/run/secrets/kubernetes.io/serviceaccount"
token = open(account + "/token").read()
tls = ssl.create_default_context(cafile=account + "/ca.crt")
for host in ("kubernetes.default.svc", os.environ["KUBERNETES_SERVICE_HOST"]):
    request = urllib.request.Request(f"https://{host}/version", headers={"Authorization": "Bearer " + token})
    with urllib.request.urlopen(request, timeout=20, context=tls) as answer:
        print("apiserver at", host, json.load(answer)["gitVersion"])
try:
    socket.gethostbyname("example.com")
    print("outside name: resolved")
except socket.gaierror:
    print("outside name: not resolved")
"""


def _check_a_service_by_its_dns_name(core: CoreV1Api) -> None:
    """A pod reaches another through a Service's name: CoreDNS answers it, kube-proxy's rules lead to the pod;
    a name outside the cluster resolves to nothing (CoreDNS has no upstream: no query leaves the machine). The
    pod reaches the apiserver as every in-cluster client does: the ``kubernetes`` Service, by name and by the
    address the kubelet puts in its environment, with its ServiceAccount's token, verifying the certificate."""
    image = realnode.TRAINING_IMAGE
    core.create_namespaced_pod(
        "tjpipe-demo",
        {
            "metadata": {"name": "echo", "labels": {"app": "echo"}},
            "spec": {"containers": [{"name": "server", "image": image, "command": ["python3", "-c", _SERVER]}]},
        },
    )
    core.create_namespaced_service(
        "tjpipe-demo", {"metadata": {"name": "echo"}, "spec": {"selector": {"app": "echo"}, "ports": [{"port": 8080}]}}
    )
    _wait_for_phase(core, "echo", {"Running"})
    core.create_namespaced_pod(
        "tjpipe-demo",
        {
            "metadata": {"name": "client"},
            "spec": {
                "restartPolicy": "Never",
                "containers": [{"name": "client", "image": image, "command": ["python3", "-c", _CLIENT]}],
            },
        },
    )
    phase = _wait_for_phase(core, "client", {"Succeeded", "Failed"})
    logs = core.read_namespaced_pod_log("client", "tjpipe-demo")
    assert phase == "Succeeded", logs
    service: Any = core.read_namespaced_service("echo", "tjpipe-demo")
    assert f"service address {service.spec.cluster_ip}" in logs, logs
    assert "status 200" in logs and "outside name: not resolved" in logs, logs
    kubernetes: Any = core.read_namespaced_service("kubernetes", "default")
    for host in ("kubernetes.default.svc", kubernetes.spec.cluster_ip):
        assert f"apiserver at {host} v{toolchain.KUBERNETES_VERSION}" in logs, logs


def _wait_for_phase(core: CoreV1Api, name: str, phases: set[str], *, timeout: float = 180) -> str:
    deadline = time.monotonic() + timeout
    phase = ""
    while time.monotonic() < deadline:
        pod: Any = core.read_namespaced_pod(name, "tjpipe-demo")
        phase = pod.status.phase or ""
        if phase in phases:
            return phase
        time.sleep(1)
    raise AssertionError(f"pod {name} is {phase or 'Pending'} after {timeout:.0f}s, not {' or '.join(sorted(phases))}")


def _check_the_history_shows_the_pods_progress(output: str, *, pod_name: str) -> None:
    """The history server's progress series of the demo TrainJob: every report came from the training pod."""
    import json
    import re
    import urllib.request

    url = re.search(r"history UI:\s+(http://127\.0\.0\.1:\d+)", output)
    token = re.search(r"log in with the stack's admin token: (\S+)", output)
    assert url and token, output[-2000:]
    request = urllib.request.Request(
        f"{url.group(1)}/api/v1/namespaces/tjpipe-demo/trainjobs/mnist/progress",
        headers={"Authorization": f"Bearer {token.group(1)}"},
    )
    deadline = time.monotonic() + 60
    while True:
        with urllib.request.urlopen(request, timeout=20) as answer:
            series = json.load(answer)
        points = series["points"]
        if (points and points[-1]["progressPercentage"] == 100) or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert series["pods"] == [pod_name], series
    assert len(points) >= 2 and points[-1]["progressPercentage"] == 100, points
    assert "loss" in series["metrics"], series


def _check_the_pods_log_is_kept_after_the_trainjob_is_gone(output: str, *, pod_name: str, kubeconfig: Path) -> None:
    """The history server kept the training pod's log when the TrainJob finished (read from the kubelet, through
    the apiserver, as the server's own ServiceAccount), and still shows it once the TrainJob and its pod are
    deleted."""
    import json
    import re
    import urllib.request

    url = re.search(r"history UI:\s+(http://127\.0\.0\.1:\d+)", output)
    token = re.search(r"log in with the stack's admin token: (\S+)", output)
    assert url and token, output[-2000:]
    job = f"{url.group(1)}/api/v1/namespaces/tjpipe-demo/trainjobs/mnist"

    def read(path: str) -> Any:
        request = urllib.request.Request(job + path, headers={"Authorization": f"Bearer {token.group(1)}"})
        with urllib.request.urlopen(request, timeout=20) as answer:
            return json.load(answer)

    def kept_log() -> list[str]:
        answer = read("/logs")
        kept = answer["kept"]
        assert kept is not None and kept["reason"] == "finished", answer
        assert [(p["pod"], p["container"]) for p in kept["pieces"]] == [(pod_name, "node")], kept
        assert kept["missing"] == [] and kept["noContainers"] is False, kept
        lines: list[str] = read(f"/logs/{pod_name}/node?tail=50")["lines"]
        return lines

    deadline = time.monotonic() + 60
    while read("/logs")["kept"] is None and time.monotonic() < deadline:
        time.sleep(1)
    lines = kept_log()
    assert any("step 12/12" in line for line in lines) and any("done: loss" in line for line in lines), lines
    with new_api_client(kubeconfig) as api:
        CustomObjectsApi(api).delete_namespaced_custom_object(
            "trainer.kubeflow.org", "v1alpha1", "tjpipe-demo", "trainjobs", "mnist"
        )
        core = CoreV1Api(api)
        selector = "jobset.sigs.k8s.io/jobset-name=mnist"
        deadline = time.monotonic() + 90
        while core.list_namespaced_pod("tjpipe-demo", label_selector=selector).items and time.monotonic() < deadline:
            time.sleep(1)
        assert not core.list_namespaced_pod("tjpipe-demo", label_selector=selector).items, "the pod is still there"
    deadline = time.monotonic() + 30
    while read("/logs")["trainjob"]["state"] != "Deleted" and time.monotonic() < deadline:
        time.sleep(1)
    assert read("/logs")["trainjob"]["state"] == "Deleted"
    assert kept_log() == lines
