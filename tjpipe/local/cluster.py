"""A whole simulated cluster on loopback: the local control plane plus the controllers that make work run.

Why: the apiserver alone (``kubeapi``) stores a TrainJob's JobSet and stops there. Nothing makes Jobs or
Pods, so the status path (Running, Complete, Failed, jobsStatus), the deadline path, garbage collection of
owned objects and JobSet's own admission rules never run. This module adds, each built from its own Go
module at a pinned version (``toolchain.ensure_cluster_binaries``, ``toolchain.ensure_jobset_manager``):

* kube-controller-manager (the apiserver's release): Jobs make Pods, the garbage collector deletes what a
  deleted owner owned, namespaces finish terminating, service accounts get tokens, and its volume
  controller provisions and binds storage (below);
* kube-scheduler (same release): pods are bound to nodes that fit their cpu, memory and GPU requests;
* JobSet's manager with its webhooks (``jobset_controller``): JobSets make Jobs and report status;
* kwok: nodes that exist only as API objects, and pod lifecycles played by rules (kwok "Stages") instead
  of a kubelet. No container ever runs: a bound pod becomes Running at once and, when it belongs to a Job,
  Succeeded after a run time (``pod_run_seconds``, or the pod annotation ``RUN_TIME_ANNOTATION``), or
  Failed instead when the pod carries ``FAIL_ANNOTATION: "true"``. A pod being deleted is marked Failed
  (what a kubelet does after killing its containers), so the Job controller can account for it and
  release its finalizer, and is then removed.

Why storage at all, when nothing mounts it: a pod whose PersistentVolumeClaim is unbound is never
scheduled, and three of Trainer's shipped runtimes (torchtune) claim a volume through JobSet's
``volumeClaimPolicies``. The default StorageClass ``STORAGE_CLASS`` names kube-controller-manager's own
host-path provisioner (``--enable-hostpath-provisioner``, the in-tree plugin upstream keeps for
single-machine clusters): the real PV controller provisions one PersistentVolume per claim (an empty
folder under ``/tmp/hostpath_pv/``), binds it, and deletes volume and folder once the claim is gone.
JobSet owns the claims it makes unless their policy says ``Retain``, so the garbage collector removes
them with their JobSet.

Why annotations on pods: a user can put them on a TrainJob's pods through ``spec.runtimePatches``
(``...replicatedJobs[].template.spec.template.metadata.annotations``), so one cluster can run passing,
failing and long-running TrainJobs side by side without reconfiguration.

Everything listens on 127.0.0.1, leader election is off (one replica each), and every process is a
``procs.ManagedProcess`` with its log and pid file in ``log_dir``, stopped by ``stop()``.
"""

from __future__ import annotations

import contextlib
import json
import ssl
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import yaml
from kubernetes.client import ApiClient, CoreV1Api
from kubernetes.client.exceptions import ApiException

from tjpipe.local.crds import apply_objects, crd_manifests, install_crds
from tjpipe.local.jobset_controller import PROCESS_NAME as JOBSET_MANAGER
from tjpipe.local.jobset_controller import LocalJobSet, start_jobset_manager
from tjpipe.local.kubeapi import LocalKube, new_api_client, start_kube
from tjpipe.local.procs import ManagedProcess, free_port, http_status, spawn, wait_until
from tjpipe.local.registrations import REGISTERED_FOR, registered_for
from tjpipe.local.toolchain import ensure_cluster_binaries

FAIL_ANNOTATION = "sim.tjpipe.local/fail"
"""Pod annotation: ``"true"`` makes the pod end Failed (container exit code 1) instead of Succeeded."""
RUN_TIME_ANNOTATION = "sim.tjpipe.local/run-time"
"""Pod annotation: how long the pod runs before it ends, as a Go duration (``"90s"``, ``"1h"``)."""
NODE_LABEL = "sim.tjpipe.local/node"
"""Label on every simulated node (value ``"true"``)."""
KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
"""kwok's own convention: it manages the nodes that carry this annotation with the value ``fake``."""
STORAGE_CLASS = "standard"
"""The default StorageClass: every claim without a class of its own is provisioned by it."""
HOST_PATH_PROVISIONER = "kubernetes.io/host-path"
"""kube-controller-manager's in-tree provisioner, on with ``--enable-hostpath-provisioner``."""
DEFAULT_CLASS_ANNOTATION = "storageclass.kubernetes.io/is-default-class"
HOST_PATH_FOLDER = "/tmp/hostpath_pv/"
"""Where kube-controller-manager's host-path provisioner makes each volume's folder (fixed in Kubernetes)."""
SETUP_FIELD_MANAGER = "tjpipe-cluster-setup"

