"""The ``history-server`` component: its Deployment, Service, ServiceAccount, NetworkPolicy and RBAC.

Rendered as ``deploy/overlays/history-server`` (the base with the component): the pod runs
``tjpipe history-server`` with the variables it reads, the read-only NATS identity, the log-keeper identity and
TLS; the authorizer gives its ServiceAccount TokenReviews and SubjectAccessReviews, and for keeping pod logs
JobSet get, pods list and pods/log get, and nothing else (not even a TrainJob);
the API server accepts every object; and the Kubeflow install takes the component the same way.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tjpipe.local.helm import helm_template
from tjpipe.local.kustomize import kustomize_build

from . import REPO, cli_env_names, unset_settings
from .test_kubeflow_install import RELEASE, RELEASE_NAMESPACE, tool
from .test_kustomize import (
    NAMESPACE,
    PROBES,
    Obj,
    _client_with,
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

OVERLAY = REPO / "deploy" / "overlays" / "history-server"
COMPONENT = REPO / "deploy" / "components" / "history-server"
NAME = "tjpipe-history-server"
REVIEWS = {
    ("authentication.k8s.io", "tokenreviews", "create"),
    ("authorization.k8s.io", "subjectaccessreviews", "create"),
}
KEEPING_LOGS = {("jobset.x-k8s.io", "jobsets", "get"), ("", "pods", "list"), ("", "pods/log", "get")}


@pytest.fixture(scope="module")
def rendered() -> list[Obj]:
    return kustomize_build(OVERLAY, progress=_progress)


def test_the_component_adds_its_own_objects_to_the_base(rendered: list[Obj]) -> None:
    base = kustomize_build(REPO / "deploy" / "base", progress=_progress)
    added = {(o["kind"], o["metadata"]["name"]) for o in rendered} - {(o["kind"], o["metadata"]["name"]) for o in base}
    assert added == {
        (kind, NAME)
        for kind in (
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "Deployment",
            "Service",
            "PodDisruptionBudget",
            "NetworkPolicy",
        )
    }
    for obj in rendered:
        if obj["metadata"]["name"] == NAME and obj["kind"] not in ("ClusterRole", "ClusterRoleBinding"):
            assert obj["metadata"]["namespace"] == NAMESPACE, obj["kind"]
        assert obj["metadata"]["labels"]["app.kubernetes.io/part-of"] == "trainjob-pipeline"


def test_the_pod_runs_the_server_as_reader_over_tls_locked_down(rendered: list[Obj]) -> None:
    deployment = _named(rendered, "Deployment", NAME)
    pod = deployment["spec"]["template"]["spec"]
    assert _selects(deployment["spec"]["selector"], deployment["spec"]["template"]["metadata"]["labels"])
    assert pod["serviceAccountName"] == NAME and pod["securityContext"]["runAsNonRoot"] is True
    [container] = pod["containers"]
    webhook = _named(rendered, "Deployment", "tjpipe-webhook")["spec"]["template"]["spec"]["containers"][0]
    assert container["args"] == ["history-server"] and container["image"] == webhook["image"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert set(env) <= cli_env_names()["history-server"], set(env) - cli_env_names()["history-server"]
    assert unset_settings("history-server", env, container["args"], in_cluster=True) == []
    assert env["TJPIPE_HISTORY_LISTEN"] == "0.0.0.0:8443" and env["TJPIPE_HISTORY_TLS_CERT"].endswith("tls.crt")
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        assert container[probe]["httpGet"] == {"path": path, "port": "https", "scheme": "HTTPS"}
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    volumes = {v["name"]: v for v in pod["volumes"]}
    secrets = {v["secret"]["secretName"] for v in volumes.values() if "secret" in v}
    assert secrets == {"tjpipe-reader-nats-creds", "tjpipe-log-keeper-nats-creds", "nats-tls", "tjpipe-history-tls"}
    assert volumes["nats-ca"]["secret"]["items"] == [{"key": "ca.crt", "path": "ca.crt"}]
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert volumes[mounts[env["NATS_CREDS"].rsplit("/", 1)[0]]]["secret"]["secretName"] == "tjpipe-reader-nats-creds"
    keeper = volumes[mounts[env["TJPIPE_HISTORY_LOGS_CREDS"].rsplit("/", 1)[0]]]
    assert keeper["secret"]["secretName"] == "tjpipe-log-keeper-nats-creds"
    service = _named(rendered, "Service", NAME)
    assert _selects({"matchLabels": service["spec"]["selector"]}, deployment["spec"]["template"]["metadata"]["labels"])


def test_its_network_policy_lets_users_in_and_it_out_to_nats_and_the_api_server_only(rendered: list[Obj]) -> None:
    labels = _named(rendered, "Deployment", NAME)["spec"]["template"]["metadata"]["labels"]
    [policy] = [
        p
        for p in _of_kind(rendered, "NetworkPolicy")
        if p["spec"]["podSelector"] and _selects(p["spec"]["podSelector"], labels)
    ]
    assert _ports(policy["spec"]["ingress"]) == {(8443, "TCP")}
    assert _ports(policy["spec"]["egress"]) == {(4222, "TCP"), (443, "TCP"), (6443, "TCP"), (53, "UDP"), (53, "TCP")}
    nats = _named(rendered, "NetworkPolicy", "nats")["spec"]
    assert _selects(nats["podSelector"], _nats_pod_labels(rendered))
    [clients] = [rule for rule in nats["ingress"] if _ports([rule]) == {(4222, "TCP")}]
    assert any(_selects(peer["podSelector"], labels) for peer in clients["from"])


@pytest.fixture(scope="module")
def api(kube: Any, rendered: list[Obj]) -> Iterator[tuple[Any, dict[str, dict[str, tuple[str, bool]]]]]:
    yield from _client_with(kube, [_named(rendered, "Namespace", NAMESPACE)])


@pytest.mark.cluster
def test_the_api_server_accepts_every_object(
    rendered: list[Obj], api: tuple[Any, dict[str, dict[str, tuple[str, bool]]]]
) -> None:
    client, known = api
    assert _dry_run_each(client, known, rendered) == ([], [])


@pytest.mark.cluster
def test_the_authorizer_gives_it_the_two_reviews_and_what_keeping_logs_needs_and_nothing_else(
    kube: Any, rendered: list[Obj], api: tuple[Any, dict[str, dict[str, tuple[str, bool]]]]
) -> None:
    with rbac_applied(kube, api, rendered) as allowed:
        assert sorted(p for p in REVIEWS | KEEPING_LOGS if not allowed(NAME, p)) == []
        others = set().union(*_expected_permissions().values()) | PROBES
        others |= {("", "pods", "get"), ("", "pods", "watch"), ("", "secrets", "get"), ("", "pods/exec", "create")}
        others |= {("jobset.x-k8s.io", "jobsets", "list"), ("jobset.x-k8s.io", "jobsets", "watch")}
        others -= KEEPING_LOGS
        others |= {("trainer.kubeflow.org", "trainjobs", "get"), ("trainer.kubeflow.org", "trainjobs", "list")}
        assert sorted(p for p in others if allowed(NAME, p)) == []


def test_the_kubeflow_install_and_its_helm_chart_take_the_component_too(tmp_path: Path) -> None:
    objects = tool.render_overlay(components=(COMPONENT,), progress=_progress)
    assert (NAMESPACE, NAME) in {
        (d["metadata"]["namespace"], d["metadata"]["name"]) for d in _of_kind(objects, "Deployment")
    }
    chart = tool.assemble_chart(tmp_path / "chart", components=(COMPONENT,), progress=_progress)
    rendered = helm_template(
        chart,
        release=RELEASE,
        namespace=RELEASE_NAMESPACE,
        extra_args=["--set", "image.repository=registry.example/tjpipe", "--set", "image.tag=v9"],
        progress=_progress,
    )
    deployment = _named(rendered, "Deployment", NAME)
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] == "registry.example/tjpipe:v9"
    assert _named(rendered, "ClusterRole", NAME)["rules"] == _named(objects, "ClusterRole", NAME)["rules"]
