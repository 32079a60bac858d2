"""One real Kubernetes node for the local stack: a kubelet, containerd with runc, CNI, kube-proxy and CoreDNS.

Why: the simulated cluster (``tjpipe.local.cluster``) runs no container, so nothing there shows that a training
pod really reads the environment, the projected token and the CA Trainer's plugin gives it, and reaches the
status server. This module gives the stack's own apiserver one node that runs pods for real, every part built
from its own Go module at a pinned version (``toolchain.ensure_node_binaries``):

* the kubelet of the apiserver's release (no version skew), with ``failCgroupV1: false``: from 1.35 a kubelet
  refuses cgroup v1 hosts unless told otherwise, and the machines this project runs on are cgroup v1 (hybrid);
* containerd v2 (Kubernetes 1.36 dropped containerd 1.x; Debian ships 1.6) with runc v1.5 as its OCI runtime;
* the CNI reference plugins: a Linux bridge (``BRIDGE``) on this machine with addresses from ``POD_SUBNET``,
  each pod in a network namespace of its own, loopback, and host ports;
* kube-proxy in iptables mode, so a Service's cluster IP reaches its pods;
* CoreDNS on the host, on the bridge's address, answering ``<service>.<namespace>.svc.cluster.local`` from the
  apiserver and nothing else (no upstream: a name outside the cluster is NXDOMAIN).

Why every listener is on loopback or the bridge's address, and pods cannot leave: the bridge exists only on this
machine, pod traffic is not masqueraded, and an iptables rule drops anything from the pod subnet that would be
forwarded out of any other interface. The kubelet serves on the bridge's address (the apiserver reaches it there
for logs and exec, with a client certificate the kubelet checks; anonymous calls are refused).

Why the apiserver listens on the bridge's address too (``start_control_plane``): pods call it through the
``kubernetes`` Service (the in-cluster configuration of every client library), whose endpoint is the address the
apiserver advertises; kube-proxy maps the Service's address to it. A pod cannot reach this machine's loopback,
and the bridge's address is reachable from this machine and its pods only. So the bridge comes first, then the
apiserver on it, then the node.

Why images are loaded, never pulled: no registry is reachable here. Every image the node runs (the sandbox's
pause image, the training image) is a ``docker save`` archive in ``images_dir()`` (``tools/node_images.py``
builds them from Debian's packages), imported into containerd at start; pods name them with ``imagePullPolicy:
IfNotPresent`` (the default for a tag other than ``latest``).

Why a machine check first (``preflight``): a node needs root, Linux network namespaces, overlayfs, iptables and
the ``ip`` command; where one is missing the stack says so in one sentence instead of a process dying later.
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from kubernetes.client import ApiClient, CoreV1Api
from kubernetes.client.exceptions import ApiException

from tjpipe.keys.pki import private_key_pem, self_signed_ca, serving_certificate
from tjpipe.local.crds import apply_objects
from tjpipe.local.kubeapi import LocalKube, start_kube, write_kubeconfig
from tjpipe.local.procs import ManagedProcess, free_port, http_ok, spawn, wait_until
from tjpipe.local.registrations import REGISTERED_FOR
from tjpipe.local.toolchain import KUBERNETES_VERSION, NodeBinaries, cache_root, ensure_node_binaries
from tjpipe.private_files import write_private_file

NODE_NAME = "tjpipe-node"
BRIDGE = "tjpipe0"
POD_SUBNET = "10.244.0.0/24"
NODE_IP = "10.244.0.1"
"""The bridge's own address: the node's InternalIP, where the kubelet and CoreDNS listen and pods find the host."""
CLUSTER_DOMAIN = "cluster.local"
SETUP_FIELD_MANAGER = "tjpipe-real-node"
NAMESPACE = "k8s.io"
"""containerd's namespace for what the CRI plugin runs (and where imported images must be)."""

NODE_USER = f"system:node:{NODE_NAME}"
KUBE_PROXY_USER = "system:kube-proxy"
COREDNS_USER = "tjpipe:coredns"
USERS: dict[str, list[str]] = {NODE_USER: ["system:nodes"], KUBE_PROXY_USER: [], COREDNS_USER: []}
"""The apiserver's token users for the node's processes (RBAC grants them their built-in roles, ``node_rbac``)."""