KUBE_CONTROLLER_MANAGER, KUBE_SCHEDULER, KWOK = "kube-controller-manager", "kube-scheduler", "kwok"
PROCESSES = (KUBE_CONTROLLER_MANAGER, KUBE_SCHEDULER, JOBSET_MANAGER, KWOK)
"""The simulation's processes by name (their logs, pid files and ``registrations`` labels)."""

DEFAULT_NODES = 4
DEFAULT_POD_RUN_SECONDS = 5.0
GPU_RESOURCE = "nvidia.com/gpu"

_READY_TIMEOUT_SECONDS = 60.0
_POD_CIDR = "10.244.0.1/16"


@dataclass(frozen=True)
class NodeShape:
    """Capacity of every simulated node."""

    cpu: str = "32"
    memory: str = "256Gi"
    gpus: int = 8
    pods: int = 110


@dataclass(frozen=True)
class Simulation:
    """The controllers and simulated nodes running against one apiserver."""

    processes: tuple[ManagedProcess, ...]
    """kube-controller-manager, kube-scheduler and kwok, in start order."""
    jobset: LocalJobSet
    node_names: tuple[str, ...]

    def stop(self, timeout: float = 10) -> None:
        """Stop kwok, the scheduler and the controller manager (reverse start order), then JobSet's manager."""
        for process in reversed(self.processes):
            process.stop(timeout=timeout)
        self.jobset.stop(timeout=timeout)


@dataclass(frozen=True)
class SimulatedCluster:
    """A local apiserver (``kube``) with CRDs installed and a ``Simulation`` running on it."""

    kube: LocalKube
    simulation: Simulation

    @property
    def kubeconfig(self) -> Path:
        return self.kube.kubeconfig

    def api_client(self) -> ApiClient:
        return self.kube.api_client()

    def ensure_nodes(self, count: int, *, shape: NodeShape = NodeShape()) -> tuple[str, ...]:
        """At least ``count`` simulated nodes (``sim-node-0..count-1``), all Ready; return their names."""
        with new_api_client(self.kube.kubeconfig) as api:
            return ensure_nodes(api, count=count, shape=shape, kwok=self.simulation.processes[-1])

    def stop(self, timeout: float = 10) -> None:
        """Stop everything, and remove the empty host-path folders of the volumes still provisioned: a cluster
        started here is thrown away with its tests, and its claims with it."""
        folders = self._volume_folders()
        self.simulation.stop(timeout=timeout)
        self.kube.stop(timeout=timeout)
        for folder in folders:
            with contextlib.suppress(OSError):  # never a folder anything wrote into
                folder.rmdir()

    def _volume_folders(self) -> list[Path]:
        try:
            with new_api_client(self.kube.kubeconfig) as api:
                volumes: Any = CoreV1Api(api).list_persistent_volume()
        except Exception:  # the apiserver may be gone already; the folders then stay
            return []
        return [
            Path(volume.spec.host_path.path)
            for volume in volumes.items
            if volume.spec.host_path is not None and volume.spec.host_path.path.startswith(HOST_PATH_FOLDER)
        ]


def start_simulated_cluster(
    *,
    work_dir: Path,
    log_dir: Path,
    kubeconfig_path: Path,
    progress: Callable[[str], None],
    nodes: int = DEFAULT_NODES,
    pod_run_seconds: float = DEFAULT_POD_RUN_SECONDS,
    node_shape: NodeShape = NodeShape(),
    extra_apiserver_args: Sequence[str] = (),
) -> SimulatedCluster:
    """etcd and kube-apiserver (``start_kube``, with ``extra_apiserver_args``), the CRDs the pipeline needs, and
    ``start_simulation``."""
    kube = start_kube(
        work_dir=work_dir / "kube",
        log_dir=log_dir,
        kubeconfig_path=kubeconfig_path,
        progress=progress,
        extra_apiserver_args=extra_apiserver_args,
    )
    try:
        with new_api_client(kube.kubeconfig) as api:
            install_crds(api, crd_manifests(progress=progress))
        simulation = start_simulation(
            kube,
            work_dir=work_dir / "simulation",
            log_dir=log_dir,
            progress=progress,
            nodes=nodes,
            pod_run_seconds=pod_run_seconds,
            node_shape=node_shape,
        )
    except BaseException:
        kube.stop()
        raise
    return SimulatedCluster(kube=kube, simulation=simulation)


