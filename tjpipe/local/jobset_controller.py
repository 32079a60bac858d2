"""JobSet's own controller manager and admission webhooks, run against a local kube-apiserver.

Why the real thing: what JobSet admits on an update of an existing JobSet depends on what its mutating
webhook added at creation (a defaulted ``retentionPolicy`` inside the atomic ``volumeClaimPolicies``, the
``network`` and ``successPolicy`` it fills in) and on its validating webhook's and CRD's immutability
rules. A stand-in policy that nothing mutates cannot show that, so the tests run JobSet's
manager, built from the pinned module (``toolchain.ensure_jobset_manager``), with both webhooks
registered exactly as JobSet's own ``config/components/webhook/manifests.yaml`` declares them
(``failurePolicy: Fail``), only pointed at ``https://127.0.0.1:PORT`` instead of an in-cluster Service.

Everything listens on loopback. Leader election is off (one replica) and JobSet's internal certificate
rotation is disabled: it would write a Secret and patch the webhook configurations for an in-cluster
Service that does not exist here; a self-signed CA and serving certificate made here take its place.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kubernetes.client import ApiClient, CustomObjectsApi

from tjpipe.keys.pki import write_serving_pki
from tjpipe.local import toolchain
from tjpipe.local.crds import apply_objects
from tjpipe.local.procs import ManagedProcess, free_port, http_ok, spawn, wait_until
from tjpipe.local.registrations import registered_for

WEBHOOK_MANIFESTS = "config/components/webhook/manifests.yaml"
PROCESS_NAME = "jobset-manager"
SETUP_FIELD_MANAGER = "tjpipe-jobset-setup"
_READY_TIMEOUT_SECONDS = 60.0
_WEBHOOK_ADMITS_TIMEOUT_SECONDS = 30.0


@dataclass(frozen=True)
class LocalJobSet:
    """A running JobSet manager whose webhooks the apiserver calls."""

    process: ManagedProcess
    webhook_url: str
    health_url: str
    webhook_configurations: tuple[str, ...]
    """Names of the Mutating/ValidatingWebhookConfigurations registered for it (cluster-scoped)."""

    def stop(self, timeout: float = 10) -> None:
        self.process.stop(timeout=timeout)


def webhook_configurations(*, url: str, ca_bundle: bytes, name_prefix: str = "tjpipe-jobset-") -> list[dict[str, Any]]:
    """JobSet's own webhook configurations at the pinned version, calling ``url`` (``https://host:port``).

    Each webhook keeps its name, rules, failurePolicy and sideEffects; only the Service reference becomes
    ``url + path`` with the given CA bundle.
    """
    module = toolchain.go_module_dir(toolchain.JOBSET_MODULE, f"v{toolchain.JOBSET_VERSION}")
    documents = [d for d in yaml.safe_load_all((module / WEBHOOK_MANIFESTS).read_text()) if d]
    bundle = _b64(ca_bundle)
    out = []
    for document in documents:
        for webhook in document.get("webhooks") or []:
            service = webhook["clientConfig"].pop("service")
            webhook["clientConfig"] = {"url": f"{url}{service['path']}", "caBundle": bundle}
            webhook["failurePolicy"] = "Fail"
        document["metadata"]["name"] = name_prefix + document["metadata"]["name"]
        out.append(document)
    return out


WEBHOOK_CA_NAME = "tjpipe-jobset-webhook-ca"


# The two below are what the local stack and compose run JobSet's manager with (one cluster shape).
def manager_config(
    *, host: str, webhook_port: int, metrics_port: int, health_port: int, cert_dir: Path | str
) -> dict[str, Any]:
    """JobSet's Configuration file: one replica (no leader election), the webhook's certificate from
    ``cert_dir`` rather than JobSet's in-cluster rotation, every port on ``host``."""
    return {
        "apiVersion": "config.jobset.x-k8s.io/v1alpha1",
        "kind": "Configuration",
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "webhook": {"port": webhook_port, "host": host, "certDir": str(cert_dir)},
        "metrics": {"bindAddress": f"{host}:{metrics_port}", "certDir": str(cert_dir)},
        "health": {"healthProbeBindAddress": f"{host}:{health_port}"},
    }


