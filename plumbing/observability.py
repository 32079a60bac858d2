"""Metrics and health endpoints every service serves: ``/metrics``, ``/healthz`` and ``/readyz``.

One metric registry per process, with names shared by the three services, so a dashboard can sum a stage
across replicas. The registry also carries the standard ``process_*`` and ``python_*`` collectors and
``tjpipe_build_info``. No label is called ``service``, ``namespace``, ``pod``, ``job`` or ``instance``: a
Prometheus Operator scrape adds those to every series, and a clash renames ours to ``exported_*``; the
service a series comes from is ``tjpipe_service``. The one exception is Kubeflow Trainer's proposed
``kubeflow_trainer_*`` lifecycle metrics, which keep upstream's ``namespace`` label (the TrainJob's); the
ServiceMonitor scrapes with ``honorLabels`` so it is kept as it is. Liveness answers as long as the event loop runs;
readiness is a set of named checks the service registers (NATS connected, API server reachable), so a
replica that lost a dependency is taken out of rotation without being restarted.
"""

from __future__ import annotations

import asyncio
import logging
import platform
from collections.abc import Awaitable, Callable, Iterable, Mapping
from importlib import metadata
from typing import Protocol

from aiohttp import web
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    Info,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from contracts.messages import Transition

log = logging.getLogger(__name__)

REGISTRY = CollectorRegistry()
ProcessCollector(registry=REGISTRY)
PlatformCollector(registry=REGISTRY)
GCCollector(registry=REGISTRY)

SERVICE_LABEL = "tjpipe_service"
"""The label naming the service a series comes from (never ``service``: see the module docstring)."""


def package_version() -> str:
    try:
        return metadata.version("trainjob-pipeline")
    except metadata.PackageNotFoundError:
        return "unknown"


BUILD_INFO = Info("tjpipe_build", "Version of trainjob-pipeline and of Python this process runs", registry=REGISTRY)
"""Exposed as ``tjpipe_build_info{version, python_version, tjpipe_service} 1``."""


def set_build_info(service: str = "") -> None:
    BUILD_INFO.info({"version": package_version(), "python_version": platform.python_version(), SERVICE_LABEL: service})


set_build_info()