def _component_flags(kubeconfig: str, *, bind_address: str, port: int, cert_dir: Path | str) -> list[str]:
    """The flags kube-controller-manager and kube-scheduler share: one kubeconfig for the API and for
    delegated authn/authz, no leader election, an HTTPS health port with a self-signed cert."""
    return [
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--leader-elect=false",
        f"--bind-address={bind_address}",
        f"--secure-port={port}",
        f"--cert-dir={cert_dir}",
    ]


# The three below are what the local stack and compose run these components with (one cluster shape).
def controller_manager_flags(
    kubeconfig: str,
    *,
    bind_address: str,
    port: int,
    cert_dir: Path | str,
    service_account_key: Path | str,
    root_ca: Path | str,
) -> list[str]:
    return [
        *_component_flags(kubeconfig, bind_address=bind_address, port=port, cert_dir=cert_dir),
        f"--service-account-private-key-file={service_account_key}",
        f"--root-ca-file={root_ca}",
        "--use-service-account-credentials=false",
        # Storage for the claims JobSets make (see the module docstring and storage_class()).
        "--enable-hostpath-provisioner=true",
        # Two hundred TrainJobs finishing together is a burst of Job and Pod writes.
        "--kube-api-qps=200",
        "--kube-api-burst=400",
    ]


def scheduler_flags(kubeconfig: str, *, bind_address: str, port: int, cert_dir: Path | str) -> list[str]:
    return [
        *_component_flags(kubeconfig, bind_address=bind_address, port=port, cert_dir=cert_dir),
        "--kube-api-qps=200",
        "--kube-api-burst=400",
    ]


def kwok_flags(kubeconfig: str, *, config: Path | str, server_address: str) -> list[str]:
    return [
        f"--config={config}",
        f"--kubeconfig={kubeconfig}",
        "--manage-all-nodes=false",
        f"--manage-nodes-with-annotation-selector={KWOK_NODE_ANNOTATION}=fake",
        f"--server-address={server_address}",
        f"--cidr={_POD_CIDR}",
        "--node-lease-duration-seconds=40",
    ]


