"""``tjpipe webhook`` as ``tjpipe up`` runs it, on a private kube-apiserver: the apiserver calls it over TLS
(generated CA, failurePolicy Fail) and refuses what Trainer v2.3.0's webhooks refuse, with Trainer's messages.

A private apiserver because the configuration is cluster-wide with failurePolicy Fail: no other test package
must see it (some create invalid TrainJobs on purpose, to watch the after-the-fact ValidationFailed).
"""

from __future__ import annotations

import copy
import json
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes.client import AdmissionregistrationV1Api, ApiClient, CoreV1Api, CustomObjectsApi
from kubernetes.client.exceptions import ApiException

from tjpipe.local import admission_webhook
from tjpipe.local.crds import crd_manifests, install_crds
from tjpipe.local.kubeapi import new_api_client, start_kube
from tjpipe.local.procs import http_ok
from tjpipe.local.stack import Stack, StatePaths

pytestmark = pytest.mark.cluster

GROUP, VERSION = "trainer.kubeflow.org", "v1alpha1"
NAMESPACE = "default"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    root = tmp_path_factory.mktemp("webhook")
    kube = start_kube(
        work_dir=root / "kube", log_dir=root / "logs", kubeconfig_path=root / "kubeconfig", progress=lambda _: None
    )
    stack = Stack(paths=StatePaths(root / "stack"), progress=lambda _: None)
    stack.paths.logs.mkdir(parents=True, exist_ok=True)
    stack.kubeconfig = kube.kubeconfig
    try:
        with new_api_client(kube.kubeconfig) as api:
            install_crds(api, crd_manifests(progress=lambda _: None))
        stack.install_runtime("torch-distributed")
        stack.start_webhook()
        yield stack
    finally:
        logs = {p.name: p.log_tail(20) for p in stack.services}
        stack.stop()
        kube.stop()
        for name, tail in logs.items():
            print(f"--- {name} ---\n{tail}")


@pytest.fixture
def api(stack: Stack) -> Iterator[ApiClient]:
    assert stack.kubeconfig is not None
    with new_api_client(stack.kubeconfig) as client:
        yield client


def trainjob(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TrainJob",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"runtimeRef": {"name": "torch-distributed"}, **spec},
    }


def create(api: ApiClient, obj: dict[str, Any]) -> Any:
    return CustomObjectsApi(api).create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, "trainjobs", obj)


def refusal(call: Any) -> str:
    with pytest.raises(ApiException) as caught:
        call()
    assert caught.value.status in (400, 403, 422), caught.value.body
    message: str = json.loads(str(caught.value.body))["message"]
    return message


DENIED = 'admission webhook "validator.trainjob.trainer.kubeflow.org" denied the request: '


def test_a_valid_trainjob_is_admitted(api: ApiClient) -> None:
    created = create(api, trainjob("valid", trainer={"numNodes": 2}))
    assert created["metadata"]["name"] == "valid"


def test_reserved_env_is_refused_with_trainers_message(api: ApiClient) -> None:
    message = refusal(lambda: create(api, trainjob("pet", trainer={"env": [{"name": "PET_NNODES", "value": "2"}]})))
    assert message == DENIED + (
        'spec.trainer.env: Invalid value: [{"name":"PET_NNODES","value":"2"}]: '
        "must not have reserved envs, invalid envs configured: [PET_NNODES]"
    )


def test_zero_nodes_is_refused(api: ApiClient) -> None:
    message = refusal(lambda: create(api, trainjob("zero", trainer={"numNodes": 0})))
    assert message == DENIED + "spec.trainer.numNodes: Invalid value: 0: must be greater than or equal to 1"


def test_a_missing_runtime_is_refused(api: ApiClient) -> None:
    job = trainjob("lost")
    job["spec"]["runtimeRef"] = {"name": "no-such-runtime"}
    message = refusal(lambda: create(api, job))
    assert message == DENIED + (
        'spec.RuntimeRef: Invalid value: {"name":"no-such-runtime","apiGroup":"trainer.kubeflow.org",'
        '"kind":"ClusterTrainingRuntime"}: clustertrainingruntimes.trainer.kubeflow.org "no-such-runtime" not found: '
        "specified clusterTrainingRuntime must be created before the TrainJob is created"
    )