PAUSE_IMAGE = "tjpipe.local/pause:1"
TRAINING_IMAGE = "tjpipe.local/trainer-demo:1"

_ISOLATION_CHAIN = "TJPIPE-NODE-ISOLATION"
_READY_TIMEOUT_SECONDS = 120.0
KUBELET, CONTAINERD, KUBE_PROXY, COREDNS = "kubelet", "containerd", "kube-proxy", "coredns"


class NodeUnavailable(RuntimeError):
    """This machine cannot run a real node; the message says what is missing and what to do, in one sentence."""


def images_dir() -> Path:
    """Where ``tools/node_images.py`` leaves the node's images as ``docker save`` archives."""
    return cache_root() / "node-images"


def image_archive(image: str, *, pipeline: bool = False) -> Path:
    """The archive of ``image``; with ``pipeline``, one of the pipeline's own images (the project's runtime image,
    NATS), which the node loads only when an install onto it asks (``import_images``), not at every start."""
    folder = images_dir() / "pipeline" if pipeline else images_dir()
    return folder / (image.replace("/", "_").replace(":", "_") + ".tar")


def preflight(*, images: bool = True, which: Callable[[str], str | None] = shutil.which) -> None:
    """Raise ``NodeUnavailable`` with one sentence when this machine cannot run the node (or, with ``images``,
    when the node's images are not built yet)."""
    if not Path("/proc/self/ns/net").exists():
        raise NodeUnavailable("a real node needs Linux with network namespaces; use the simulated cluster instead")
    if os.geteuid() != 0:
        raise NodeUnavailable(
            "a real node needs root (it makes network namespaces, mounts and iptables rules); run as root or use the "
            "simulated cluster (tjpipe up without --real-node)"
        )
    for command, package in (("iptables", "iptables"), ("ip", "iproute2"), ("mount", "mount")):
        if which(command) is None:
            raise NodeUnavailable(f"a real node needs the {command} command: apt-get install -y {package}")
    if "overlay" not in Path("/proc/filesystems").read_text():
        raise NodeUnavailable("a real node needs the overlay file system (modprobe overlay), which this kernel lacks")
    missing = [image for image in (PAUSE_IMAGE, TRAINING_IMAGE) if not image_archive(image).is_file()]
    if images and missing:
        raise NodeUnavailable(
            f"the real node's images are not built yet ({', '.join(missing)}): run bash scripts/node-images.sh "
            "(needs a running Docker engine and debootstrap)"
        )


@dataclass(frozen=True)
class RealNode:
    """The node's processes (containerd, kubelet, kube-proxy, CoreDNS, in start order)."""

    processes: tuple[ManagedProcess, ...]
    work_dir: Path
    dns_ip: str = NODE_IP

    def stop(self, timeout: float = 20) -> None:
        """Stop the kubelet first, then the rest; then every container the node still ran, and the network."""
        for process in reversed(self.processes):
            if process.name != CONTAINERD:
                process.stop(timeout=timeout)
        containerd = next((p for p in self.processes if p.name == CONTAINERD), None)
        if containerd is not None:
            remove_all_pods(self.work_dir)
            containerd.stop(timeout=timeout)
        forget_host_dirs(self.work_dir)
        teardown_network(ensure_node_binaries(progress=lambda _: None).kube_proxy)


# --------------------------------------------------------------------------------------------- network


