"""Kubeflow Trainer v2.3.0's own controller manager, run as a local process against a local kube-apiserver.

Why run the real thing: the pipeline claims to replace it. The takeover test (Trainer reconciles, then the
pipeline takes over, then the reverse) and the benchmark's reference column need Trainer's controller as
users run it, not a model of it. It is built from Trainer's Go module at the pinned tag
(``toolchain.ensure_trainer_controller``).

Its settings are the shipped ones, read from the module's ``manifests/base/manager/
controller_manager_config.yaml`` at start (TrainJob concurrency 5, runtimes 1, client qps 50, burst 100)
and its log level from the shipped Deployment patch (``--zap-log-level=2``). Only what places it on this
machine is changed:

- health, metrics and webhook listeners bind 127.0.0.1 on free ports; metrics are plain HTTP
  (``secureServing: false``), so a loopback scrape needs no token;
- leader election is off by default (one replica; outside a cluster it has no namespace to hold its
  Lease in, and a Lease renewal every 2 s would show up in every write count); ``leader_elect=True``
  turns it on in ``kubeflow-system`` for whoever wants to pay for it;
- certificate management is off: Trainer's internal rotation writes a Secret and patches the webhook
  configurations for an in-cluster Service that does not exist here.

Webhooks are served and registered, not disabled: Trainer has no flag to turn them off
(``webhooks.Setup`` always runs and ``/readyz`` waits for the webhook server). A serving certificate for
127.0.0.1 signed by a CA made per start (``tjpipe.keys.pki``) goes where controller-runtime looks by
default (``$TMPDIR/k8s-webhook-server/serving-certs``; ``TMPDIR`` points into the work directory), and
Trainer's own ``defaulter.trainer.kubeflow.org`` and ``validator.trainer.kubeflow.org``, rendered by
kustomize from the module's ``manifests/base/webhook``, are registered with only the Service reference
replaced by ``https://127.0.0.1:PORT``. So TrainJobs created while it runs are defaulted and validated
exactly as in a Trainer installation. ``stop()`` removes both configurations by default: with
``failurePolicy: Fail`` they would refuse every TrainJob create and update once the process is gone,
which is the first step of replacing Trainer (docs/deploying.md, "Replacing Trainer's controller").
"""

from __future__ import annotations

import base64
import copy
import re
import time
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes.client import AdmissionregistrationV1Api, ApiClient, CustomObjectsApi
from kubernetes.client.exceptions import ApiException

from contracts import trainer as t
from tjpipe.keys.pki import write_serving_pki
from tjpipe.local import toolchain
from tjpipe.local.admission_webhook import runtime_the_webhook_refuses
from tjpipe.local.crds import apply_objects
from tjpipe.local.kubeapi import new_api_client
from tjpipe.local.kustomize import kustomize_build
from tjpipe.local.procs import ManagedProcess, free_port, http_ok, spawn, wait_until

SHIPPED_CONFIG = "manifests/base/manager/controller_manager_config.yaml"
SHIPPED_DEPLOYMENT_PATCH = "manifests/base/manager/manager_config_patch.yaml"
WEBHOOK_BASE = "manifests/base/webhook"
SETUP_FIELD_MANAGER = "tjpipe-trainer-setup"
LEADER_ELECTION_NAMESPACE = "kubeflow-system"
TRAINJOB_CONTROLLER = "trainjob_controller"
"""The name Trainer's TrainJob controller has in controller-runtime's metrics (``controller`` label)."""

_READY_TIMEOUT_SECONDS = 60.0
_WEBHOOK_CALLED_TIMEOUT_SECONDS = 30.0
_PROBE_RUNTIME = "tjpipe-trainer-webhook-probe"
_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def shipped_configuration() -> dict[str, Any]:
    """Trainer's shipped ``Configuration`` (config.trainer.kubeflow.org/v1alpha1) at the pinned tag."""
    module = toolchain.go_module_dir(toolchain.TRAINER_MODULE, f"v{toolchain.TRAINER_VERSION}")
    config: dict[str, Any] = yaml.safe_load((module / SHIPPED_CONFIG).read_text())
    return config


def shipped_arguments() -> list[str]:
    """The manager container's arguments in Trainer's shipped Deployment patch, but ``--config``."""
    module = toolchain.go_module_dir(toolchain.TRAINER_MODULE, f"v{toolchain.TRAINER_VERSION}")
    patch = yaml.safe_load((module / SHIPPED_DEPLOYMENT_PATCH).read_text())
    containers = patch["spec"]["template"]["spec"]["containers"]
    manager = next(c for c in containers if c["name"] == "manager")
    return [str(a) for a in manager.get("args") or [] if not str(a).startswith("--config")]


