"""deploy/: the admission webhook (two replicas, a PodDisruptionBudget, a Service, failurePolicy Fail) and the
Kubeflow SDK's version ConfigMap, checked against the code that serves and registers them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as kube_client

from planner import admission
from tjpipe.local import admission_webhook
from tjpipe.local.kustomize import kustomize_build

from . import REPO, cli_env_names

BASE = REPO / "deploy" / "base"
PUBLIC = REPO / "deploy" / "kubeflow-trainer-public"
NAMESPACE = "trainjob-pipeline"
WEBHOOK_LABELS = {"app.kubernetes.io/name": "trainjob-pipeline", "app.kubernetes.io/component": "webhook"}

Obj = dict[str, Any]


@pytest.fixture(scope="module")
def base() -> list[Obj]:
    return kustomize_build(BASE, progress=lambda line: print(f"[tjpipe] {line}", flush=True))


def _one(objects: list[Obj], kind: str, name: str) -> Obj:
    [found] = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


def test_the_configuration_is_the_one_tjpipe_up_registers(base: list[Obj]) -> None:
    """Same webhooks, rules, failurePolicy Fail and opt-out label; only the client is a Service, not a URL."""
    rendered = _one(base, "ValidatingWebhookConfiguration", admission_webhook.CONFIGURATION_NAME)
    service = {"name": "tjpipe-webhook", "namespace": NAMESPACE, "port": 443}
    expected = admission_webhook.webhook_configuration(ca_bundle=None, service=service)
    rendered["metadata"].pop("labels", None)
    assert rendered == expected
    assert {w["failurePolicy"] for w in rendered["webhooks"]} == {"Fail"}
    assert {w["clientConfig"]["service"]["path"] for w in rendered["webhooks"]} == {
        admission.PATH_TRAINJOB,
        admission.PATH_TRAINING_RUNTIME,
        admission.PATH_CLUSTER_TRAINING_RUNTIME,
    }


def test_two_replicas_a_pdb_and_a_service_in_front(base: list[Obj]) -> None:
    deployment = _one(base, "Deployment", "tjpipe-webhook")
    assert deployment["spec"]["replicas"] == 2
    pod = deployment["spec"]["template"]
    assert WEBHOOK_LABELS.items() <= pod["metadata"]["labels"].items()
    pdb = _one(base, "PodDisruptionBudget", "tjpipe-webhook")
    assert pdb["spec"]["minAvailable"] == 1 and pdb["spec"]["selector"]["matchLabels"] == WEBHOOK_LABELS
    [container] = pod["spec"]["containers"]
    assert container["args"] == ["webhook"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    service = _one(base, "Service", "tjpipe-webhook")
    assert service["spec"]["selector"] == WEBHOOK_LABELS
    [port] = service["spec"]["ports"]
    assert (port["port"], ports[port["targetPort"]]) == (443, 9443)
    env = {e["name"]: e["value"] for e in container["env"]}
    assert set(env) <= cli_env_names()["webhook"], "the webhook does not read some of these"
    assert env["TJPIPE_WEBHOOK_PORT"] == "9443"
    assert env["TJPIPE_METRICS_PORT"] == str(ports["metrics"])
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        assert container[probe]["httpGet"] == {"path": path, "port": "metrics"}
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    tls = mounts["webhook-tls"]
    assert tls["readOnly"] is True
    for name in ("TJPIPE_WEBHOOK_TLS_CERT", "TJPIPE_WEBHOOK_TLS_KEY"):
        assert Path(env[name]).parent == Path(tls["mountPath"])
    [volume] = [v for v in pod["spec"]["volumes"] if v["name"] == "webhook-tls"]
    assert volume["secret"]["secretName"] == "tjpipe-webhook-tls" and volume["secret"]["defaultMode"] == 0o440
    policy = _one(base, "NetworkPolicy", "tjpipe-webhook")["spec"]
    assert policy["podSelector"]["matchLabels"] == WEBHOOK_LABELS
    assert {p["port"] for rule in policy["ingress"] for p in rule["ports"]} == {9443, 9090}
    assert {p["port"] for rule in policy["egress"] for p in rule["ports"]} == {443, 6443, 53}


def test_the_sdk_version_configmap_renders_in_kubeflow_system() -> None:
    objects = kustomize_build(PUBLIC, progress=lambda _: None)
    configmap = _one(objects, "ConfigMap", admission_webhook.PUBLIC_CONFIGMAP)
    assert configmap["metadata"]["namespace"] == admission_webhook.PUBLIC_NAMESPACE
    assert configmap["data"] == {admission_webhook.PUBLIC_VERSION_KEY: admission_webhook.TRAINER_VERSION}
    assert not [o for o in objects if o["kind"] == "Namespace"], "Kubeflow's namespace is not ours to delete"
    role = _one(objects, "Role", admission_webhook.PUBLIC_CONFIGMAP)
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["kubeflow-trainer-public"], "verbs": ["get"]}
    ]


@pytest.fixture
def kubeflow_system(kube: Any) -> Iterator[Any]:
    with kube.api_client() as api_client:
        core = kube_client.CoreV1Api(api_client)
        try:
            core.create_namespace(kube_client.V1Namespace(metadata=kube_client.V1ObjectMeta(name="kubeflow-system")))
        except kube_client.ApiException as exc:
            if exc.status != 409:
                raise
        yield api_client


@pytest.mark.cluster
def test_the_api_server_accepts_the_sdk_version_objects(kubeflow_system: Any) -> None:
    from tjpipe.local.crds import apply_objects

    objects = kustomize_build(PUBLIC, progress=lambda _: None)
    apply_objects(kubeflow_system, objects, field_manager="tjpipe-deploy-test")
    cm = kube_client.CoreV1Api(kubeflow_system).read_namespaced_config_map("kubeflow-trainer-public", "kubeflow-system")
    assert cm.data == {"kubeflow_trainer_version": "v2.3.0"}