def _run(argv: Sequence[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, check=check, timeout=60)


def setup_network() -> None:
    """The bridge with the node's address, forwarding, bridged traffic through iptables, and the rule that keeps
    pod traffic on this machine."""
    if _run(["ip", "link", "show", BRIDGE], check=False).returncode != 0:
        _run(["ip", "link", "add", BRIDGE, "type", "bridge"])
    prefix = ipaddress.ip_network(POD_SUBNET).prefixlen
    addresses = _run(["ip", "-4", "addr", "show", "dev", BRIDGE]).stdout
    if f"{NODE_IP}/{prefix}" not in addresses:
        _run(["ip", "addr", "add", f"{NODE_IP}/{prefix}", "dev", BRIDGE])
    _run(["ip", "link", "set", BRIDGE, "up"])
    for key, value in (("net/ipv4/ip_forward", "1"), ("net/bridge/bridge-nf-call-iptables", "1")):
        path = Path("/proc/sys") / key
        if path.exists() and path.read_text().strip() != value:
            path.write_text(value)
    if _run(["iptables", "-w", "-n", "-L", _ISOLATION_CHAIN], check=False).returncode != 0:
        _run(["iptables", "-w", "-N", _ISOLATION_CHAIN])
    _run(["iptables", "-w", "-F", _ISOLATION_CHAIN])
    # Forwarded from a pod to anything but the bridge (another pod): dropped, so no pod traffic leaves the machine.
    _run(["iptables", "-w", "-A", _ISOLATION_CHAIN, "-s", POD_SUBNET, "!", "-o", BRIDGE, "-j", "DROP"])
    # Pod to pod across the bridge: accepted, whatever the FORWARD policy (Docker sets it to DROP).
    _run(["iptables", "-w", "-A", _ISOLATION_CHAIN, "-i", BRIDGE, "-o", BRIDGE, "-j", "ACCEPT"])
    if _run(["iptables", "-w", "-C", "FORWARD", "-j", _ISOLATION_CHAIN], check=False).returncode != 0:
        _run(["iptables", "-w", "-I", "FORWARD", "1", "-j", _ISOLATION_CHAIN])


def teardown_network(kube_proxy: Path | None = None) -> None:
    """Remove the bridge and the isolation chain; with ``kube_proxy``, also the rules kube-proxy made."""
    if kube_proxy is not None:
        _run([str(kube_proxy), "--cleanup"], check=False)
    # The kubelet's own chains (it keeps loopback unreachable from elsewhere and canaries its rules).
    for table in ("filter", "nat", "mangle"):
        for hook in ("INPUT", "OUTPUT"):
            _run(["iptables", "-w", "-t", table, "-D", hook, "-j", "KUBE-FIREWALL"], check=False)
        for chain in ("KUBE-FIREWALL", "KUBE-KUBELET-CANARY", "KUBE-IPTABLES-HINT"):
            _run(["iptables", "-w", "-t", table, "-F", chain], check=False)
            _run(["iptables", "-w", "-t", table, "-X", chain], check=False)
    _run(["iptables", "-w", "-D", "FORWARD", "-j", _ISOLATION_CHAIN], check=False)
    _run(["iptables", "-w", "-F", _ISOLATION_CHAIN], check=False)
    _run(["iptables", "-w", "-X", _ISOLATION_CHAIN], check=False)
    _run(["ip", "link", "del", BRIDGE], check=False)


def cni_config() -> dict[str, Any]:
    """A conflist: the bridge (pods' gateway is the node's address; no masquerade, nothing leaves), host ports."""
    return {
        "cniVersion": "1.0.0",
        "name": "tjpipe",
        "plugins": [
            {
                "type": "bridge",
                "bridge": BRIDGE,
                "isGateway": True,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": POD_SUBNET, "gateway": NODE_IP}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }


# --------------------------------------------------------------------------------------------- configs


def containerd_config(work_dir: Path, binaries: NodeBinaries) -> str:
    """containerd's configuration (version 3): its own root, state and socket under ``work_dir``; the CRI plugin
    with runc, the CNI plugins, and the pause image that ``tools/node_images.py`` built."""
    return f"""version = 3
root = "{work_dir / "containerd" / "root"}"
state = "{work_dir / "containerd" / "state"}"

[grpc]
  address = "{containerd_socket(work_dir)}"

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "{PAUSE_IMAGE}"

[plugins.'io.containerd.cri.v1.runtime']
  netns_mounts_under_state_dir = true
  # No lower OOM score than containerd's own: where even root may not lower one (some sandboxes and VMs), the
  # pause container's -998 would fail every pod; here the kernel's OOM killer just ranks pods as other processes.
  restrict_oom_score_adj = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = "{binaries.runc}"
        SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["{binaries.cni_dir}"]
    conf_dir = "{work_dir / "cni"}"

[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
"""


def host_dirs(work_dir: Path) -> tuple[Path, Path]:
    """Where containerd's socket and the kubelet's root folder live: short folders named after ``work_dir`` (in
    ``/run`` and ``/var/lib``), since a unix socket's path must stay under 104 bytes and both programs make
    sockets inside them (containerd's ``.ttrpc`` beside its own, the kubelet's pod-resources and plugin ones),
    which a state folder's path may not allow."""
    import hashlib

    digest = hashlib.sha256(str(work_dir.resolve()).encode()).hexdigest()[:12]
    return Path("/run") / f"tjpipe-node-{digest}", Path("/var/lib") / f"tjpipe-node-{digest}"


def containerd_socket(work_dir: Path) -> Path:
    return host_dirs(work_dir)[0] / "containerd.sock"


def kubelet_root(work_dir: Path) -> Path:
    return host_dirs(work_dir)[1]


def forget_host_dirs(work_dir: Path) -> None:
    """Once containerd stopped: end the runc shims it left (a shim whose task was killed but never deleted waits
    for a containerd that is gone), unmount what is still mounted below the node's folders, and remove the short
    ones outside ``work_dir``."""
    import signal

    address = str(containerd_socket(work_dir)).encode()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"containerd-shim-runc-v2") and address in argv:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(proc.name), signal.SIGKILL)
    for folder in (work_dir, *host_dirs(work_dir)):
        unmount_under(folder)
    for folder in host_dirs(work_dir):
        shutil.rmtree(folder, ignore_errors=True)


def kubelet_config(
    work_dir: Path, *, port: int, healthz_port: int, client_ca: Path, serving_cert: Path, serving_key: Path
) -> dict[str, Any]:
    """The kubelet's configuration: cgroupfs on cgroup v1 allowed (``failCgroupV1: false``), the stack's containerd,
    CoreDNS on the node's address, only authenticated and authorized callers (the apiserver's client certificate,
    or tokens it reviews), thresholds low enough for a laptop's disk."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": NODE_IP,
        "port": port,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": healthz_port,
        "tlsCertFile": str(serving_cert),
        "tlsPrivateKeyFile": str(serving_key),
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(client_ca)},
        },
        "authorization": {"mode": "Webhook"},
        "cgroupDriver": "cgroupfs",
        "failCgroupV1": False,
        "failSwapOn": False,
        "containerRuntimeEndpoint": f"unix://{containerd_socket(work_dir)}",
        "clusterDNS": [NODE_IP],
        "clusterDomain": CLUSTER_DOMAIN,
        "resolvConf": str(work_dir / "resolv.conf"),
        "staticPodPath": "",
        "maxPods": 30,
        "serializeImagePulls": False,
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
        "enforceNodeAllocatable": [],
        "protectKernelDefaults": False,
        "registerNode": True,
        "oomScoreAdj": 0,  # the kernel may refuse a lower score even to root (see containerd's restrict_oom_score_adj)
        "shutdownGracePeriod": "0s",
    }


def kube_proxy_config(kubeconfig: Path, *, healthz_port: int, metrics_port: int) -> dict[str, Any]:
    """kube-proxy in iptables mode for this node only; conntrack sysctls left as the machine has them."""
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "mode": "iptables",
        "hostnameOverride": NODE_NAME,
        "bindAddress": "127.0.0.1",
        "healthzBindAddress": f"127.0.0.1:{healthz_port}",
        "metricsBindAddress": f"127.0.0.1:{metrics_port}",
        "clusterCIDR": POD_SUBNET,
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "nodePortAddresses": [f"{NODE_IP}/32"],
        "oomScoreAdj": 0,
        "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
    }


def corefile(kubeconfig: Path, *, health_port: int) -> str:
    """Cluster names from the apiserver on the node's address; any other name NXDOMAIN (nothing leaves)."""
    return f"""{CLUSTER_DOMAIN}:53 in-addr.arpa:53 {{
    bind {NODE_IP}
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa {{
        kubeconfig {kubeconfig}
        pods insecure
    }}
    health 127.0.0.1:{health_port}
    errors
}}
.:53 {{
    bind {NODE_IP}
    template ANY ANY {{
        rcode NXDOMAIN
    }}
}}
"""


def node_rbac() -> list[dict[str, Any]]:
    """What the node's processes may do: the kubelet and kube-proxy their built-in roles, CoreDNS reads what it
    answers from, the apiserver's kubelet client everything on the kubelet's API."""

    def binding(name: str, role: str, user: str) -> dict[str, Any]:
        return {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
        }

    coredns_role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": COREDNS_USER},
        "rules": [
            {"apiGroups": [""], "resources": ["services", "pods", "namespaces"], "verbs": ["list", "watch"]},
            {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]},
        ],
    }
    return [
        binding("tjpipe:real-node:kubelet", "system:node", NODE_USER),
        binding("tjpipe:real-node:kube-proxy", "system:node-proxier", KUBE_PROXY_USER),
        coredns_role,
        binding("tjpipe:real-node:coredns", COREDNS_USER, COREDNS_USER),
        binding("tjpipe:real-node:kubelet-api", "system:kubelet-api-admin", APISERVER_KUBELET_CLIENT),
    ]