def local_configuration(
    shipped: dict[str, Any],
    *,
    health_port: int,
    metrics_port: int,
    webhook_port: int,
    leader_elect: bool,
    feature_gates: Mapping[str, bool] | None = None,
    status_server_port: int | None = None,
) -> dict[str, Any]:
    """``shipped`` with its listeners on loopback, certificate management off and leader election as asked.

    Concurrency, client qps/burst and the status server's client limits stay as shipped. ``feature_gates``
    go into the configuration's ``featureGates`` (``{"TrainJobStatus": True}`` starts its status server);
    ``status_server_port`` moves that server off the shipped 10443. Trainer binds it on every interface
    (``:PORT``, no host setting), so whoever turns it on keeps the process in a network namespace of its own.
    """
    config = copy.deepcopy(shipped)
    if feature_gates:
        config["featureGates"] = {**(config.get("featureGates") or {}), **feature_gates}
    if status_server_port is not None:
        config["statusServer"] = {**(config.get("statusServer") or {}), "port": status_server_port}
    config["health"] = {**(config.get("health") or {}), "healthProbeBindAddress": f"127.0.0.1:{health_port}"}
    config["metrics"] = {"bindAddress": f"127.0.0.1:{metrics_port}", "secureServing": False}
    config["webhook"] = {"port": webhook_port, "host": "127.0.0.1"}
    election = dict(config.get("leaderElection") or {})
    election["leaderElect"] = leader_elect
    if leader_elect and not election.get("resourceNamespace"):
        election["resourceNamespace"] = LEADER_ELECTION_NAMESPACE
    config["leaderElection"] = election
    config["certManagement"] = {**(config.get("certManagement") or {}), "enable": False}
    return config


def webhook_configurations(*, url: str, ca_bundle: bytes, progress: Callable[[str], None]) -> list[dict[str, Any]]:
    """Trainer's own Mutating/ValidatingWebhookConfiguration (kustomize-rendered from the pinned module),
    calling ``url`` (``https://host:port``) with ``ca_bundle`` instead of the in-cluster Service."""
    module = toolchain.go_module_dir(toolchain.TRAINER_MODULE, f"v{toolchain.TRAINER_VERSION}")
    documents = kustomize_build(module / WEBHOOK_BASE, progress=progress)
    bundle = base64.b64encode(ca_bundle).decode()
    for document in documents:
        for webhook in document.get("webhooks") or []:
            service = webhook["clientConfig"].pop("service")
            webhook["clientConfig"] = {"url": f"{url}{service['path']}", "caBundle": bundle}
    return documents