def manager_flags(*, config: Path | str, kubeconfig: Path | str) -> list[str]:
    return [f"--config={config}", f"--kubeconfig={kubeconfig}", "--zap-devel=false"]


def start_jobset_manager(
    *,
    api_client: ApiClient,
    kubeconfig: Path,
    work_dir: Path,
    log_dir: Path,
    progress: Callable[[str], None],
) -> LocalJobSet:
    """Build (once) and start JobSet's manager, register its webhooks, and wait until they admit JobSets."""
    binary = toolchain.ensure_jobset_manager(progress=progress)
    started = time.monotonic()
    work_dir.mkdir(parents=True, exist_ok=True)
    cert_dir = work_dir / "certs"
    ca_pem = write_serving_pki(cert_dir, ca_name=WEBHOOK_CA_NAME, common_name="jobset-webhook")
    webhook_port, health_port, metrics_port = free_port(), free_port(), free_port()
    config_path = work_dir / "jobset-config.yaml"
    config_path.write_text(
        yaml.safe_dump(
            manager_config(
                host="127.0.0.1",
                webhook_port=webhook_port,
                metrics_port=metrics_port,
                health_port=health_port,
                cert_dir=cert_dir,
            )
        )
    )
    process = spawn(
        name=PROCESS_NAME,
        argv=[str(binary), *manager_flags(config=config_path, kubeconfig=kubeconfig)],
        log_dir=log_dir,
    )
    health_url = f"http://127.0.0.1:{health_port}"
    webhook_url = f"https://127.0.0.1:{webhook_port}"
    try:
        wait_until(
            lambda: http_ok(f"{health_url}/readyz"),
            timeout=_READY_TIMEOUT_SECONDS,
            what=f"JobSet manager /readyz on {health_url}",
            process=process,
        )
        configurations = [
            registered_for(PROCESS_NAME, c) for c in webhook_configurations(url=webhook_url, ca_bundle=ca_pem)
        ]
        apply_objects(api_client, configurations, field_manager=SETUP_FIELD_MANAGER)
        wait_until_admitted(api_client, process)
    except BaseException:
        process.stop()
        raise
    progress(f"JobSet manager v{toolchain.JOBSET_VERSION} ready with its webhooks in {time.monotonic() - started:.1f}s")
    return LocalJobSet(
        process=process,
        webhook_url=webhook_url,
        health_url=health_url,
        webhook_configurations=tuple(c["metadata"]["name"] for c in configurations),
    )


def wait_until_admitted(
    api_client: ApiClient, process: ManagedProcess | None, *, timeout: float = _WEBHOOK_ADMITS_TIMEOUT_SECONDS
) -> None:
    """Until a dry-run JobSet create comes back defaulted by JobSet's mutating webhook.

    The apiserver picks new webhook configurations up from an informer a moment after they are written.
    """
    probe = {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": "tjpipe-webhook-probe", "namespace": "default"},
        "spec": {
            "replicatedJobs": [
                {
                    "name": "probe",
                    "template": {
                        "spec": {
                            "template": {"spec": {"containers": [{"name": "probe", "image": "example.com/probe"}]}}
                        }
                    },
                }
            ]
        },
    }

    def defaulted() -> bool:
        try:
            created: Any = CustomObjectsApi(api_client).create_namespaced_custom_object(
                "jobset.x-k8s.io", "v1alpha2", "default", "jobsets", probe, dry_run="All"
            )
        except Exception:
            return False
        return isinstance(created, dict) and "successPolicy" in (created.get("spec") or {})

    wait_until(
        defaulted,
        timeout=timeout,
        what="JobSet's mutating webhook to default a dry-run JobSet",
        process=process,
    )


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()