def write_kwok_config(path: Path, *, pod_run_seconds: float) -> None:
    """kwok's stages (``kwok_stages``) as the file ``--config`` names."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump_all(kwok_stages(pod_run_seconds=pod_run_seconds), sort_keys=False))


def start_simulation(
    kube: LocalKube,
    *,
    work_dir: Path,
    log_dir: Path,
    progress: Callable[[str], None],
    nodes: int = DEFAULT_NODES,
    pod_run_seconds: float = DEFAULT_POD_RUN_SECONDS,
    node_shape: NodeShape = NodeShape(),
) -> Simulation:
    """Start the controllers and ``nodes`` simulated nodes against ``kube``, whose CRDs (JobSet's at least)
    are installed; return once every node is Ready and JobSet's webhooks admit."""
    binaries = ensure_cluster_binaries(progress=progress)
    started = time.monotonic()
    work_dir.mkdir(parents=True, exist_ok=True)
    kubeconfig = str(kube.kubeconfig.resolve())
    processes: list[ManagedProcess] = []
    health: list[tuple[ManagedProcess, str, ssl.SSLContext | None]] = []
    jobset: LocalJobSet | None = None
    try:
        port = free_port()
        kcm = spawn(
            name=KUBE_CONTROLLER_MANAGER,
            argv=[
                str(binaries.kube_controller_manager),
                *controller_manager_flags(
                    kubeconfig,
                    bind_address="127.0.0.1",
                    port=port,
                    cert_dir=work_dir / "kube-controller-manager",
                    service_account_key=kube.service_account_private_key,
                    root_ca=kube.ca_file,
                ),
            ],
            log_dir=log_dir,
        )
        processes.append(kcm)
        health.append((kcm, f"https://127.0.0.1:{port}/healthz", _self_signed_probe()))

        port = free_port()
        scheduler = spawn(
            name=KUBE_SCHEDULER,
            argv=[
                str(binaries.kube_scheduler),
                *scheduler_flags(kubeconfig, bind_address="127.0.0.1", port=port, cert_dir=work_dir / "kube-scheduler"),
            ],
            log_dir=log_dir,
        )
        processes.append(scheduler)
        health.append((scheduler, f"https://127.0.0.1:{port}/healthz", _self_signed_probe()))

        port = free_port()
        kwok_config = work_dir / "kwok.yaml"
        write_kwok_config(kwok_config, pod_run_seconds=pod_run_seconds)
        kwok = spawn(
            name=KWOK,
            argv=[
                str(binaries.kwok),
                *kwok_flags(kubeconfig, config=kwok_config, server_address=f"127.0.0.1:{port}"),
            ],
            log_dir=log_dir,
            # kwok also reads ~/.kwok/kwok.yaml when it exists; a private home keeps a user's file out.
            env={"HOME": str(work_dir)},
        )
        processes.append(kwok)
        health.append((kwok, f"http://127.0.0.1:{port}/healthz", None))

        with new_api_client(kube.kubeconfig) as api:
            jobset = start_jobset_manager(
                api_client=api,
                kubeconfig=kube.kubeconfig,
                work_dir=work_dir / "jobset",
                log_dir=log_dir,
                progress=progress,
            )
            for process, url, tls in health:
                wait_until(
                    lambda url=url, tls=tls: http_status(url, tls=tls) == 200,  # type: ignore[misc]
                    timeout=_READY_TIMEOUT_SECONDS,
                    what=f"{process.name} {url}",
                    process=process,
                )
            apply_objects(api, [registered_for(kcm.name, storage_class())], field_manager=SETUP_FIELD_MANAGER)
            node_names = ensure_nodes(api, count=nodes, shape=node_shape, kwok=kwok)
    except BaseException:
        for process in reversed(processes):
            process.stop()
        if jobset is not None:
            jobset.stop()
        raise
    gpus = f", {node_shape.gpus} {GPU_RESOURCE}" if node_shape.gpus else ""
    simulated = (
        f"kwok with {nodes} nodes (each {node_shape.cpu} cpu, {node_shape.memory}{gpus}); "
        if nodes
        else "no simulated node; "
    )
    runs = f"pods run {pod_run_seconds:g}s, no containers" if nodes else "pods run on the nodes that join it"
    progress(
        f"simulated cluster ready in {time.monotonic() - started:.1f}s: kube-controller-manager, kube-scheduler, "
        f"JobSet manager, {simulated}default StorageClass {STORAGE_CLASS} ({HOST_PATH_PROVISIONER}); {runs}"
    )
    return Simulation(processes=tuple(processes), jobset=jobset, node_names=node_names)


def storage_class() -> dict[str, Any]:
    """The default StorageClass: kube-controller-manager provisions a host-path volume per claim at once
    (``Immediate``: the simulated nodes share one host, so no node needs choosing first) and deletes it
    with its claim."""
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {"name": STORAGE_CLASS, "annotations": {DEFAULT_CLASS_ANNOTATION: "true"}},
        "provisioner": HOST_PATH_PROVISIONER,
        "reclaimPolicy": "Delete",
        "volumeBindingMode": "Immediate",
    }


def ensure_nodes(
    api: ApiClient, *, count: int, shape: NodeShape = NodeShape(), kwok: ManagedProcess | None = None
) -> tuple[str, ...]:
    """``create_nodes``, then wait until kwok made every one of them Ready (failing early if ``kwok`` dies)."""
    names = create_nodes(api, count=count, shape=shape)
    wait_until(
        lambda: _all_ready(api, names),
        timeout=_READY_TIMEOUT_SECONDS,
        what=f"{count} simulated nodes to become Ready",
        process=kwok,
    )
    return names


def create_nodes(api: ApiClient, *, count: int, shape: NodeShape, prefix: str = "sim-node-") -> tuple[str, ...]:
    """Create (or keep) ``count`` Node objects that kwok manages; return their names."""
    core = CoreV1Api(api)
    capacity = {"cpu": shape.cpu, "memory": shape.memory, "pods": str(shape.pods)}
    if shape.gpus:
        capacity[GPU_RESOURCE] = str(shape.gpus)
    names = tuple(f"{prefix}{index}" for index in range(count))
    for name in names:
        node: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "annotations": {KWOK_NODE_ANNOTATION: "fake"},
                "labels": {
                    NODE_LABEL: "true",
                    REGISTERED_FOR: KWOK,
                    "kubernetes.io/hostname": name,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                    "type": "kwok",
                },
            },
            # A node may be created with its status; kwok keeps capacity and allocatable as found.
            "status": {"capacity": capacity, "allocatable": capacity},
        }
        try:
            core.create_node(cast(Any, node))  # the client sends a dict as it is
        except ApiException as error:
            if error.status != 409:
                raise
    return names


def _all_ready(api: ApiClient, names: tuple[str, ...]) -> bool:
    return _ready_nodes(api) >= set(names)


