"""The planner's and the webhook's settings, each declared once (``plumbing.configuration``): the command
line, the settings reference and the deployment checks are made from these fields.

A module of its own, importing nothing that does I/O, so that ``tjpipe`` builds its parser from it without
loading the planner.
"""

from __future__ import annotations

from dataclasses import dataclass

from plumbing.configuration import KubeSettings, PartitionedSettings, ProcessSettings, SigningSettings, setting


@dataclass(kw_only=True)
class PlannerSettings(PartitionedSettings, SigningSettings):
    batch: int = 64
    trusted_event_keys: str | None = setting(
        None,
        flag="--trusted-event-keys",
        env="TJPIPE_TRUSTED_EVENT_KEYS",
        deployment="per-service",
        help="the watcher's ed25519 public keys: a file, or a directory of *.pub files; required",
    )
    trainjob_status: bool = setting(
        False,
        flag="--trainjob-status",
        env="TJPIPE_TRAINJOB_STATUS",
        help="Trainer's TrainJobStatus feature gate (alpha, default off): trainer pods get the status "
        "server's URL, its CA and a token to report progress with",
    )
    """Trainer's ``TrainJobStatus`` feature gate: the TrainJobStatus plugin is registered only when on."""
    status_server_url: str = setting(
        "",
        flag="--status-server-url",
        env="TJPIPE_STATUS_SERVER_URL",
        help="the status server as the pods reach it, https://HOST:PORT (Trainer's path is appended); "
        "required with --trainjob-status",
    )
    status_server_ca_file: str = setting(
        "",
        flag="--status-server-ca",
        env="TJPIPE_STATUS_SERVER_CA",
        help="PEM file of the CA that signs the status server's certificate (read once at start); "
        "required with --trainjob-status",
    )
    status_server_ca: str = ""
    """The PEM text of that file, read once by the command line (with ``trainjob_status``)."""


TRAINJOB_STATUS = ("trainjob_status", "status_server_url", "status_server_ca_file")
"""The settings that say whether and how the TrainJobStatus plugin runs; the commands that plan as the
planner does (``tjpipe replay``, ``tjpipe plan``) take them too."""


@dataclass(kw_only=True)
class WebhookSettings(ProcessSettings, KubeSettings):
    tls_cert: str = setting(
        "/etc/tjpipe/webhook-tls/tls.crt",
        flag="--tls-cert",
        env="TJPIPE_WEBHOOK_TLS_CERT",
        help="serving certificate, PEM",
    )
    tls_key: str = setting(
        "/etc/tjpipe/webhook-tls/tls.key", flag="--tls-key", env="TJPIPE_WEBHOOK_TLS_KEY", help="its private key, PEM"
    )
    port: int = setting(9443, flag="--port", env="TJPIPE_WEBHOOK_PORT", help="HTTPS port")
    host: str = setting("0.0.0.0", flag="--host", env="TJPIPE_WEBHOOK_HOST", help="address to listen on")
    cert_check_seconds: float = 30.0
