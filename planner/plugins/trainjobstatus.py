"""TrainJobStatus: tell the trainer's pods where to report progress, after Trainer's alpha plugin.

Trainer registers this plugin only with its ``TrainJobStatus`` feature gate on; here the registry takes it
only when the planner is given a ``StatusServer`` (``--trainjob-status``). It then does two things for
every TrainJob, whatever its ML policy:

* every container (init containers excepted) of the first pod set whose ancestor is ``trainer`` gets the
  server's URL for this TrainJob and the paths of a CA file and a token, and a read-only mount of one
  projected volume holding both: a ServiceAccount token whose audience names this TrainJob's status
  endpoint (so a token is good for one TrainJob only), valid for an hour, and the CA from the ConfigMap;
* the ConfigMap ``<trainjob>-tls-config`` carries the CA, in the TrainJob's namespace and controlled by it.

Trainer reads the CA from its webhook certificate's Secret on every reconcile, and the URL from its own
Service name. The planner reads nothing: the shell reads the CA file once at start and passes it, with
the URL, as data, so the plan stays a function of the event and the planner's configuration. The URL is
the one the pods (or, where no pod runs, the host) reach the server by; the layouts choose it, see
docs/training-progress.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

from contracts import trainer as t
from contracts.kube import ConfigMap
from contracts.trainer import TrainJob
from contracts.values import name_of, namespace_of
from planner.framework import ComponentBuilder, EnforceMLPolicy
from planner.info import Component, RuntimeInfo
from planner.merge import Obj, env_value, upsert_env, upsert_volume_mounts, upsert_volumes
from planner.owners import owned_metadata


@dataclass(frozen=True)
class StatusServer:
    """What the pods are told about the status server: its base URL and the CA that signs its certificate."""

    url: str
    """``https://host[:port]``; the TrainJob's path is appended."""
    ca_cert: str
    """PEM text."""

    def __post_init__(self) -> None:
        if not self.url.startswith("https://"):
            raise ValueError(f"the status server URL must be https://..., got {self.url!r}")
        if not self.ca_cert:
            raise ValueError("the status server's CA certificate is empty")


def tls_config_map_name(job_name: str) -> str:
    return job_name + t.STATUS_TLS_CONFIGMAP_SUFFIX


def _token_volume(job: TrainJob) -> Obj:
    return {
        "name": t.STATUS_TOKEN_VOLUME,
        "projected": {
            "sources": [
                {
                    "serviceAccountToken": {
                        "audience": t.trainjob_status_audience(namespace_of(job), name_of(job)),
                        "expirationSeconds": t.STATUS_TOKEN_EXPIRATION_SECONDS,
                        "path": t.STATUS_TOKEN_FILE,
                    }
                },
                {
                    "configMap": {
                        "name": tls_config_map_name(name_of(job)),
                        "items": [{"key": t.STATUS_CA_CERT_KEY, "path": t.STATUS_CA_CERT_FILE}],
                    }
                },
            ]
        },
    }


# Laid out as every plugin is: name, then one method per extension point. No ``enabled``: with the
# feature on, every runtime gets it, as in Trainer.
class TrainJobStatus:
    name = "trainjobstatus"

    def __init__(self, server: StatusServer) -> None:
        self.server = server

    def enforce_ml_policy(self, info: RuntimeInfo, job: TrainJob) -> None:
        trainer = info.pod_set_by_ancestor(t.ANCESTOR_TRAINER)
        if trainer is None:
            return
        url = self.server.url + t.trainjob_status_path(namespace_of(job), name_of(job))
        env = [
            env_value(t.STATUS_ENV_SERVER_URL, url),
            env_value(t.STATUS_ENV_CA_CERT, f"{t.STATUS_MOUNT_PATH}/{t.STATUS_CA_CERT_FILE}"),
            env_value(t.STATUS_ENV_TOKEN, f"{t.STATUS_MOUNT_PATH}/{t.STATUS_TOKEN_FILE}"),
        ]
        mount = {"name": t.STATUS_TOKEN_VOLUME, "mountPath": t.STATUS_MOUNT_PATH, "readOnly": True}
        for container in trainer.containers:
            # Fresh dicts per container: a later plugin editing one container's env must not edit another's.
            upsert_env(container.env, [dict(e) for e in env])
            upsert_volume_mounts(container.volume_mounts, [dict(mount)])
        upsert_volumes(trainer.volumes, [_token_volume(job)])

    def sync_parallel_count(self, info: RuntimeInfo) -> None:
        return None

    def build(self, info: RuntimeInfo, job: TrainJob) -> list[Component]:
        body: Obj = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": owned_metadata(job, tls_config_map_name(name_of(job))),
            "data": {t.STATUS_CA_CERT_KEY: self.server.ca_cert},
        }
        return [Component(object=msgspec.convert(body, ConfigMap))]


_SAMPLE = StatusServer(url="https://status.example", ca_cert="-----BEGIN CERTIFICATE-----")

# The extension points TrainJobStatus implements, checked by mypy as the Go compiler checks Trainer's
# ``var _ framework.<Point>Plugin = (*Status)(nil)``; tests/unit/test_planner_plugin_phases.py ties them to the phases.
_implements_ml_policy: EnforceMLPolicy = TrainJobStatus(_SAMPLE)
_implements_builder: ComponentBuilder = TrainJobStatus(_SAMPLE)