def nodes_ready(api: ApiClient) -> int:
    """How many simulated nodes are Ready."""
    return len(_ready_nodes(api))


def _ready_nodes(api: ApiClient) -> set[str]:
    ready = set()
    nodes: Any = CoreV1Api(api).list_node(label_selector=f"{NODE_LABEL}=true")
    for node in nodes.items:
        for condition in node.status.conditions or []:
            if condition.type == "Ready" and condition.status == "True":
                ready.add(node.metadata.name)
    return ready


def _self_signed_probe() -> ssl.SSLContext:
    """TLS for probing a loopback /healthz whose certificate the component made for itself at start."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


# ------------------------------------------------------------------------------------------- kwok stages


def kwok_stages(*, pod_run_seconds: float) -> list[dict[str, Any]]:
    """The node and pod lifecycle kwok plays, as ``kwok.x-k8s.io/v1alpha1`` Stage documents.

    Nodes: initialised to Ready (their conditions from kwok's ``NodeConditions``), heartbeat every 30 s.
    Pods on simulated nodes: Running as soon as they are bound (init containers completed); a Job's pod
    then Succeeded, or Failed with ``FAIL_ANNOTATION``, after its run time; a deleted pod Failed, and once
    its finalizers are gone, removed.
    """
    run_ms = max(0, round(pod_run_seconds * 1000))
    run_time_from = {"expressionFrom": f'.metadata.annotations["{RUN_TIME_ANNOTATION}"]'}
    fail_key = f'.metadata.annotations["{FAIL_ANNOTATION}"]'
    owned_by_job = {"key": ".metadata.ownerReferences.[].kind", "operator": "In", "values": ["Job"]}
    not_deleted = {"key": ".metadata.deletionTimestamp", "operator": "DoesNotExist"}
    running = {"key": ".status.phase", "operator": "In", "values": ["Running"]}
    return [
        _stage("node-initialize", "Node", [_not_ready()], status=_NODE_READY),
        _stage(
            "node-heartbeat",
            "Node",
            [{"key": ".status.phase", "operator": "In", "values": ["Running"]}, _ready()],
            status=_NODE_HEARTBEAT,
            delay={"durationMilliseconds": 30_000, "jitterDurationMilliseconds": 35_000},
        ),
        _stage(
            "pod-running",
            "Pod",
            [not_deleted, {"key": ".status.phase", "operator": "In", "values": ["Pending"]}, _not_ready()],
            status=_POD_RUNNING,
        ),
        _stage(
            "pod-succeeded",
            "Pod",
            [not_deleted, running, owned_by_job, {"key": fail_key, "operator": "NotIn", "values": ["true"]}],
            status=_pod_ended(phase="Succeeded", exit_code=0, reason="Completed"),
            delay={"durationMilliseconds": run_ms, "durationFrom": run_time_from},
        ),
        _stage(
            "pod-failed",
            "Pod",
            [not_deleted, running, {"key": fail_key, "operator": "In", "values": ["true"]}],
            status=_pod_ended(
                phase="Failed", exit_code=1, reason="Error", message=f"failed on purpose ({FAIL_ANNOTATION})"
            ),
            delay={"durationMilliseconds": run_ms, "durationFrom": run_time_from},
        ),
        _stage(
            "pod-killed",
            "Pod",
            [
                {"key": ".metadata.deletionTimestamp", "operator": "Exists"},
                {"key": ".status.phase", "operator": "In", "values": ["Pending", "Running"]},
            ],
            status=_pod_ended(phase="Failed", exit_code=137, reason="Error", message="deleted"),
        ),
        _stage(
            "pod-removed",
            "Pod",
            [
                {"key": ".metadata.deletionTimestamp", "operator": "Exists"},
                {"key": ".metadata.finalizers", "operator": "DoesNotExist"},
            ],
            delete=True,
        ),
    ]


def _stage(
    name: str,
    kind: str,
    match: list[dict[str, Any]],
    *,
    status: str | None = None,
    delete: bool = False,
    delay: dict[str, Any] | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {"resourceRef": {"apiGroup": "v1", "kind": kind}, "selector": {"matchExpressions": match}}
    if delay is not None:
        spec["delay"] = delay
    spec["next"] = {"delete": True} if delete else {"statusTemplate": status}
    return {"apiVersion": "kwok.x-k8s.io/v1alpha1", "kind": "Stage", "metadata": {"name": name}, "spec": spec}


def _ready() -> dict[str, Any]:
    return {"key": '.status.conditions.[] | select( .type == "Ready" ) | .status', "operator": "In", "values": ["True"]}


def _not_ready() -> dict[str, Any]:
    return {
        "key": '.status.conditions.[] | select( .type == "Ready" ) | .status',
        "operator": "NotIn",
        "values": ["True"],
    }


# Go templates kwok renders into the object's new status ({{ }} is Go template syntax, not Python).
_NODE_CONDITIONS = """\
{{ $now := Now }}
conditions:
{{ range NodeConditions }}
- type: {{ .type | Quote }}
  status: {{ .status | Quote }}
  reason: {{ .reason | Quote }}
  message: {{ .message | Quote }}
  lastHeartbeatTime: {{ $now | Quote }}
  lastTransitionTime: {{ $now | Quote }}
{{ end }}
addresses:
- type: InternalIP
  address: {{ NodeIP | Quote }}
- type: Hostname
  address: {{ .metadata.name | Quote }}
phase: Running
"""

_NODE_READY = (
    _NODE_CONDITIONS
    + """\
capacity:
{{ YAML .status.capacity 1 }}
allocatable:
{{ YAML .status.allocatable 1 }}
nodeInfo:
  architecture: amd64
  operatingSystem: linux
  kubeletVersion: {{ printf "kwok-%s" Version | Quote }}
  kubeProxyVersion: {{ printf "kwok-%s" Version | Quote }}
  containerRuntimeVersion: {{ printf "kwok-%s" Version | Quote }}
  kernelVersion: {{ printf "kwok-%s" Version | Quote }}
"""
)

_NODE_HEARTBEAT = _NODE_CONDITIONS

_POD_RUNNING = """\
{{ $now := Now }}
phase: Running
startTime: {{ $now | Quote }}
conditions:
- type: PodScheduled
  status: "True"
  lastTransitionTime: {{ $now | Quote }}
- type: Initialized
  status: "True"
  lastTransitionTime: {{ $now | Quote }}
- type: ContainersReady
  status: "True"
  lastTransitionTime: {{ $now | Quote }}
- type: Ready
  status: "True"
  lastTransitionTime: {{ $now | Quote }}
initContainerStatuses:
{{ range .spec.initContainers }}
- name: {{ .name | Quote }}
  image: {{ .image | Quote }}
  restartCount: 0
{{ if eq ( or .restartPolicy "" ) "Always" }}
  ready: true
  started: true
  state:
    running:
      startedAt: {{ $now | Quote }}
{{ else }}
  ready: false
  state:
    terminated:
      exitCode: 0
      reason: Completed
      startedAt: {{ $now | Quote }}
      finishedAt: {{ $now | Quote }}
{{ end }}
{{ end }}
containerStatuses:
{{ range .spec.containers }}
- name: {{ .name | Quote }}
  image: {{ .image | Quote }}
  ready: true
  started: true
  restartCount: 0
  state:
    running:
      startedAt: {{ $now | Quote }}
{{ end }}
hostIP: {{ NodeIPWith .spec.nodeName | Quote }}
{{ $hostNetwork := or .spec.hostNetwork false }}
{{ $uid := or .metadata.uid "" }}
podIP: {{ PodIPWith .spec.nodeName $hostNetwork $uid .metadata.name .metadata.namespace | Quote }}
"""


def _pod_ended(*, phase: str, exit_code: int, reason: str, message: str = "") -> str:
    """Status template of a pod whose containers all ended with ``exit_code``."""
    template = """\
{{ $now := Now }}
phase: @PHASE@
conditions:
- type: Ready
  status: "False"
  reason: PodCompleted
  lastTransitionTime: {{ $now | Quote }}
- type: ContainersReady
  status: "False"
  reason: PodCompleted
  lastTransitionTime: {{ $now | Quote }}
containerStatuses:
{{ range .spec.containers }}
- name: {{ .name | Quote }}
  image: {{ .image | Quote }}
  ready: false
  started: false
  restartCount: 0
  state:
    terminated:
      exitCode: @EXIT_CODE@
      reason: @REASON@
      message: @MESSAGE@
      startedAt: {{ $now | Quote }}
      finishedAt: {{ $now | Quote }}
{{ end }}
"""
    values = {"@PHASE@": phase, "@EXIT_CODE@": str(exit_code), "@REASON@": reason, "@MESSAGE@": json.dumps(message)}
    for token, value in values.items():  # a JSON string is a valid double-quoted YAML scalar
        template = template.replace(token, value)
    return template
