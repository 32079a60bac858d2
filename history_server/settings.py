"""The history server's settings, each declared once (``plumbing.configuration``): the command line, the settings
reference and the deployment checks are made from these fields.

A module of its own, importing nothing that does I/O, so that ``tjpipe`` builds its parser from it without
loading aiohttp, NATS or the Kubernetes client. The history server serves no ``/metrics`` of its own port and
holds no partition lease, so it takes the logging settings of a process, not the whole of them.
"""

from __future__ import annotations

from dataclasses import dataclass

from plumbing.configuration import (
    ABOVE_ZERO,
    AT_LEAST_ZERO,
    Check,
    ConnectSettings,
    KubeSettings,
    LoggingSettings,
    NatsSettings,
    setting,
)


def listen_address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:8080`` for IPv6) as the host and the port; an empty host is every address."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(text)
    return host.strip("[]") or "0.0.0.0", int(port)


def _listens(text: str) -> bool:
    try:
        listen_address(text)
    except ValueError:
        return False
    return True


HOST_AND_PORT = Check(_listens, "HOST:PORT, e.g. 127.0.0.1:8080")


@dataclass(kw_only=True)
class HistoryServerSettings(KubeSettings, ConnectSettings, NatsSettings, LoggingSettings):
    # The bases in this order give the flags the order of the other commands': logging, NATS, Kubernetes.
    listen: str = setting(
        "127.0.0.1:8080",
        flag="--listen",
        env="TJPIPE_HISTORY_LISTEN",
        check=HOST_AND_PORT,
        help="where to serve the UI and the API",
    )
    tls_cert: str = setting(
        "",
        flag="--tls-cert",
        env="TJPIPE_HISTORY_TLS_CERT",
        deployment="optional",
        help="serve HTTPS with this certificate, PEM (unset: plain HTTP, for loopback)",
    )
    tls_key: str = setting(
        "", flag="--tls-key", env="TJPIPE_HISTORY_TLS_KEY", deployment="optional", help="its private key, PEM"
    )
    auth_cache_seconds: float = setting(
        10.0,
        flag="--auth-cache-seconds",
        env="TJPIPE_HISTORY_AUTH_CACHE_SECONDS",
        unit="seconds",
        check=AT_LEAST_ZERO,
        help="how long a TokenReview or SubjectAccessReview answer is reused",
    )
    refresh_seconds: float = setting(
        2.0,
        flag="--refresh-seconds",
        env="TJPIPE_HISTORY_REFRESH_SECONDS",
        unit="seconds",
        check=ABOVE_ZERO,
        help="how often the TrainJob index reads what arrived on the streams",
    )
    stalled_after: float = setting(
        600.0,
        flag="--stalled-after",
        env="TJPIPE_HISTORY_STALLED_AFTER_SECONDS",
        unit="seconds",
        check=AT_LEAST_ZERO,
        help="time without a training progress update after which a Running TrainJob is listed as stalled (0: never)",
    )
    fleet_clusters: str = setting(
        "",
        flag="--fleet-clusters",
        env="TJPIPE_HISTORY_FLEET_CLUSTERS",
        deployment="optional",
        help="serve a fleet's history at its hub: a YAML file naming each member cluster (name, its API "
        "server and CA, and a credential there that may create TokenReviews and SubjectAccessReviews); "
        "unset: this cluster's history",
    )
    retention_policy: str = setting(
        "",
        flag="--retention-policy",
        env="TJPIPE_HISTORY_RETENTION_POLICY",
        deployment="optional",
        help="a YAML file (mounted from a ConfigMap): how long each namespace's history is kept after a TrainJob "
        "ended, and how many ended TrainJobs; read again when it changes; unset: the streams' own limits only",
    )
    retention_creds: str = setting(
        "",
        flag="--retention-creds",
        env="TJPIPE_HISTORY_RETENTION_CREDS",
        deployment="optional",
        help="the history-keeper NATS identity's seed, which may purge the record streams: what removes the "
        "history the retention policy expires (needed with --retention-policy)",
    )
    logs_creds: str = setting(
        "",
        flag="--logs-creds",
        env="TJPIPE_HISTORY_LOGS_CREDS",
        deployment="optional",
        help="the log-keeper NATS identity's seed: with it the server keeps TrainJobs' pod logs in the logs "
        "bucket when they finish or when a page asks (its ServiceAccount then needs pods list, pods/log get and "
        "jobsets get); unset: it serves the logs kept, and keeps none",
    )
    scrape: tuple[str, ...] = setting(
        (),
        flag="--scrape",
        env="TJPIPE_HISTORY_SCRAPE",
        deployment="optional",
        help="a service's /metrics URL to count refused publishes from (repeatable)",
    )
