"""The ``status-server`` component: what turning Trainer's TrainJobStatus gate on adds, in kustomize and in Helm.

With the gate off nothing of the status server runs (the base and the chart's defaults hold none of its
Deployment or Service). With it on, the Service is the one the planner's configured URL names, on its port; the
pod runs ``tjpipe status-server`` with its serving pair from ``tjpipe-status-server-tls`` and its own NATS seed,
and nothing of another stage's; the chart renders the very objects the component adds to the Kubeflow overlay;
the API server accepts them and the authorizer gives its ServiceAccount what the server needs and no more.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from tjpipe import credentials
from tjpipe.local.helm import helm_template
from tjpipe.local.kustomize import kustomize_build

from . import REPO, cli_env_names, unset_settings
from .test_kubeflow_install import RELEASE, RELEASE_NAMESPACE, tool
from .test_kustomize import (
    NAMESPACE,
    PROBES,
    Obj,
    _client_with,
    _config_map,
    _dry_run_each,
    _expected_permissions,
    _named,
    _nats_pod_labels,
    _of_kind,
    _ports,
    _progress,
    _selects,
    rbac_applied,
)

BASE = REPO / "deploy" / "base"
COMPONENT = REPO / "deploy" / "components" / "status-server"
CERT_MANAGER = REPO / "deploy" / "components" / "cert-manager"
NAME = "tjpipe-status-server"
ADDED_KINDS = (
    "ServiceAccount",
    "ClusterRole",
    "ClusterRoleBinding",
    "Deployment",
    "Service",
    "PodDisruptionBudget",
    "NetworkPolicy",
)
# What the server does on the API server (docs/training-progress.md, "Authorization: what each layer stops").
NEEDS = {
    ("authentication.k8s.io", "tokenreviews", "create"),
    ("", "pods", "get"),
    ("batch", "jobs", "get"),
    ("jobset.x-k8s.io", "jobsets", "get"),
    ("trainer.kubeflow.org", "trainjobs", "get"),
    ("trainer.kubeflow.org", "trainjobs/status", "patch"),
}


def _gate_on(components: tuple[Path, ...] = (COMPONENT,)) -> list[Obj]:
    """The base with the component and the gate turned on, as docs/deploying.md says to write the overlay."""
    with tempfile.TemporaryDirectory(prefix="tjpipe-status-") as scratch:
        kustomization = {
            "resources": [os.path.relpath(BASE, scratch)],
            "components": [os.path.relpath(c, scratch) for c in components],
            "configMapGenerator": [
                {"name": "tjpipe-config", "behavior": "merge", "literals": ["TJPIPE_TRAINJOB_STATUS=true"]}
            ],
        }
        (Path(scratch) / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
        return kustomize_build(Path(scratch), progress=_progress)


@pytest.fixture(scope="module")
def base() -> list[Obj]:
    return kustomize_build(BASE, progress=_progress)


@pytest.fixture(scope="module")
def rendered() -> list[Obj]:
    return _gate_on()


def _ours(objects: list[Obj]) -> list[Obj]:
    return [o for o in objects if o["metadata"]["name"] == NAME]


def test_gate_off_runs_no_status_server(base: list[Obj]) -> None:
    config = _config_map(base, "tjpipe-config")["data"]
    assert config["TJPIPE_TRAINJOB_STATUS"] == "false"
    assert not [o for o in _ours(base) if o["kind"] in ("Deployment", "Service")]


def test_the_component_adds_its_own_objects_and_the_overlay_turns_the_gate_on(
    base: list[Obj], rendered: list[Obj]
) -> None:
    added = {(o["kind"], o["metadata"]["name"]) for o in rendered} - {(o["kind"], o["metadata"]["name"]) for o in base}
    added = {key for key in added if key[0] != "ConfigMap"}  # the merged tjpipe-config gets a new hash
    assert added == {(kind, NAME) for kind in ADDED_KINDS}
    for obj in _ours(rendered):
        if obj["kind"] not in ("ClusterRole", "ClusterRoleBinding"):
            assert obj["metadata"]["namespace"] == NAMESPACE, obj["kind"]
        assert obj["metadata"]["labels"]["app.kubernetes.io/part-of"] == "trainjob-pipeline"
    assert _config_map(rendered, "tjpipe-config")["data"]["TJPIPE_TRAINJOB_STATUS"] == "true"


def test_the_service_is_the_one_the_planner_gives_the_pods(rendered: list[Obj]) -> None:
    config = _config_map(rendered, "tjpipe-config")["data"]
    url = urlsplit(config["TJPIPE_STATUS_SERVER_URL"])
    assert url.scheme == "https" and url.path == ""
    service = _named(rendered, "Service", NAME)
    assert url.hostname == f"{service['metadata']['name']}.{service['metadata']['namespace']}.svc"
    [port] = service["spec"]["ports"]
    assert port["port"] == url.port == 10443
    deployment = _named(rendered, "Deployment", NAME)
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert _selects({"matchLabels": service["spec"]["selector"]}, labels)
    assert _selects(deployment["spec"]["selector"], labels)
    # Only its own pods: no other Deployment's pods carry every label the Service selects.
    others = [d for d in _of_kind(rendered, "Deployment") if d["metadata"]["name"] != NAME]
    assert not [d for d in others if _selects({"matchLabels": service["spec"]["selector"]}, _pod_labels(d))]
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    [target] = [p for p in container["ports"] if p["name"] == port["targetPort"]]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert target["containerPort"] == int(env["TJPIPE_STATUS_SERVER_PORT"]) == 10443


def _pod_labels(deployment: Obj) -> dict[str, str]:
    labels: dict[str, str] = deployment["spec"]["template"]["metadata"]["labels"]
    return labels


def test_the_pod_runs_the_server_with_its_certificate_and_its_own_nats_identity_only(rendered: list[Obj]) -> None:
    deployment = _named(rendered, "Deployment", NAME)
    pod = deployment["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == NAME
    [container] = pod["containers"]
    webhook = _named(rendered, "Deployment", "tjpipe-webhook")["spec"]["template"]["spec"]
    assert container["args"] == ["status-server"] and container["image"] == webhook["containers"][0]["image"]
    # Its settings: the shared ConfigMap (bus, logging, metrics port) as every stage, its own next to its Secrets.
    assert container["envFrom"] == [
        {"configMapRef": {"name": _config_map(rendered, "tjpipe-config")["metadata"]["name"]}}
    ]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert set(env) <= cli_env_names()["status-server"], set(env) - cli_env_names()["status-server"]
    shared = _config_map(rendered, "tjpipe-config")["data"]
    assert unset_settings("status-server", {*env, *shared}, container["args"], in_cluster=True) == []
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert all(m["readOnly"] for m in container["volumeMounts"] if m["name"] != "tmp")

    def secret_of(path: str) -> Obj:
        secret: Obj = volumes[mounts[str(Path(path).parent)]]["secret"]
        return secret

    identity = credentials.SERVICE_IDENTITY["status-server"]
    assert secret_of(env["NATS_CREDS"])["secretName"] == f"tjpipe-{identity}-nats-creds"
    tls = secret_of(env["TJPIPE_STATUS_SERVER_TLS_CERT"])
    assert secret_of(env["TJPIPE_STATUS_SERVER_TLS_KEY"]) == tls
    assert tls["secretName"] == "tjpipe-status-server-tls"
    assert tls["items"] == [{"key": "tls.crt", "path": "tls.crt"}, {"key": "tls.key", "path": "tls.key"}]
    # Nothing of another stage: no signing key, no trusted keys, no other identity's seed, only NATS's CA.
    secrets = {v["secret"]["secretName"] for v in volumes.values() if "secret" in v}
    assert secrets == {"tjpipe-status-server-nats-creds", "nats-tls", "tjpipe-status-server-tls"}
    assert volumes["nats-ca"]["secret"]["items"] == [{"key": "ca.crt", "path": "ca.crt"}]
    assert not [v for v in volumes.values() if "configMap" in v or "projected" in v]
    for volume in volumes.values():
        if "secret" in volume:
            assert volume["secret"]["defaultMode"] == 0o440


def test_probes_security_and_resources_as_the_webhooks(rendered: list[Obj]) -> None:
    pod = _named(rendered, "Deployment", NAME)["spec"]["template"]["spec"]
    webhook = _named(rendered, "Deployment", "tjpipe-webhook")["spec"]["template"]["spec"]
    [container], [theirs] = pod["containers"], webhook["containers"]
    for key in ("livenessProbe", "readinessProbe", "securityContext", "resources"):
        assert container[key] == theirs[key], key
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    metrics = {p["name"]: p["containerPort"] for p in container["ports"]}["metrics"]
    config = _config_map(rendered, "tjpipe-config")["data"]
    assert metrics == int(config["TJPIPE_METRICS_PORT"])
    assert pod["securityContext"] == webhook["securityContext"]
    assert pod["securityContext"]["runAsNonRoot"] is True


def test_its_network_policy_lets_training_pods_in_and_it_out_to_nats_and_the_api_server(rendered: list[Obj]) -> None:
    labels = _pod_labels(_named(rendered, "Deployment", NAME))
    [policy] = [
        p
        for p in _of_kind(rendered, "NetworkPolicy")
        if p["spec"]["podSelector"] and _selects(p["spec"]["podSelector"], labels)
    ]
    assert _ports(policy["spec"]["ingress"]) == {(10443, "TCP"), (9090, "TCP")}
    assert _ports(policy["spec"]["egress"]) == {(4222, "TCP"), (443, "TCP"), (6443, "TCP"), (53, "UDP"), (53, "TCP")}
    nats = _named(rendered, "NetworkPolicy", "nats")["spec"]
    assert _selects(nats["podSelector"], _nats_pod_labels(rendered))
    [clients] = [rule for rule in nats["ingress"] if _ports([rule]) == {(4222, "TCP")}]
    assert any(_selects(peer["podSelector"], labels) for peer in clients["from"])


def test_cert_manager_issues_its_certificate_for_the_services_name(rendered: list[Obj]) -> None:
    issued = _gate_on((COMPONENT, CERT_MANAGER))
    [certificate] = [
        c for c in _of_kind(issued, "Certificate") if c["spec"]["secretName"] == "tjpipe-status-server-tls"
    ]
    host = urlsplit(_config_map(rendered, "tjpipe-config")["data"]["TJPIPE_STATUS_SERVER_URL"]).hostname
    assert host in certificate["spec"]["dnsNames"]
    # The CA issuer: the Secret gets ca.crt, the CA the planner hands the training pods.
    webhook = _named(issued, "Certificate", "tjpipe-webhook")
    assert certificate["spec"]["issuerRef"] == webhook["spec"]["issuerRef"]


# ------------------------------------------------------------------------------------------ Helm


def test_the_chart_renders_the_components_objects_only_with_the_gate_on(tmp_path: Path) -> None:
    overlay = tool.render_overlay(components=(COMPONENT,), progress=_progress)
    chart = tool.assemble_chart(tmp_path / RELEASE, progress=_progress)
    off = helm_template(chart, release=RELEASE, namespace=RELEASE_NAMESPACE, progress=_progress)
    assert not _ours(off)
    on = helm_template(
        chart,
        release=RELEASE,
        namespace=RELEASE_NAMESPACE,
        extra_args=["--set", "trainJobStatus.enabled=true"],
        progress=_progress,
    )

    def keyed(objects: list[Obj]) -> dict[tuple[str, str], Obj]:
        return {(o["kind"], o["metadata"]["name"]): o for o in _ours(objects)}

    assert sorted(keyed(on)) == sorted((kind, NAME) for kind in ADDED_KINDS)
    assert keyed(on) == keyed(overlay)
    deployment = keyed(on)[("Deployment", NAME)]["spec"]["template"]["spec"]
    assert deployment["containers"][0]["args"] == ["status-server"]
    config = next(c for c in _of_kind(on, "ConfigMap") if c["metadata"]["name"].startswith("tjpipe-config-"))
    assert deployment["containers"][0]["envFrom"] == [{"configMapRef": {"name": config["metadata"]["name"]}}]
    url = urlsplit(config["data"]["TJPIPE_STATUS_SERVER_URL"])
    service = keyed(on)[("Service", NAME)]
    assert (url.hostname, url.port) == (
        f"{NAME}.{service['metadata']['namespace']}.svc",
        service["spec"]["ports"][0]["port"],
    )
    moved = helm_template(
        chart,
        release=RELEASE,
        namespace=RELEASE_NAMESPACE,
        extra_args=[
            "--set",
            "trainJobStatus.enabled=true",
            "--set",
            "image.repository=registry.example/tjpipe",
            "--set-string",
            "image.tag=v9",
        ],
        progress=_progress,
    )
    assert keyed(moved)[("Deployment", NAME)]["spec"]["template"]["spec"]["containers"][0]["image"] == (
        "registry.example/tjpipe:v9"
    )


# ------------------------------------------------------------------------------------ the API server


@pytest.fixture(scope="module")
def api(kube: Any, rendered: list[Obj]) -> Iterator[tuple[Any, dict[str, dict[str, tuple[str, bool]]]]]:
    yield from _client_with(kube, [_named(rendered, "Namespace", NAMESPACE)])


@pytest.mark.cluster
def test_the_api_server_accepts_every_object(
    rendered: list[Obj], api: tuple[Any, dict[str, dict[str, tuple[str, bool]]]]
) -> None:
    client, known = api
    assert _dry_run_each(client, known, _ours(rendered)) == ([], [])


@pytest.mark.cluster
def test_the_authorizer_gives_it_what_the_server_does_and_nothing_else(
    kube: Any, rendered: list[Obj], api: tuple[Any, dict[str, dict[str, tuple[str, bool]]]]
) -> None:
    with rbac_applied(kube, api, _ours(rendered)) as allowed:
        assert sorted(p for p in NEEDS if not allowed(NAME, p)) == []
        others = set().union(*_expected_permissions().values()) | PROBES
        others |= {
            ("authorization.k8s.io", "subjectaccessreviews", "create"),
            ("", "pods", "list"),
            ("trainer.kubeflow.org", "trainjobs", "list"),
            ("", "serviceaccounts/token", "create"),
        }
        assert sorted(p for p in others - NEEDS if allowed(NAME, p)) == []