@dataclass
class TrainerController:
    """Trainer's controller manager on loopback: ``start()`` returns once the apiserver calls its webhooks.

    ``state_dir`` holds its configuration, certificates and log (``trainer-controller.log``).
    """

    kubeconfig: Path
    state_dir: Path
    progress: Callable[[str], None] = lambda _: None
    leader_elect: bool = False
    register_webhooks: bool = True
    feature_gates: dict[str, bool] = field(default_factory=dict)
    """Trainer's feature gates to set in its configuration, e.g. ``{"TrainJobStatus": True}``."""
    status_server_port: int | None = None
    """Where its status server listens with ``TrainJobStatus`` on (all interfaces; default the shipped 10443)."""
    name: str = "trainer-controller"
    process: ManagedProcess | None = None
    metrics_url: str = ""
    """``http://127.0.0.1:PORT/metrics`` (controller-runtime's metrics: reconciles, work queues, REST client)."""
    health_url: str = ""
    webhook_url: str = ""
    webhook_configuration_names: dict[str, str] = field(default_factory=dict)
    """kind -> name of the webhook configurations registered for it (cluster-scoped)."""
    _ca_pem: bytes = b""

    @property
    def log_path(self) -> Path:
        return self.state_dir / "logs" / f"{self.name}.log"

    def start(self) -> TrainerController:
        """Build (once), start, wait for ``/readyz``, register the webhooks and wait until they are called."""
        if self.process is not None and self.process.is_running():
            raise RuntimeError(f"{self.name} is already running (pid {self.process.pid})")
        binary = toolchain.ensure_trainer_controller(progress=self.progress)
        started = time.monotonic()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.state_dir / "tmp"
        cert_dir = tmp / "k8s-webhook-server" / "serving-certs"  # controller-runtime's default CertDir
        if not self._ca_pem:
            self._ca_pem = write_serving_pki(
                cert_dir, ca_name="tjpipe-trainer-webhook-ca", common_name="trainer-webhook"
            )
        health_port, metrics_port, webhook_port = free_port(), free_port(), free_port()
        config = local_configuration(
            shipped_configuration(),
            health_port=health_port,
            metrics_port=metrics_port,
            webhook_port=webhook_port,
            leader_elect=self.leader_elect,
            feature_gates=self.feature_gates,
            status_server_port=self.status_server_port,
        )
        config_path = self.state_dir / "controller_manager_config.yaml"
        config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        if self.leader_elect:  # its Lease needs the namespace to exist
            namespace = config["leaderElection"]["resourceNamespace"]
            with new_api_client(self.kubeconfig) as client:
                apply_objects(
                    client,
                    [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}],
                    field_manager=SETUP_FIELD_MANAGER,
                )
        self.health_url = f"http://127.0.0.1:{health_port}"
        self.metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
        self.webhook_url = f"https://127.0.0.1:{webhook_port}"
        self.process = spawn(
            name=self.name,
            argv=[str(binary), f"--config={config_path}", *shipped_arguments()],
            log_dir=self.state_dir / "logs",
            env={"KUBECONFIG": str(self.kubeconfig.resolve()), "TMPDIR": str(tmp)},
        )
        try:
            wait_until(
                lambda: http_ok(f"{self.health_url}/readyz"),
                timeout=_READY_TIMEOUT_SECONDS,
                what=f"Trainer's controller /readyz on {self.health_url}",
                process=self.process,
            )
            if self.register_webhooks:
                self._register_webhooks()
        except BaseException:
            self.process.stop()
            raise
        self.progress(
            f"Trainer v{toolchain.TRAINER_VERSION} controller ready in {time.monotonic() - started:.1f}s "
            f"(pid {self.process.pid}, metrics {self.metrics_url}, webhooks "
            f"{'registered' if self.register_webhooks else 'served, not registered'}, log {self.process.log_path})"
        )
        return self

    def stop(self, *, unregister_webhooks: bool = True, timeout: float = 10) -> None:
        """Remove its webhook configurations (unless told not to), then stop the process; safe to call twice."""
        if unregister_webhooks:
            self.unregister_webhooks()
        if self.process is not None:
            self.process.stop(timeout=timeout)

    def is_running(self) -> bool:
        return self.process is not None and self.process.is_running()

    def log_tail(self, lines: int = 30) -> str:
        return self.process.log_tail(lines) if self.process is not None else "(not started)"

    # ------------------------------------------------------------------------------------------ webhooks

    def _register_webhooks(self) -> None:
        assert self.process is not None
        configurations = webhook_configurations(url=self.webhook_url, ca_bundle=self._ca_pem, progress=self.progress)
        with new_api_client(self.kubeconfig) as client:
            apply_objects(client, configurations, field_manager=SETUP_FIELD_MANAGER)
            self.webhook_configuration_names = {c["kind"]: c["metadata"]["name"] for c in configurations}
            wait_until(
                lambda: _trainer_refuses_bad_runtime(client),
                timeout=_WEBHOOK_CALLED_TIMEOUT_SECONDS,
                what="the apiserver to call Trainer's validating webhook for a dry-run ClusterTrainingRuntime",
                process=self.process,
            )

    def unregister_webhooks(self) -> None:
        """Delete the webhook configurations ``start()`` registered (a missing one is fine)."""
        if not self.webhook_configuration_names:
            return
        with new_api_client(self.kubeconfig) as client:
            api = AdmissionregistrationV1Api(client)
            for kind, name in self.webhook_configuration_names.items():
                delete = (
                    api.delete_mutating_webhook_configuration
                    if kind == "MutatingWebhookConfiguration"
                    else api.delete_validating_webhook_configuration
                )
                try:
                    delete(name)
                except ApiException as exc:
                    if exc.status != 404:
                        raise
        self.webhook_configuration_names = {}

    # ------------------------------------------------------------------------------------------- metrics

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """Its ``/metrics`` samples: (name, sorted labels) -> value."""
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(self.metrics_url, timeout=5) as response:
            text = response.read().decode()
        samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        for line in text.splitlines():
            match = _SAMPLE.match(line)
            if match is None:
                continue
            labels = tuple(sorted(_LABEL.findall(match["labels"] or "")))
            samples[(match["name"], labels)] = float(match["value"])
        return samples

    def trainjob_reconciles(self) -> int:
        """TrainJob reconciles finished so far, any result (``controller_runtime_reconcile_total``)."""
        return int(
            sum(
                value
                for (name, labels), value in self.metrics().items()
                if name == "controller_runtime_reconcile_total" and ("controller", TRAINJOB_CONTROLLER) in labels
            )
        )

    def trainjob_queue_idle(self) -> bool:
        """Its TrainJob work queue is empty and no reconcile is running."""
        samples = self.metrics()

        def gauge(name: str) -> float:
            return sum(v for (n, labels), v in samples.items() if n == name and ("name", TRAINJOB_CONTROLLER) in labels)

        def active() -> float:
            return sum(
                v
                for (n, labels), v in samples.items()
                if n == "controller_runtime_active_workers" and ("controller", TRAINJOB_CONTROLLER) in labels
            )

        return gauge("workqueue_depth") == 0 and active() == 0


def _trainer_refuses_bad_runtime(client: ApiClient) -> bool:
    """A dry-run ClusterTrainingRuntime that Trainer's validator refuses is refused by it (not merely refused)."""
    probe = runtime_the_webhook_refuses(_PROBE_RUNTIME)
    try:
        CustomObjectsApi(client).create_cluster_custom_object(
            t.GROUP, t.VERSION, "clustertrainingruntimes", probe, dry_run="All"
        )
    except ApiException as exc:
        return exc.status in (400, 403, 422) and "validator.clustertrainingruntime.trainer.kubeflow.org" in str(
            exc.body
        )
    except Exception:
        return False
    return False
