"""The ``one-process`` component: one ``tjpipe controller`` Deployment instead of the three services.

Rendered as ``deploy/overlays/one-process`` (the base with the component), its variables must be the ones
``tjpipe controller`` reads, each stage's identity and key must point into that stage's own Secret, its one
ServiceAccount must get exactly the watcher's and the applier's rights, and the API server must accept
every object. Added to the Kubeflow overlay, it must replace the services there the same way.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tjpipe.local.helm import helm_template
from tjpipe.local.kustomize import kustomize_build

from . import REPO, cli_env_names
from .test_kubeflow_install import RELEASE, RELEASE_NAMESPACE, _by_key, tool
from .test_kustomize import (
    CLUSTER_SCOPED,
    METRICS_PORT,
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

ONE_PROCESS = REPO / "deploy" / "overlays" / "one-process"
COMPONENT = REPO / "deploy" / "components" / "one-process"
STAGES = ("watcher", "planner", "applier")


@pytest.fixture(scope="module")
def one_process() -> list[Obj]:
    return kustomize_build(ONE_PROCESS, progress=_progress)


def _pod(objects: list[Obj]) -> Obj:
    pod: Obj = _named(objects, "Deployment", "tjpipe-controller")["spec"]["template"]["spec"]
    return pod


def test_one_controller_replaces_the_three_services_and_everything_only_they_used(one_process: list[Obj]) -> None:
    names = {(obj["kind"], obj["metadata"]["name"]) for obj in one_process}
    for stage in STAGES:
        for kind in ("Deployment", "PodDisruptionBudget", "ServiceAccount", "NetworkPolicy", "ClusterRoleBinding"):
            assert (kind, f"tjpipe-{stage}") not in names, (kind, stage)
    assert {d["metadata"]["name"] for d in _of_kind(one_process, "Deployment")} == {
        "tjpipe-controller",
        "tjpipe-webhook",
    }
    # The base's roles stay as they are: the controller is bound to both.
    assert {r["metadata"]["name"] for r in _of_kind(one_process, "ClusterRole")} == {
        "tjpipe-watcher",
        "tjpipe-applier",
        "tjpipe-webhook",
    }
    for obj in one_process:
        if obj["kind"] not in CLUSTER_SCOPED:
            assert obj["metadata"]["namespace"] == NAMESPACE, f"{obj['kind']} {obj['metadata']['name']}"
        assert obj["metadata"]["labels"]["app.kubernetes.io/part-of"] == "trainjob-pipeline"
    # The admission policies match the controller too: it is a ServiceAccount of the pipeline's namespace.
    assert {p["metadata"]["name"] for p in _of_kind(one_process, "ValidatingAdmissionPolicy")} == {
        "tjpipe-trainjob-components",
        "tjpipe-excluded-namespaces",
    }
    assert _named(one_process, "ServiceAccount", "tjpipe-controller")["metadata"]["namespace"] == NAMESPACE
    deployment = _named(one_process, "Deployment", "tjpipe-controller")
    [pdb] = [
        p
        for p in _of_kind(one_process, "PodDisruptionBudget")
        if _selects(p["spec"]["selector"], deployment["spec"]["template"]["metadata"]["labels"])
    ]
    assert pdb["spec"]["minAvailable"] == 1 < deployment["spec"]["replicas"]


def test_the_controller_pod_is_probed_locked_down_and_reads_only_its_own_variables(one_process: list[Obj]) -> None:
    deployment = _named(one_process, "Deployment", "tjpipe-controller")
    pod = _pod(one_process)
    assert _selects(deployment["spec"]["selector"], deployment["spec"]["template"]["metadata"]["labels"])
    assert pod["serviceAccountName"] == "tjpipe-controller"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    [container] = pod["containers"]
    assert container["args"] == ["controller"]
    webhook = _named(one_process, "Deployment", "tjpipe-webhook")["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == webhook["image"] and container["image"].startswith("trainjob-pipeline:")
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {"metrics": METRICS_PORT}
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        assert container[probe]["httpGet"] == {"path": path, "port": "metrics"}
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    config = _config_map(one_process, "tjpipe-config")
    assert container["envFrom"] == [{"configMapRef": {"name": config["metadata"]["name"]}}]
    reads = cli_env_names()["controller"]
    env = {e["name"] for e in container["env"]}
    assert env <= reads, env - reads
    assert set(config["data"]) - {"TJPIPE_STREAM_REPLICAS"} <= reads | {"TJPIPE_STREAM_REPLICAS"}
    assert "NATS_CREDS" not in env and "TJPIPE_SIGNING_KEY" not in env  # no single identity, no single key


def test_each_stage_s_identity_and_key_point_into_that_stage_s_own_secret(one_process: list[Obj]) -> None:
    pod = _pod(one_process)
    [container] = pod["containers"]
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    sources = {}
    for volume in pod["volumes"]:
        if "secret" in volume:
            sources[volume["name"]] = ("secret", volume["secret"]["secretName"], volume["secret"])
        elif "configMap" in volume:
            sources[volume["name"]] = ("configMap", volume["configMap"]["name"], volume["configMap"])

    def source_of(path: str) -> tuple[str, str]:
        [name] = [n for n, m in mounts.items() if Path(path).parent == Path(m["mountPath"])]
        assert mounts[name]["readOnly"] is True
        kind, source, spec = sources[name]
        if kind == "secret":
            assert spec["defaultMode"] == 0o440
        return kind, source

    for stage in STAGES:
        assert source_of(env[f"TJPIPE_{stage.upper()}_NATS_CREDS"]) == ("secret", f"tjpipe-{stage}-nats-creds")
    for stage in ("watcher", "planner"):
        assert source_of(env[f"TJPIPE_{stage.upper()}_SIGNING_KEY"]) == ("secret", f"tjpipe-{stage}-signing-key")
    for variable, config_map in (
        ("TJPIPE_TRUSTED_EVENT_KEYS", "tjpipe-trusted-event-keys"),
        ("TJPIPE_TRUSTED_PLAN_KEYS", "tjpipe-trusted-plan-keys"),
    ):
        [name] = [n for n, m in mounts.items() if m["mountPath"] == env[variable]]
        assert sources[name][:2] == ("configMap", config_map)
    secrets = {source for kind, source, _ in sources.values() if kind == "secret"}
    assert "tjpipe-admin-nats-creds" not in secrets  # the admin identity stays with the bus set-up Job
    [ca] = [spec for kind, source, spec in sources.values() if source == "nats-tls"]
    assert ca["items"] == [{"key": "ca.crt", "path": "ca.crt"}]  # the NATS server's key is not projected


def test_the_controller_s_network_policy_is_the_watcher_s_and_applier_s(one_process: list[Obj]) -> None:
    labels = _named(one_process, "Deployment", "tjpipe-controller")["spec"]["template"]["metadata"]["labels"]
    policies = _of_kind(one_process, "NetworkPolicy")
    [policy] = [p for p in policies if p["spec"]["podSelector"] and _selects(p["spec"]["podSelector"], labels)]
    spec = policy["spec"]
    assert _ports(spec["ingress"]) == {(METRICS_PORT, "TCP")}
    assert _ports(spec["egress"]) == {(4222, "TCP"), (443, "TCP"), (6443, "TCP"), (53, "UDP"), (53, "TCP")}
    # NATS lets it in: its client rule selects every pipeline pod.
    nats_spec = _named(one_process, "NetworkPolicy", "nats")["spec"]
    assert _selects(nats_spec["podSelector"], _nats_pod_labels(one_process))
    [clients] = [rule for rule in nats_spec["ingress"] if _ports([rule]) == {(4222, "TCP")}]
    assert any(_selects(peer["podSelector"], labels) for peer in clients["from"])


@pytest.fixture(scope="module")
def api(kube: Any, one_process: list[Obj]) -> Iterator[tuple[Any, dict[str, dict[str, tuple[str, bool]]]]]:
    yield from _client_with(kube, [_named(one_process, "Namespace", NAMESPACE)])


@pytest.mark.cluster
def test_the_api_server_accepts_every_object_of_the_overlay(
    one_process: list[Obj], api: tuple[Any, dict[str, dict[str, tuple[str, bool]]]]
) -> None:
    client, known = api
    rejected, warnings = _dry_run_each(client, known, one_process)
    assert rejected == []
    assert warnings == []


@pytest.mark.cluster
def test_the_rbac_authorizer_gives_the_controller_the_watcher_s_and_applier_s_rights_and_no_more(
    kube: Any, one_process: list[Obj], api: tuple[Any, dict[str, dict[str, tuple[str, bool]]]]
) -> None:
    with rbac_applied(kube, api, one_process) as allowed:
        expected = _expected_permissions()
        needed = expected["tjpipe-watcher"] | expected["tjpipe-applier"]
        assert sorted(p for p in needed if not allowed("tjpipe-controller", p)) == []
        others = (expected["tjpipe-webhook"] | PROBES) - needed
        assert sorted(p for p in others if allowed("tjpipe-controller", p)) == []


@pytest.fixture(scope="module")
def kubeflow_one_process() -> list[Obj]:
    """The Kubeflow install with the component, as ``tools/kubeflow_install.py kustomize --one-process``."""
    return tool.render_overlay(components=(COMPONENT,), progress=_progress)  # type: ignore[no-any-return]


def test_the_component_replaces_the_services_in_the_kubeflow_install_too(kubeflow_one_process: list[Obj]) -> None:
    objects = kubeflow_one_process
    deployments = {(d["metadata"]["namespace"], d["metadata"]["name"]) for d in _of_kind(objects, "Deployment")}
    assert deployments == {(NAMESPACE, "tjpipe-controller"), (NAMESPACE, "tjpipe-webhook")}
    services = {f"tjpipe-{s}" for s in STAGES}
    left = [(o["kind"], o["metadata"]["name"]) for o in objects if o["metadata"]["name"] in services]
    # Only the two roles stay, bound now to the controller.
    assert sorted(left) == [("ClusterRole", "tjpipe-applier"), ("ClusterRole", "tjpipe-watcher")]
    crds = {c["metadata"]["name"] for c in _of_kind(objects, "CustomResourceDefinition")}
    assert "trainjobs.trainer.kubeflow.org" in crds
    assert _pod(objects)["serviceAccountName"] == "tjpipe-controller"


def test_the_one_process_chart_renders_the_same_objects(kubeflow_one_process: list[Obj], tmp_path: Path) -> None:
    """``tools/kubeflow_install.py chart DIR --one-process``: Helm users get the same layout."""
    assert tool.main(["chart", str(tmp_path / RELEASE), "--one-process"]) == 0
    rendered = helm_template(tmp_path / RELEASE, release=RELEASE, namespace=RELEASE_NAMESPACE, progress=_progress)
    assert _by_key(rendered) == _by_key(kubeflow_one_process)
    retagged = helm_template(
        tmp_path / RELEASE,
        release=RELEASE,
        namespace=RELEASE_NAMESPACE,
        extra_args=["--set", "image.tag=1.2"],
        progress=_progress,
    )
    assert _pod(retagged)["containers"][0]["image"] == "trainjob-pipeline:1.2"