EVENTS = Counter(
    "tjpipe_events_total", "TrainJob change events published by the watcher", ["cause", "outcome"], registry=REGISTRY
)
PLANS = Counter("tjpipe_plans_total", "Events planned", ["outcome"], registry=REGISTRY)
PLANNED_MESSAGES = Counter(
    "tjpipe_planned_messages_total", "Apply messages published by the planner", ["component"], registry=REGISTRY
)
APPLIES = Counter("tjpipe_applies_total", "Apply outcomes", ["kind", "action"], registry=REGISTRY)
RETRIES = Counter("tjpipe_retries_total", "Retried API calls", [SERVICE_LABEL], registry=REGISTRY)
DEAD_LETTERS = Counter("tjpipe_dead_letters_total", "Messages dead-lettered", ["stage", "reason"], registry=REGISTRY)
UNAUTHORIZED = Counter(
    "tjpipe_unauthorized_total",
    "Apply messages refused because no real TrainJob justifies the write they ask for",
    ["kind"],
    registry=REGISTRY,
)
TRAINJOB_CHECKS = Counter(
    "tjpipe_trainjob_checks_total",
    "The applier's TrainJob checks, by what answered: its watch of TrainJobs, a verification it still trusts"
    " (memory), or a read",
    ["answer"],
    registry=REGISTRY,
)
STALE_CLAIMS = Counter(
    "tjpipe_stale_ledger_claims_total",
    "Ledger claims newer than anything the cluster holds, by what the applier did: held, or overwritten",
    ["action"],
    registry=REGISTRY,
)
PUBLISH_REFUSED = Counter(
    "tjpipe_publish_refused_total",
    "Publishes a full stream refused (maximum bytes or messages exceeded); each is retried with backoff",
    ["stream"],
    registry=REGISTRY,
)
WORK_TRIMMED = Counter(
    "tjpipe_work_trimmed_total",
    "Messages a work stream's consumers removed once acknowledged and recorded: every round under limits "
    "retention, and what the server kept under interest retention (plumbing.work_trim)",
    ["stream"],
    registry=REGISTRY,
)
STREAM_BYTES = Gauge("tjpipe_stream_bytes", "Bytes a stream holds (stream info)", ["stream"], registry=REGISTRY)
STREAM_MAX_BYTES = Gauge(
    "tjpipe_stream_max_bytes", "A stream's byte limit; -1 when it has none", ["stream"], registry=REGISTRY
)
FOREIGN_CLAIMS = Counter(
    "tjpipe_foreign_ledger_claims_total",
    "Ledger claims set aside because another cluster, or this cluster before its revisions went back, made them",
    ["why"],
    registry=REGISTRY,
)
CLUSTER_REWINDS = Counter(
    "tjpipe_cluster_rewinds_total",
    "Times the applier found the cluster's revision below one it had seen (etcd restored from a backup)",
    registry=REGISTRY,
)
FLEET_SOURCE_LAG = Gauge(
    "tjpipe_fleet_source_lag",
    "Records a member still holds that the hub's fleet stream has not copied yet (tjpipe fleet monitor, at the hub)",
    ["stream", "cluster"],
    registry=REGISTRY,
)
FLEET_SOURCE_GAP = Gauge(
    "tjpipe_fleet_source_gap_records",
    "Records of a member the hub's fleet stream never got: skipped between two copies it holds, the member's "
    "retention having dropped them while the link was cut (tjpipe fleet monitor, at the hub)",
    ["stream", "cluster"],
    registry=REGISTRY,
)
CONSUMER_LAG = Gauge(
    "tjpipe_consumer_lag", "Messages waiting in a consumer (num_pending at last fetch)", ["consumer"], registry=REGISTRY
)
PARTITIONS_OWNED = Gauge("tjpipe_partitions_owned", "Partitions this replica holds", ["role"], registry=REGISTRY)
END_TO_END = Histogram(
    "tjpipe_end_to_end_seconds",
    "From the watcher observing a TrainJob change to the component applied",
    ["kind"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
    registry=REGISTRY,
)

STAGE_SECONDS = Histogram(
    "tjpipe_stage_seconds",
    "Time a stage spends on one message: the watcher until the stream took its event, the planner until its"
    " plan was published, the applier until the component was applied and its result recorded",
    ["stage"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
    registry=REGISTRY,
)

LIFECYCLE_LABELS = ("namespace", "runtime")
"""The labels of the ``kubeflow_trainer_*`` TrainJob metrics: the TrainJob's namespace and its runtime's name."""

TRAINJOBS_CREATED = Counter(
    "kubeflow_trainer_trainjobs_created",
    "TrainJobs created: counted once, by the applier that first acts for one",
    LIFECYCLE_LABELS,
    registry=REGISTRY,
)
TRAINJOBS_COMPLETED = Counter(
    "kubeflow_trainer_trainjobs_completed",
    "TrainJobs that became Complete: counted once, by the applier whose status write made it so",
    LIFECYCLE_LABELS,
    registry=REGISTRY,
)
TRAINJOBS_FAILED = Counter(
    "kubeflow_trainer_trainjobs_failed",
    "TrainJobs that became Failed, by the Failed condition's reason",
    (*LIFECYCLE_LABELS, "reason"),
    registry=REGISTRY,
)
TRAINJOBS_SUSPENDED = Counter(
    "kubeflow_trainer_trainjobs_suspended",
    "Times a TrainJob became Suspended",
    LIFECYCLE_LABELS,
    registry=REGISTRY,
)
TRAINJOBS_DELETED = Counter(
    "kubeflow_trainer_trainjobs_deleted",
    "TrainJobs deleted: counted by the watcher whose deletion event the stream took (not a duplicate)",
    LIFECYCLE_LABELS,
    registry=REGISTRY,
)
TRAINJOB_DURATION = Histogram(
    "kubeflow_trainer_trainjob_duration_seconds",
    "From a TrainJob's creation to its Complete or Failed condition (result)",
    (*LIFECYCLE_LABELS, "result"),
    buckets=(1, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 10800, 21600),
    registry=REGISTRY,
)

_RESULT = {"completed": "Complete", "failed": "Failed"}
"""The duration's ``result`` label: the condition type, as Trainer's proposal has it."""


def count_transitions(transitions: Iterable[Transition], *, namespace: str, runtime: str) -> None:
    """Count the lifecycle changes one status write made (the caller knows the write made them)."""
    for change in transitions:
        if change.change == "completed":
            TRAINJOBS_COMPLETED.labels(namespace, runtime).inc()
        elif change.change == "failed":
            TRAINJOBS_FAILED.labels(namespace, runtime, change.reason or "Unknown").inc()
        else:
            TRAINJOBS_SUSPENDED.labels(namespace, runtime).inc()
        if change.change in _RESULT and isinstance(change.duration_seconds, float | int):
            TRAINJOB_DURATION.labels(namespace, runtime, _RESULT[change.change]).observe(change.duration_seconds)


ActiveCounts = Mapping[tuple[str, str], int]
"""Active TrainJobs per (namespace, runtime)."""


class ActiveTrainJobs(Collector):
    """``kubeflow_trainer_trainjobs_active``, computed when scraped from what the watcher's cache holds now.

    A gauge kept by adding and subtracting would be wrong after every restart; one read from the cache is
    right as soon as the watcher has listed the TrainJobs, and reports nothing before that. Every watcher
    replica sees the whole cluster, so replicas agree and a dashboard takes their ``max``, not their sum.
    """

    NAME = "kubeflow_trainer_trainjobs_active"
    HELP = "TrainJobs that exist and are neither Complete nor Failed, as this watcher's cache has them"

    def __init__(self) -> None:
        self._source: Callable[[], ActiveCounts | None] | None = None

    def track(self, source: Callable[[], ActiveCounts | None] | None) -> None:
        """Report what ``source`` returns (``None``: not known yet); the process's watcher sets it."""
        self._source = source

    def describe(self) -> Iterable[Metric]:
        yield GaugeMetricFamily(self.NAME, self.HELP, labels=LIFECYCLE_LABELS)

    def collect(self) -> Iterable[Metric]:
        family = GaugeMetricFamily(self.NAME, self.HELP, labels=LIFECYCLE_LABELS)
        counts = self._source() if self._source is not None else None
        for (namespace, runtime), count in sorted((counts or {}).items()):
            family.add_metric([namespace, runtime], count)
        yield family


TRAINJOBS_ACTIVE = ActiveTrainJobs()
REGISTRY.register(TRAINJOBS_ACTIVE)

ReadinessCheck = Callable[[], Awaitable[bool] | bool]


class Health(Protocol):
    """What a service does with its health endpoint: register readiness checks, then start serving."""

    def add_check(self, name: str, check: ReadinessCheck) -> None: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class HealthServer:
    def __init__(self, *, port: int, host: str = "0.0.0.0", service: str = "") -> None:
        """``service`` (watcher, planner, applier, webhook) labels ``tjpipe_build_info``."""
        self.port = port
        self.host = host
        if service:
            set_build_info(service)
        self.checks: dict[str, ReadinessCheck] = {}
        self._runner: web.AppRunner | None = None

    def add_check(self, name: str, check: ReadinessCheck) -> None:
        self.checks[name] = check

    async def _metrics(self, _: web.Request) -> web.Response:
        return web.Response(body=generate_latest(REGISTRY), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _healthz(self, _: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def _readyz(self, _: web.Request) -> web.Response:
        failing = []
        for name, check in self.checks.items():
            try:
                result = check()
                ok = await result if asyncio.iscoroutine(result) else bool(result)
            except Exception:
                ok = False
            if not ok:
                failing.append(name)
        if failing:
            return web.Response(status=503, text="not ready: " + ", ".join(failing) + "\n")
        return web.Response(text="ok\n")

    async def start(self) -> None:
        if self.port <= 0:
            return
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.host, self.port).start()
        log.info("serving /metrics, /healthz and /readyz on %s:%d", self.host, self.port)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def stage(self, name: str) -> StageHealth:
        """This server's part for one of several services in the process (see ``runner.run_stages``)."""
        return StageHealth(self, name)


class StageHealth:
    """One stage's view of a shared health server: its checks are named ``stage/check``.

    The shared server serves from the start; until the stage calls ``start`` (which a service does once
    its own checks are in), the process is not ready. ``stop`` leaves the server to its owner.
    """

    def __init__(self, server: HealthServer, name: str) -> None:
        self.server = server
        self.name = name
        self.started = False
        server.add_check(f"{name}/started", lambda: self.started)

    def add_check(self, name: str, check: ReadinessCheck) -> None:
        self.server.add_check(f"{self.name}/{name}", check)

    async def start(self) -> None:
        self.started = True

    async def stop(self) -> None:
        self.started = False


# Both are a service's Health, checked by mypy.
_server_is_health: type[Health] = HealthServer
_stage_is_health: type[Health] = StageHealth
