"""The TrainJobStatus plugin through ``planner.core.plan``: env, token volume and CA ConfigMap, as Trainer's.

Runtimes here are small hand-written dicts; the golden cases (``trainjob-status*``) check the same plugin
against Trainer v2.3.0's own output with its feature gate on. See ``/work/shared/reference/trainer-v2.3.0.md``
("TrainJobStatus").
"""

from __future__ import annotations

import msgspec
import pytest

from contracts import messages as m
from contracts.labels import MANAGED_BY, MANAGED_BY_LABEL
from planner.framework import Framework
from planner.plugins import REGISTRY, registry
from planner.plugins.trainjobstatus import StatusServer

from .builders import (
    Obj,
    applies_of,
    jobset_of,
    owner_reference,
    plan_with,
    pod_spec,
    replicated_job,
    runtime_dict,
    trainjob_dict,
    trainjob_observed,
)

NAME = "fit"
NAMESPACE = "team-a"
UID = "uid-1"
CA = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
SERVER = StatusServer(url="https://status.example:10443", ca_cert=CA)
ON = Framework(registry(SERVER))
OFF = Framework(REGISTRY)
URL = f"https://status.example:10443/apis/trainer.kubeflow.org/v1alpha1/namespaces/{NAMESPACE}/trainjobs/{NAME}/status"
AUDIENCE = f"trainer.kubeflow.org/v1alpha1/namespaces/{NAMESPACE}/trainjobs/{NAME}/status"
STATUS_ENV = [
    {"name": "KUBEFLOW_TRAINER_SERVER_URL", "value": URL},
    {"name": "KUBEFLOW_TRAINER_SERVER_CA_CERT", "value": "/var/run/secrets/kubeflow/trainer/ca.crt"},
    {"name": "KUBEFLOW_TRAINER_SERVER_TOKEN", "value": "/var/run/secrets/kubeflow/trainer/token"},
]
MOUNT = {"name": "kubeflow-trainer-token", "mountPath": "/var/run/secrets/kubeflow/trainer", "readOnly": True}
VOLUME = {
    "name": "kubeflow-trainer-token",
    "projected": {
        "sources": [
            {"serviceAccountToken": {"audience": AUDIENCE, "expirationSeconds": 3600, "path": "token"}},
            {"configMap": {"name": f"{NAME}-tls-config", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
        ]
    },
}


def runtime(ml_policy: Obj | None = None) -> Obj:
    """An initializer job and a trainer job with a sidecar-ish second container and an init container."""
    return runtime_dict(
        [
            replicated_job(
                "dataset-initializer",
                [{"name": "dataset-initializer", "image": "example.com/init"}],
                ancestor="dataset-initializer",
            ),
            replicated_job(
                "node",
                [
                    {"name": "node", "image": "example.com/train", "env": [{"name": "FROM_RUNTIME", "value": "1"}]},
                    {"name": "metrics", "image": "example.com/metrics"},
                ],
                ancestor="trainer",
                init_containers=[{"name": "warmup", "image": "example.com/warmup"}],
            ),
        ],
        name="plain",
        ml_policy=ml_policy,
    )


def job(trainer: Obj | None = None) -> Obj:
    return trainjob_dict(trainer, name=NAME, namespace=NAMESPACE, uid=UID, runtime="plain")


def planned(framework: Framework, trainer: Obj | None = None, ml_policy: Obj | None = None) -> m.Plan:
    return plan_with(framework, trainjob_observed(job(trainer), runtime(ml_policy), runtime_source="snapshot"))


def test_every_trainer_container_gets_the_server_the_ca_and_the_token() -> None:
    spec = pod_spec(jobset_of(planned(ON)), "node")
    node, metrics = spec["containers"]
    assert node["env"] == [{"name": "FROM_RUNTIME", "value": "1"}, *STATUS_ENV]
    assert metrics["env"] == STATUS_ENV
    assert node["volumeMounts"] == [MOUNT] and metrics["volumeMounts"] == [MOUNT]
    assert spec["volumes"] == [VOLUME]
    (init,) = spec["initContainers"]
    assert "env" not in init and "volumeMounts" not in init  # init containers are left alone, as in Trainer


def test_other_pod_sets_are_left_alone() -> None:
    on, off = jobset_of(planned(ON)), jobset_of(planned(OFF))
    assert pod_spec(on, "dataset-initializer") == pod_spec(off, "dataset-initializer")


def test_the_ca_configmap_is_controlled_by_the_trainjob_and_labelled_for_the_watcher() -> None:
    (message,) = [a for a in applies_of(planned(ON), m.ApplyConfigMap)]
    body = msgspec.to_builtins(message.object)
    assert body == {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": f"{NAME}-tls-config",
            "namespace": NAMESPACE,
            "labels": {MANAGED_BY_LABEL: MANAGED_BY},
            "ownerReferences": [owner_reference(NAME, UID)],
        },
        "data": {"ca.crt": CA},
    }


@pytest.mark.parametrize("ml_policy", [None, {"numNodes": 2, "torch": {"numProcPerNode": "auto"}}])
def test_it_acts_whatever_the_ml_policy(ml_policy: Obj | None) -> None:
    env = pod_spec(jobset_of(planned(ON, ml_policy=ml_policy)), "node")["containers"][0]["env"]
    names = [e["name"] for e in env]
    # After every ML policy's env: the plugin runs last in the ML-policy phase, as Trainer's listing puts it.
    assert names[-3:] == [e["name"] for e in STATUS_ENV]


def test_the_users_env_wins_by_name_as_every_framework_env_does() -> None:
    mine = {"name": "KUBEFLOW_TRAINER_SERVER_URL", "value": "https://mine.example/"}
    env = pod_spec(jobset_of(planned(ON, trainer={"env": [mine]})), "node")["containers"][0]["env"]
    assert mine in env and {"name": "KUBEFLOW_TRAINER_SERVER_URL", "value": URL} not in env


def test_a_runtime_without_a_trainer_pod_set_gets_only_the_configmap() -> None:
    rt = runtime_dict([replicated_job("work", [{"name": "work", "image": "example.com/w"}])], name="plain")
    p = plan_with(ON, trainjob_observed(job(), rt, runtime_source="snapshot"))
    assert "volumes" not in pod_spec(jobset_of(p), "work")
    assert [a.object.metadata.name for a in applies_of(p, m.ApplyConfigMap)] == [f"{NAME}-tls-config"]


def test_off_the_plan_has_none_of_it() -> None:
    p = planned(OFF)
    assert not applies_of(p, m.ApplyConfigMap)
    assert "KUBEFLOW_TRAINER" not in msgspec.json.encode(p).decode()


def test_the_registry_takes_the_plugin_only_when_given_the_server_and_puts_it_last() -> None:
    assert "trainjobstatus" not in dict(REGISTRY)
    assert [name for name, _ in registry(SERVER)] == [name for name, _ in REGISTRY] + ["trainjobstatus"]


@pytest.mark.parametrize(
    ("url", "ca"), [("http://status.example", CA), ("https://status.example", "")], ids=["not https", "no CA"]
)
def test_a_server_without_https_or_ca_is_refused(url: str, ca: str) -> None:
    with pytest.raises(ValueError):
        StatusServer(url=url, ca_cert=ca)
