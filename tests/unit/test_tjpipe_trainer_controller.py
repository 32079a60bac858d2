"""Trainer's shipped configuration, placed on loopback: only the listeners, leader election and certificate
management change; concurrency and client limits stay as shipped."""

from __future__ import annotations

from typing import Any

from tjpipe.local.trainer_controller import LEADER_ELECTION_NAMESPACE, local_configuration

SHIPPED: dict[str, Any] = {
    "apiVersion": "config.trainer.kubeflow.org/v1alpha1",
    "kind": "Configuration",
    "health": {"healthProbeBindAddress": ":8081", "readinessEndpointName": "readyz"},
    "metrics": {"bindAddress": ":8443", "secureServing": True},
    "webhook": {"port": 9443, "host": ""},
    "leaderElection": {"leaderElect": True, "resourceName": "trainer.kubeflow.org", "resourceNamespace": ""},
    "controller": {"groupKindConcurrency": {"TrainJob.trainer.kubeflow.org": 5}},
    "certManagement": {"enable": True, "webhookServiceName": "svc"},
    "clientConnection": {"qps": 50, "burst": 100},
}


def test_listeners_go_to_loopback_and_the_rest_stays_as_shipped() -> None:
    config = local_configuration(SHIPPED, health_port=1, metrics_port=2, webhook_port=3, leader_elect=False)
    assert config["health"] == {"healthProbeBindAddress": "127.0.0.1:1", "readinessEndpointName": "readyz"}
    assert config["metrics"] == {"bindAddress": "127.0.0.1:2", "secureServing": False}
    assert config["webhook"] == {"port": 3, "host": "127.0.0.1"}
    assert config["leaderElection"]["leaderElect"] is False
    assert config["certManagement"] == {"enable": False, "webhookServiceName": "svc"}
    for key in ("apiVersion", "kind", "controller", "clientConnection"):
        assert config[key] == SHIPPED[key]
    assert SHIPPED["metrics"]["secureServing"] is True  # the input is not changed


def test_leader_election_gets_a_namespace_outside_a_cluster() -> None:
    config = local_configuration(SHIPPED, health_port=1, metrics_port=2, webhook_port=3, leader_elect=True)
    assert config["leaderElection"]["leaderElect"] is True
    assert config["leaderElection"]["resourceNamespace"] == LEADER_ELECTION_NAMESPACE


def test_feature_gates_and_the_status_server_port_are_set_only_when_asked() -> None:
    plain = local_configuration(SHIPPED, health_port=1, metrics_port=2, webhook_port=3, leader_elect=False)
    assert "featureGates" not in plain and "statusServer" not in plain
    shipped = {**SHIPPED, "statusServer": {"port": 10443, "qps": 5, "burst": 10}}
    config = local_configuration(
        shipped,
        health_port=1,
        metrics_port=2,
        webhook_port=3,
        leader_elect=False,
        feature_gates={"TrainJobStatus": True},
        status_server_port=4,
    )
    assert config["featureGates"] == {"TrainJobStatus": True}
    assert config["statusServer"] == {"port": 4, "qps": 5, "burst": 10}  # its client limits stay as shipped
