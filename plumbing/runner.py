"""Process life for a service: logs that machines can read, and a clean stop on SIGTERM or Ctrl-C.

Log records are one JSON object a line, carrying the TrainJob key and trace id where the code knows them,
so that ``grep`` over all three services' logs follows one TrainJob through the pipeline. A terminal gets
plain text instead, since a person is reading it.

Several stages can share one process (``run_stages``): each still starts as it would alone, with its own
NATS identity and keys, and only the interpreter, the event loop and the health endpoint are shared. A
Python process costs about 45 MB before it holds any TrainJob, so on a small cluster one process instead
of three saves about half the pipeline's memory; what it gives up is keeping the stages' keys and
cluster access in processes of their own.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import logging
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from plumbing import bus
from plumbing.configuration import ProcessSettings, ServiceSettings
from plumbing.kube import KubeClient
from plumbing.observability import Health, HealthServer

S = TypeVar("S", bound="ProcessSettings")
T = TypeVar("T")

_STANDARD = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith("_"):
                out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def configure_logging(level: str, *, json_logs: bool | None = None) -> None:
    use_json = (not sys.stderr.isatty()) if json_logs is None else json_logs
    handler = logging.StreamHandler(sys.stderr)
    if use_json:
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
        logging.Formatter.converter = time.gmtime
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("nats", "asyncio", "kubernetes", "urllib3"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))


def run_service(settings: S, main: Callable[[S, asyncio.Event], Awaitable[None]]) -> int:
    """Run ``main(settings, stop)``, logging as ``settings`` say, until it returns or a signal sets ``stop``.

    The one way every ``tjpipe`` service process runs (watcher, planner, applier, webhook).
    """
    configure_logging(settings.log_level, json_logs=settings.json_logs)

    async def runner() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError):
                loop.add_signal_handler(sig, stop.set)
        await main(settings, stop)

    try:
        with asyncio.Runner(loop_factory=loop_factory(settings.event_loop)) as loop_runner:
            loop_runner.run(runner())
    except KeyboardInterrupt:
        return 130
    return 0


def loop_factory(name: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The event loop a process runs on; ``None`` is asyncio's default."""
    if name == "asyncio":
        return None
    if name == "uvloop":
        try:
            import uvloop
        except ImportError:
            raise SystemExit("--event-loop uvloop needs the uvloop package: pip install uvloop") from None
        factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
        return factory
    raise SystemExit(f"unknown event loop {name!r}: asyncio or uvloop")


Stage = Callable[[asyncio.Event], Coroutine[Any, Any, None]]
"""One service's main with its settings bound: it runs until the event is set."""

_SHARED_HEALTH: contextvars.ContextVar[HealthServer | None] = contextvars.ContextVar("shared_health", default=None)


def run_stages(settings: ProcessSettings, stages: Mapping[str, Stage], *, service: str) -> int:
    """Run several services in one process until a signal, or until one of them ends; then stop them all.

    They share one health server on ``settings.metrics_port``: its readiness checks are every stage's,
    named ``stage/check``, and it is not ready before every stage has started. A stage that fails stops
    the others, and its error is the process's.
    """

    async def together(_settings: ProcessSettings, stop: asyncio.Event) -> None:
        health = HealthServer(port=settings.metrics_port, service=service)
        token = _SHARED_HEALTH.set(health)
        await health.start()
        try:
            tasks = {asyncio.create_task(stage(stop), name=name): name for name, stage in stages.items()}
            done, _pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            if not stop.is_set():
                first = next(iter(done))
                why = "failed" if not first.cancelled() and first.exception() is not None else "ended"
                logging.getLogger(__name__).error("the %s stage %s; stopping the others", tasks[first], why)
            stop.set()
            await asyncio.wait(tasks)
            for task in tasks:  # the first failure, in the stages' order, is the process's
                error = None if task.cancelled() else task.exception()
                if error is not None:
                    raise error
        finally:
            _SHARED_HEALTH.reset(token)
            await health.stop()

    return run_service(settings, together)


# ------------------------------------------------------------------------------------------- start-up


@dataclass(frozen=True)
class Started:
    health: Health
    """Not serving yet: the service adds its own readiness checks, then starts it."""
    connection: NATS | None = None
    jetstream: JetStreamContext | None = None
    kube: KubeClient | None = None

    @property
    def nc(self) -> NATS:
        return _required(self.connection, "a NATS connection")

    @property
    def js(self) -> JetStreamContext:
        return _required(self.jetstream, "a NATS connection")

    def kube_client(self) -> KubeClient:
        return _required(self.kube, "a Kubernetes client")


def _required(resource: T | None, what: str) -> T:
    if resource is None:
        raise RuntimeError(f"this service was started without {what}")
    return resource


@contextlib.asynccontextmanager
async def started(
    name: str, settings: ProcessSettings, *, kube: Callable[[], KubeClient] | None = None
) -> AsyncIterator[Started]:
    """The start-up and shut-down every service shares (the three pipeline services and the webhook).

    With ``ServiceSettings``, connects to NATS as the service's identity; makes the health server
    (readiness includes the connection), then opens the Kubernetes client ``kube`` makes, if any
    (readiness includes it too). On the way out, whatever happened: the health server stops and the
    connection drains, so that what was acknowledged is flushed, and only then does the Kubernetes client
    close.
    """
    nc: NATS | None = None
    stage = name.removeprefix("tjpipe-")
    if isinstance(settings, ServiceSettings):
        # A service's stage is its NATS identity's name: its inbox is the identity's, so it outlives a rotation.
        tls = bus.TlsFiles.from_options(settings.nats_tls_ca, settings.nats_tls_cert, settings.nats_tls_key)
        nc = await bus.connect(settings.nats_url, name=name, creds=settings.nats_creds, tls=tls, identity=stage)
    shared = _SHARED_HEALTH.get()
    health: Health = (
        shared.stage(stage) if shared is not None else HealthServer(port=settings.metrics_port, service=stage)
    )
    if nc is not None:
        connection = nc
        health.add_check("nats", lambda: connection.is_connected)
    async with contextlib.AsyncExitStack() as resources:
        client = await resources.enter_async_context(kube()) if kube is not None else None
        if client is not None:
            health.add_check("kubernetes", client.reachable)
        try:
            yield Started(
                health=health, connection=nc, jetstream=nc.jetstream() if nc is not None else None, kube=client
            )
        finally:
            await health.stop()
            if nc is not None:
                await nc.drain()