APISERVER_KUBELET_CLIENT = "tjpipe:apiserver-kubelet-client"


def write_kubelet_client_pki(folder: Path) -> list[str]:
    """A CA the kubelet trusts for client certificates, and the apiserver's client certificate signed by it;
    returns the apiserver flags that make it call kubelets with that certificate."""
    folder.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    not_before, not_after = now - datetime.timedelta(hours=1), now + datetime.timedelta(days=30)
    ca_key, ca_cert = self_signed_ca("tjpipe-kubelet-client-ca", not_before=not_before, not_after=not_after)
    key, cert = serving_certificate(
        ca_key,
        ca_cert,
        common_name=APISERVER_KUBELET_CLIENT,
        names=[x509.DNSName("kube-apiserver")],
        not_before=not_before,
        not_after=not_after,
        client_auth=True,
    )
    (folder / "client-ca.crt").write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    (folder / "apiserver-kubelet-client.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    write_private_file(folder / "apiserver-kubelet-client.key", private_key_pem(key))
    # The kubelet's own serving certificate, for the node's address (the apiserver does not verify it: no
    # --kubelet-certificate-authority, as with a kubelet's self-signed default).
    serving_key, serving = serving_certificate(
        ca_key,
        ca_cert,
        common_name=NODE_NAME,
        names=[x509.DNSName(NODE_NAME), x509.IPAddress(ipaddress.ip_address(NODE_IP))],
        not_before=not_before,
        not_after=not_after,
    )
    (folder / "kubelet.crt").write_bytes(serving.public_bytes(serialization.Encoding.PEM))
    write_private_file(folder / "kubelet.key", private_key_pem(serving_key))
    return [
        f"--kubelet-client-certificate={folder / 'apiserver-kubelet-client.crt'}",
        f"--kubelet-client-key={folder / 'apiserver-kubelet-client.key'}",
        "--kubelet-preferred-address-types=InternalIP",
    ]


# --------------------------------------------------------------------------------------------- start


def start_control_plane(
    *,
    work_dir: Path,
    log_dir: Path,
    kubeconfig_path: Path,
    progress: Callable[[str], None],
    extra_apiserver_args: Sequence[str] = (),
) -> LocalKube:
    """etcd and the apiserver a real node's pods can call: the bridge first, then the apiserver on its address
    (advertised, so the ``kubernetes`` Service leads there), knowing the node's users and calling the kubelet
    with its client certificate (``write_kubelet_client_pki`` into ``work_dir/node/pki``, where
    ``start_real_node`` finds it). ``start_real_node`` follows, with ``work_dir/node``."""
    setup_network()
    try:
        return start_kube(
            work_dir=work_dir,
            log_dir=log_dir,
            kubeconfig_path=kubeconfig_path,
            progress=progress,
            users=USERS,
            extra_apiserver_args=[*write_kubelet_client_pki(work_dir / "node" / "pki"), *extra_apiserver_args],
            # The controllers make each namespace's default ServiceAccount, which this plugin gives every pod.
            service_account_admission=True,
            bind_address=NODE_IP,
        )
    except BaseException:
        teardown_network()
        raise


def start_real_node(
    kube: LocalKube,
    *,
    work_dir: Path,
    log_dir: Path,
    progress: Callable[[str], None],
) -> RealNode:
    """Start containerd, load the images, start the kubelet, kube-proxy and CoreDNS against ``kube`` (started
    with ``USERS`` and ``write_kubelet_client_pki``'s flags); return once the node is Ready."""
    preflight()
    binaries = ensure_node_binaries(progress=progress)
    started = time.monotonic()
    work_dir.mkdir(parents=True, exist_ok=True)
    setup_network()
    (work_dir / "cni").mkdir(parents=True, exist_ok=True)
    (work_dir / "cni" / "10-tjpipe.conflist").write_text(json.dumps(cni_config(), indent=2))
    (work_dir / "resolv.conf").write_text(f"nameserver {NODE_IP}\n")  # dnsPolicy Default: cluster DNS, nothing else
    kubeconfigs = {
        user: _user_kubeconfig(kube, work_dir / "kubeconfigs" / f"{name}.kubeconfig", user)
        for name, user in ((KUBELET, NODE_USER), (KUBE_PROXY, KUBE_PROXY_USER), (COREDNS, COREDNS_USER))
    }
    with kube.api_client() as api:
        apply_objects(api, node_rbac(), field_manager=SETUP_FIELD_MANAGER)

    processes: list[ManagedProcess] = []
    try:
        (work_dir / "containerd.toml").write_text(containerd_config(work_dir, binaries))
        containerd_socket(work_dir).parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        containerd = spawn(
            name=CONTAINERD,
            argv=[str(binaries.containerd), "--config", str(work_dir / "containerd.toml")],
            log_dir=log_dir,
            env={"PATH": f"{binaries.containerd.parent}:{os.environ.get('PATH', '/usr/bin:/bin')}"},
        )
        processes.append(containerd)
        socket = containerd_socket(work_dir)
        wait_until(socket.exists, timeout=60, what=f"containerd's socket {socket}", process=containerd)
        load_images(binaries, socket, progress=progress)

        pki = work_dir / "pki"
        port, healthz = free_port(), free_port()
        config = kubelet_config(
            work_dir,
            port=port,
            healthz_port=healthz,
            client_ca=pki / "client-ca.crt",
            serving_cert=pki / "kubelet.crt",
            serving_key=pki / "kubelet.key",
        )
        (work_dir / "kubelet.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
        kubelet = spawn(
            name=KUBELET,
            argv=[
                str(binaries.kubelet),
                f"--config={work_dir / 'kubelet.yaml'}",
                f"--kubeconfig={kubeconfigs[NODE_USER]}",
                f"--hostname-override={NODE_NAME}",
                f"--node-ip={NODE_IP}",
                # Registered for the kubelet (``tjpipe.local.registrations``): a later start without the real node
                # removes the Node object it left.
                f"--node-labels={REGISTERED_FOR}={KUBELET}",
                f"--root-dir={kubelet_root(work_dir)}",
                f"--cert-dir={work_dir / 'kubelet-pki'}",
                "--v=1",
            ],
            log_dir=log_dir,
        )
        processes.append(kubelet)
        wait_until(
            lambda: http_ok(f"http://127.0.0.1:{healthz}/healthz"),
            timeout=_READY_TIMEOUT_SECONDS,
            what="the kubelet's /healthz",
            process=kubelet,
        )

        proxy_health, proxy_metrics = free_port(), free_port()
        (work_dir / "kube-proxy.yaml").write_text(
            yaml.safe_dump(
                kube_proxy_config(kubeconfigs[KUBE_PROXY_USER], healthz_port=proxy_health, metrics_port=proxy_metrics)
            )
        )
        proxy = spawn(
            name=KUBE_PROXY,
            argv=[str(binaries.kube_proxy), f"--config={work_dir / 'kube-proxy.yaml'}", "--v=1"],
            log_dir=log_dir,
        )
        processes.append(proxy)

        dns_health = free_port()
        (work_dir / "Corefile").write_text(corefile(kubeconfigs[COREDNS_USER], health_port=dns_health))
        coredns = spawn(
            name=COREDNS,
            argv=[str(binaries.coredns), "-conf", str(work_dir / "Corefile")],
            log_dir=log_dir,
        )
        processes.append(coredns)
        wait_until(
            lambda: http_ok(f"http://127.0.0.1:{dns_health}/health"),
            timeout=_READY_TIMEOUT_SECONDS,
            what="CoreDNS /health",
            process=coredns,
        )
        with kube.api_client() as api:
            wait_until(
                lambda: _node_ready(api),
                timeout=_READY_TIMEOUT_SECONDS,
                what=f"node {NODE_NAME} to become Ready",
                process=kubelet,
            )
    except BaseException:
        if processes and processes[0].name == CONTAINERD and processes[0].is_running():
            remove_all_pods(work_dir)
        for process in reversed(processes):
            process.stop()
        forget_host_dirs(work_dir)
        teardown_network(binaries.kube_proxy)
        raise
    progress(
        f"real node {NODE_NAME} Ready in {time.monotonic() - started:.1f}s: kubelet v{KUBERNETES_VERSION}, "
        f"containerd, runc, CNI bridge {BRIDGE} ({POD_SUBNET}), kube-proxy, CoreDNS on {NODE_IP}"
    )
    return RealNode(processes=tuple(processes), work_dir=work_dir)


def load_images(binaries: NodeBinaries, socket: Path, *, progress: Callable[[str], None]) -> None:
    """Import every archive in ``images_dir()`` into containerd's CRI namespace."""
    archives = sorted(images_dir().glob("*.tar"))
    import_images(binaries, socket, archives)
    progress(f"images loaded into containerd: {', '.join(p.stem for p in archives)}")


def import_images(
    binaries: NodeBinaries, socket: Path, archives: Sequence[Path], *, tags: dict[str, str] | None = None
) -> None:
    """Import ``docker save`` archives into the CRI namespace of the containerd at ``socket``, then give images
    more names (``tags``: name it has → name to add), as ``docker tag`` would before a push to a registry."""
    ctr = [str(binaries.ctr), "--address", str(socket), "-n", NAMESPACE, "images"]
    for archive in archives:
        done = _run([*ctr, "import", str(archive)], check=False)
        if done.returncode != 0:
            raise NodeUnavailable(f"containerd could not import {archive.name}: {done.stderr.strip()[-300:]}")
    for source, target in (tags or {}).items():
        _run([*ctr, "rm", _reference(target)], check=False)
        done = _run([*ctr, "tag", _reference(source), _reference(target)], check=False)
        if done.returncode != 0:
            raise NodeUnavailable(f"containerd could not name {source} {target}: {done.stderr.strip()[-300:]}")


def _reference(image: str) -> str:
    """An image name as containerd stores it (Docker's short names are on docker.io, official ones in library/)."""
    first = image.split("/", 1)[0]
    if "/" in image and ("." in first or ":" in first or first == "localhost"):
        return image
    return f"docker.io/{image}" if "/" in image else f"docker.io/library/{image}"


def _user_kubeconfig(kube: LocalKube, path: Path, user: str) -> Path:
    token = kube.user_tokens[user]
    write_kubeconfig(path, server=kube.server, ca_file=kube.ca_file, token=token)
    return path


def _node_ready(api: ApiClient) -> bool:
    try:
        node: Any = CoreV1Api(api).read_node(NODE_NAME)
    except ApiException as error:
        if error.status == 404:
            return False
        raise
    return any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or [])


def remove_all_pods(work_dir: Path) -> None:
    """What the kubelet left running (it stops no pod when it exits): every task in the CRI namespace, killed."""
    binaries = ensure_node_binaries(progress=lambda _: None)
    socket = containerd_socket(work_dir)
    ctr = [str(binaries.ctr), "--address", str(socket), "-n", NAMESPACE]
    listed = _run([*ctr, "tasks", "list", "-q"], check=False)
    for task in listed.stdout.split():
        _run([*ctr, "tasks", "kill", "-s", "SIGKILL", task], check=False)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and _run([*ctr, "tasks", "list", "-q"], check=False).stdout.strip():
        time.sleep(0.5)
    for task in _run([*ctr, "tasks", "list", "-q"], check=False).stdout.split():
        _run([*ctr, "tasks", "delete", "-f", task], check=False)


def unmount_under(folder: Path) -> None:
    """Unmount what the kubelet and containerd mounted at or below ``folder`` (deepest first), so it can go."""
    resolved = str(folder.resolve())
    mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
    # The kubelet also bind-mounts its root folder onto itself (for mount propagation): that one goes last.
    for mount in sorted((m for m in mounts if m == resolved or m.startswith(resolved + "/")), key=len, reverse=True):
        _run(["umount", "-l", mount], check=False)
