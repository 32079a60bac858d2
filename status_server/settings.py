"""The status server's settings, each declared once (``plumbing.configuration``): the command line, the settings
reference and the deployment checks are made from these fields.

A module of its own, importing nothing that does I/O (``core`` is the server's pure part), so that ``tjpipe``
builds its parser from it without loading aiohttp, NATS or the Kubernetes client.
"""

from __future__ import annotations

from dataclasses import dataclass

from plumbing.configuration import (
    ABOVE_ZERO,
    AT_LEAST_ONE,
    AT_LEAST_ZERO,
    KubeSettings,
    ServiceSettings,
    setting,
)
from status_server.core import MAX_CLOCK_SKEW, MAX_REVIEWS, Rate

POD_RATE = Rate(per_second=1.0, burst=10)
"""Per pod: five times the SDK's own rate (one update per 5 s) on average, ten at once."""
TRAINJOB_RATE = Rate(per_second=20.0, burst=200)
"""Per TrainJob, whatever its pods: a hundred pods at the SDK's rate, two hundred at once."""
COALESCE_SECONDS = 5.0
"""The SDK's own rate per process (one update per 5 s): one pod's updates are all written, many pods' share it."""
RECOVER_SECONDS = 3600.0
"""How far back the start-up reads the history for updates a previous process accepted but did not write."""
SWEEP_SECONDS = 30.0
"""How often the history is read again for updates another replica accepted but did not write."""


def rate(text: str) -> Rate:
    """``PER_SECOND/BURST`` (``1/10``) as a ``Rate``: a rate above 0 and a burst of 1 or more, else ValueError."""
    per_second, _, burst = text.partition("/")
    parsed = Rate(per_second=float(per_second), burst=float(burst))
    if not (0 < parsed.per_second < float("inf") and 1 <= parsed.burst < float("inf")):
        raise ValueError(text)
    return parsed


rate.__name__ = "PER_SECOND/BURST rate (a rate above 0, a burst of 1 or more)"


@dataclass(kw_only=True)
class StatusServerSettings(KubeSettings, ServiceSettings):
    # The bases in this order give the flags the order of the pipeline services': NATS, logging, Kubernetes.
    host: str = setting(
        "0.0.0.0",
        flag="--host",
        env="TJPIPE_STATUS_SERVER_HOST",
        deployment="optional",
        help="address to listen on (every address: what a pod wants)",
    )
    port: int = setting(10443, flag="--port", env="TJPIPE_STATUS_SERVER_PORT", help="HTTPS port (Trainer's 10443)")
    tls_cert: str = setting(
        "/etc/tjpipe/status-server-tls/tls.crt",
        flag="--tls-cert",
        env="TJPIPE_STATUS_SERVER_TLS_CERT",
        deployment="per-service",
        help="serving certificate, PEM (signed by the CA --status-server-ca names to the planner)",
    )
    tls_key: str = setting(
        "/etc/tjpipe/status-server-tls/tls.key",
        flag="--tls-key",
        env="TJPIPE_STATUS_SERVER_TLS_KEY",
        deployment="per-service",
        help="its private key, PEM",
    )
    coalesce_seconds: float = setting(
        COALESCE_SECONDS,
        flag="--coalesce-seconds",
        env="TJPIPE_STATUS_COALESCE_SECONDS",
        unit="seconds",
        check=ABOVE_ZERO,
        help="at most one write of a TrainJob's status.trainerStatus per this many seconds, the newest update "
        "(the default is the SDK's own rate per process)",
    )
    max_token_reviews: int = setting(
        MAX_REVIEWS,
        flag="--max-token-reviews",
        env="TJPIPE_STATUS_MAX_TOKEN_REVIEWS",
        check=AT_LEAST_ONE,
        help="TokenReviews in flight at once; a request that waits 2 s for one is answered 429",
    )
    max_clock_skew: float = setting(
        MAX_CLOCK_SKEW,
        flag="--max-clock-skew",
        env="TJPIPE_STATUS_MAX_CLOCK_SKEW",
        unit="seconds",
        check=AT_LEAST_ZERO,
        help="how far an update's lastUpdatedTime may lie ahead of the server's clock; further ahead: 422",
    )
    pod_rate: Rate = setting(
        POD_RATE,
        flag="--pod-rate",
        env="TJPIPE_STATUS_POD_RATE",
        parse=rate,
        help="updates per second per pod / at once (token bucket); over it: 429 with Retry-After",
    )
    trainjob_rate: Rate = setting(
        TRAINJOB_RATE,
        flag="--trainjob-rate",
        env="TJPIPE_STATUS_TRAINJOB_RATE",
        parse=rate,
        help="updates per second per TrainJob, whatever its pods / at once; over it: 429",
    )
    sweep_seconds: float = setting(
        SWEEP_SECONDS,
        flag="--sweep-seconds",
        env="TJPIPE_STATUS_SWEEP_SECONDS",
        unit="seconds",
        check=ABOVE_ZERO,
        help="how often to read the progress history again for updates another replica accepted but did not "
        "write (its pods now reach this one, or it died)",
    )
    recover_seconds: float = RECOVER_SECONDS
    cert_check_seconds: float = 30.0