PATCH = {"manager": "example.com/tool", "trainingRuntimeSpec": {"template": {"metadata": {"labels": {"a": "b"}}}}}


def test_runtime_patches_change_on_a_running_job_is_refused(api: ApiClient) -> None:
    custom = CustomObjectsApi(api)
    create(api, trainjob("running", trainer={"numNodes": 1}))
    live: dict[str, Any] = custom.get_namespaced_custom_object(GROUP, VERSION, NAMESPACE, "trainjobs", "running")  # type: ignore[assignment]
    changed = copy.deepcopy(live)
    changed["spec"]["runtimePatches"] = [PATCH]
    message = refusal(
        lambda: custom.replace_namespaced_custom_object(GROUP, VERSION, NAMESPACE, "trainjobs", "running", changed)
    )
    assert message == DENIED + (
        "spec.runtimePatches: Forbidden: RuntimePatches can only be modified when the TrainJob is suspended "
        "before or after the update"
    )
    # The same change together with suspending is admitted (no JobSet exists here).
    changed["spec"]["suspend"] = True
    custom.replace_namespaced_custom_object(GROUP, VERSION, NAMESPACE, "trainjobs", "running", changed)


def test_an_invalid_cluster_training_runtime_is_refused(api: ApiClient) -> None:
    runtime = admission_webhook.runtime_the_webhook_refuses("two-trainers")
    custom = CustomObjectsApi(api)
    message = refusal(lambda: custom.create_cluster_custom_object(GROUP, VERSION, "clustertrainingruntimes", runtime))
    assert message == (
        'admission webhook "validator.clustertrainingruntime.trainer.kubeflow.org" denied the request: '
        "spec.template.spec.replicatedJobs[0].replicas: Invalid value: 2: always must be 1"
    )
    # Trainer's opt-out label keeps the webhook away (objectSelector), as in Trainer's manifests.
    runtime["metadata"]["labels"] = {"trainer.kubeflow.org/webhook-validation": "disabled"}
    custom.create_cluster_custom_object(GROUP, VERSION, "clustertrainingruntimes", runtime)


def test_the_sdk_version_configmap_and_the_health_endpoints(api: ApiClient, stack: Stack) -> None:
    cm = CoreV1Api(api).read_namespaced_config_map("kubeflow-trainer-public", "kubeflow-system")
    assert cm.data == {"kubeflow_trainer_version": admission_webhook.TRAINER_VERSION}

    port = stack.metrics_ports["webhook"]
    for path in ("/healthz", "/readyz", "/metrics"):
        assert http_ok(f"http://127.0.0.1:{port}{path}"), path

    text = (
        urllib.request.build_opener(urllib.request.ProxyHandler({}))
        .open(f"http://127.0.0.1:{port}/metrics", timeout=5)
        .read()
        .decode()
    )
    assert 'tjpipe_admission_reviews_total{kind="TrainJob",outcome="denied"}' in text
    # The standard collectors and the build info, labelled with the service (never a `service` label).
    lines = text.splitlines()
    assert any(line.startswith("process_resident_memory_bytes ") for line in lines)
    assert any(line.startswith('python_info{implementation="CPython"') for line in lines)
    (build_info,) = [line for line in lines if line.startswith("tjpipe_build_info{")]
    assert 'tjpipe_service="webhook"' in build_info and build_info.endswith(" 1.0")
    assert not [line for line in lines if 'service="' in line.replace('tjpipe_service="', "")]


def test_the_configuration_fails_closed_and_calls_the_stacks_url(api: ApiClient, stack: Stack) -> None:
    config = AdmissionregistrationV1Api(api).read_validating_webhook_configuration(admission_webhook.CONFIGURATION_NAME)
    webhooks = config.webhooks or []
    assert len(webhooks) == 3
    assert {w.failure_policy for w in webhooks} == {"Fail"}
    assert {w.side_effects for w in webhooks} == {"None"}
    assert all(str(w.client_config.url).startswith(stack.webhook_url) for w in webhooks)
