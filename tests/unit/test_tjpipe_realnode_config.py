"""The real node's configuration as written (``tjpipe.local.realnode``): what keeps it on this machine, what lets a
1.36 kubelet start on a cgroup v1 host, and the one-sentence refusals where the machine lacks something."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tjpipe.local import realnode, toolchain


def test_the_kubelet_runs_on_cgroup_v1_and_answers_only_authenticated_callers_on_the_nodes_address() -> None:
    config = realnode.kubelet_config(
        Path("/n"),
        port=1,
        healthz_port=2,
        client_ca=Path("/n/ca"),
        serving_cert=Path("/n/c"),
        serving_key=Path("/n/k"),
    )
    assert config["failCgroupV1"] is False
    assert config["cgroupDriver"] == "cgroupfs"
    assert config["address"] == realnode.NODE_IP and config["healthzBindAddress"] == "127.0.0.1"
    assert config["readOnlyPort"] == 0
    assert config["authentication"]["anonymous"] == {"enabled": False}
    assert config["authorization"] == {"mode": "Webhook"}
    assert config["clusterDNS"] == [realnode.NODE_IP]
    assert config["containerRuntimeEndpoint"] == f"unix://{realnode.containerd_socket(Path('/n'))}"
    assert len(str(realnode.containerd_socket(Path("/n" * 100)))) + len(".ttrpc") < 104


def test_pod_traffic_is_not_masqueraded_and_addresses_come_from_the_nodes_range() -> None:
    bridge, portmap = realnode.cni_config()["plugins"]
    assert bridge["type"] == "bridge" and bridge["bridge"] == realnode.BRIDGE
    assert bridge["ipMasq"] is False
    assert bridge["ipam"]["ranges"] == [[{"subnet": realnode.POD_SUBNET, "gateway": realnode.NODE_IP}]]
    assert portmap["type"] == "portmap"
    assert set(toolchain.CNI_PLUGINS) == {"bridge", "host-local", "loopback", "portmap"}


def test_containerd_runs_the_built_runc_and_the_pause_image_that_was_built_here() -> None:
    binaries = toolchain.node_binaries_paths()
    text = realnode.containerd_config(Path("/n"), binaries)
    assert f'BinaryName = "{binaries.runc}"' in text
    assert f'sandbox = "{realnode.PAUSE_IMAGE}"' in text
    assert f'bin_dirs = ["{binaries.cni_dir}"]' in text
    assert 'stream_server_address = "127.0.0.1"' in text


def test_coredns_answers_cluster_names_only() -> None:
    text = realnode.corefile(Path("/n/kubeconfig"), health_port=9)
    assert f"bind {realnode.NODE_IP}" in text
    assert "forward" not in text  # no upstream: nothing leaves the machine
    assert "rcode NXDOMAIN" in text


@pytest.mark.skipif(os.geteuid() != 0, reason="the command checks come after the root check")
def test_a_missing_command_is_named_with_the_package_that_provides_it() -> None:
    with pytest.raises(realnode.NodeUnavailable) as caught:
        realnode.preflight(images=False, which=lambda command: None if command == "iptables" else "/bin/true")
    assert str(caught.value) == "a real node needs the iptables command: apt-get install -y iptables"


def test_the_apiservers_certificate_names_the_nodes_address_and_the_kubernetes_service(tmp_path: Path) -> None:
    """Pods call the apiserver at the ``kubernetes`` Service (by name or address), which leads to the bridge's
    address: the serving certificate must name all of them, and still loopback for this machine's clients."""
    import ipaddress

    from cryptography import x509

    from tjpipe.local import kubeapi

    pki = kubeapi.write_pki(tmp_path, ip_addresses=[realnode.NODE_IP])
    names = x509.load_pem_x509_certificate(pki.serving_cert.read_bytes()).extensions.get_extension_for_class(
        x509.SubjectAlternativeName
    )
    addresses = {str(a) for a in names.value.get_values_for_type(x509.IPAddress)}
    service = str(next(ipaddress.IPv4Network(kubeapi.SERVICE_CLUSTER_IP_RANGE).hosts()))
    assert {realnode.NODE_IP, service, "127.0.0.1"} <= addresses
    assert {"kubernetes.default.svc", "kubernetes.default.svc.cluster.local"} <= set(
        names.value.get_values_for_type(x509.DNSName)
    )


def test_image_names_are_given_as_containerd_stores_them() -> None:
    assert realnode._reference("nats:2.15.1-alpine") == "docker.io/library/nats:2.15.1-alpine"
    assert realnode._reference("team/app:1") == "docker.io/team/app:1"
    assert realnode._reference("tjpipe.local/pause:1") == "tjpipe.local/pause:1"
    assert realnode._reference("registry.example.com/platform/x:0.1.0") == "registry.example.com/platform/x:0.1.0"
    assert realnode._reference("localhost/x:1") == "localhost/x:1"
