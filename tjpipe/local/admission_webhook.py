"""``tjpipe webhook`` on the local stack: its ValidatingWebhookConfiguration, registered on the local apiserver.

The configuration is Trainer v2.3.0's own ``validator.trainer.kubeflow.org`` (the same webhook names,
rules, ``failurePolicy: Fail``, ``sideEffects: None`` and the ``webhook-validation: disabled`` opt-out for
runtimes) pointed at ``https://127.0.0.1:PORT`` with a CA made per start (``tjpipe.keys.pki``), as the
JobSet manager's webhooks are. deploy/ declares the same webhooks against an in-cluster Service.

Also here: the ConfigMap ``kubeflow-system/kubeflow-trainer-public`` that the Kubeflow SDK reads at client
start (key ``kubeflow_trainer_version``) to learn which Trainer release the control plane speaks; without
it every ``TrainerClient()`` logs a warning. This project answers as the Trainer release it matches.
"""

from __future__ import annotations

import base64
from typing import Any

from kubernetes.client import ApiClient, CustomObjectsApi
from kubernetes.client.exceptions import ApiException

from tjpipe.contracts import trainer as t
from tjpipe.local.crds import apply_objects
from tjpipe.local.procs import ManagedProcess, wait_until
from tjpipe.local.registrations import registered_for
from tjpipe.planner import admission

PROCESS_NAME = "webhook"
"""The stack's ``tjpipe webhook`` process, which the configuration registered by ``register`` is for."""
CONFIGURATION_NAME = "tjpipe-validator.trainer.kubeflow.org"
"""Not Trainer's own name, so that installing it never silently replaces (or is replaced by) Trainer's."""
SETUP_FIELD_MANAGER = "tjpipe-webhook-setup"
TRAINER_VERSION = "v2.3.0"
PUBLIC_NAMESPACE = "kubeflow-system"
PUBLIC_CONFIGMAP = "kubeflow-trainer-public"
PUBLIC_VERSION_KEY = "kubeflow_trainer_version"
_ADMITS_TIMEOUT_SECONDS = 30.0

_WEBHOOKS = (
    ("validator.trainjob.trainer.kubeflow.org", admission.PATH_TRAINJOB, "trainjobs", ("CREATE", "UPDATE"), False),
    (
        "validator.trainingruntime.trainer.kubeflow.org",
        admission.PATH_TRAINING_RUNTIME,
        "trainingruntimes",
        ("CREATE", "UPDATE"),  # as Trainer registers it; its update is admitted unchecked
        True,
    ),
    (
        "validator.clustertrainingruntime.trainer.kubeflow.org",
        admission.PATH_CLUSTER_TRAINING_RUNTIME,
        "clustertrainingruntimes",
        ("CREATE", "UPDATE"),
        True,
    ),
)
"""(webhook name, path, resource, operations, honours the webhook-validation opt-out label)."""


def webhook_configuration(
    *, ca_bundle: bytes | None, url: str | None = None, service: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The ValidatingWebhookConfiguration, calling ``url`` (``https://host:port``) or an in-cluster ``service``
    (``{"name", "namespace", "port"}``); without ``ca_bundle`` (deploy/: injected later), no caBundle."""
    webhooks = []
    for name, path, resource, operations, opt_out in _WEBHOOKS:
        client_config: dict[str, Any] = {}
        if ca_bundle is not None:
            client_config["caBundle"] = base64.b64encode(ca_bundle).decode()
        if url is not None:
            client_config["url"] = url + path
        else:
            client_config["service"] = {**(service or {}), "path": path}
        webhook: dict[str, Any] = {
            "name": name,
            "admissionReviewVersions": ["v1"],
            "clientConfig": client_config,
            "failurePolicy": "Fail",
            "sideEffects": "None",
            "rules": [
                {
                    "apiGroups": [t.GROUP],
                    "apiVersions": [t.VERSION],
                    "operations": list(operations),
                    "resources": [resource],
                }
            ],
        }
        if opt_out:
            webhook["objectSelector"] = {
                "matchExpressions": [
                    {"key": t.LABEL_WEBHOOK_VALIDATION, "operator": "NotIn", "values": [t.WEBHOOK_VALIDATION_DISABLED]}
                ]
            }
        webhooks.append(webhook)
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": CONFIGURATION_NAME},
        "webhooks": webhooks,
    }


def trainer_public_objects() -> list[dict[str, Any]]:
    """The ``kubeflow-system`` namespace and the SDK's version ConfigMap in it."""
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": PUBLIC_NAMESPACE}},
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": PUBLIC_CONFIGMAP, "namespace": PUBLIC_NAMESPACE},
            "data": {PUBLIC_VERSION_KEY: TRAINER_VERSION},
        },
    ]


def register(api_client: ApiClient, *, url: str, ca_bundle: bytes, process: ManagedProcess | None = None) -> None:
    """Apply the configuration and wait until the apiserver calls it (a bad runtime, dry-run, is refused)."""
    configuration = registered_for(PROCESS_NAME, webhook_configuration(url=url, ca_bundle=ca_bundle))
    apply_objects(api_client, [configuration], field_manager=SETUP_FIELD_MANAGER)
    wait_until_called(api_client, process)


def wait_until_called(
    api_client: ApiClient, process: ManagedProcess | None, *, timeout: float = _ADMITS_TIMEOUT_SECONDS
) -> None:
    """Until the apiserver calls the registered webhook (a bad runtime, dry-run, is refused)."""
    wait_until(
        lambda: _refuses_bad_runtime(api_client),
        timeout=timeout,
        what="the apiserver to call tjpipe webhook for a dry-run ClusterTrainingRuntime",
        process=process,
    )


def runtime_the_webhook_refuses(name: str) -> dict[str, Any]:
    """A ClusterTrainingRuntime with two replicas of the trainer job, which Trainer's validator refuses
    ("always must be 1") and for nothing else: the readiness probe below, and the tests' example of a refusal."""
    return {
        "apiVersion": t.API_VERSION,
        "kind": t.CLUSTER_TRAINING_RUNTIME_KIND,
        "metadata": {"name": name},
        "spec": {
            "template": {
                "spec": {
                    "replicatedJobs": [
                        {
                            "name": "node",
                            "replicas": 2,
                            "template": {
                                "metadata": {"labels": {t.LABEL_TRAINJOB_ANCESTOR: t.ANCESTOR_TRAINER}},
                                "spec": {"template": {"spec": {"containers": [{"name": "node", "image": "x"}]}}},
                            },
                        }
                    ]
                }
            }
        },
    }


def _refuses_bad_runtime(api_client: ApiClient) -> bool:
    probe = runtime_the_webhook_refuses("tjpipe-webhook-probe")
    try:
        CustomObjectsApi(api_client).create_cluster_custom_object(
            t.GROUP, t.VERSION, "clustertrainingruntimes", probe, dry_run="All"
        )
    except ApiException as exc:
        return "validator.clustertrainingruntime.trainer.kubeflow.org" in str(exc.body)
    return False
