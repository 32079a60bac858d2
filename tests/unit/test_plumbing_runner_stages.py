"""Several services in one process (``plumbing.runner.run_stages``): one stops, all stop; one health endpoint."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Iterator

import aiohttp
import pytest

from plumbing import observability
from plumbing.runner import ProcessSettings, run_stages


@pytest.fixture(autouse=True)
def _root_logger_restored() -> Iterator[None]:
    """``run_stages`` sets up the process's logging, as a service's main does; these tests put it back."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


class _Waiter:
    """A stage that runs until it is told to stop, and notes that it was."""

    def __init__(self) -> None:
        self.stopped = False

    async def __call__(self, stop: asyncio.Event) -> None:
        await stop.wait()
        self.stopped = True


async def _fails(stop: asyncio.Event) -> None:
    await asyncio.sleep(0.05)
    raise ValueError("no key")


async def _returns(stop: asyncio.Event) -> None:
    return None


def test_a_failing_stage_stops_the_others_and_its_error_is_the_process_s() -> None:
    waiter = _Waiter()
    with pytest.raises(ValueError, match="no key"):
        run_stages(ProcessSettings(metrics_port=0), {"a": waiter, "b": _fails}, service="controller")
    assert waiter.stopped


def test_a_stage_that_returns_stops_the_others_too() -> None:
    waiter = _Waiter()
    assert run_stages(ProcessSettings(metrics_port=0), {"a": waiter, "b": _returns}, service="controller") == 0
    assert waiter.stopped


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_the_shared_health_server_is_ready_once_every_stage_started_and_its_checks_pass() -> None:
    server = observability.HealthServer(port=_free_port(), host="127.0.0.1")
    watcher, applier = server.stage("watcher"), server.stage("applier")
    kube_ok = False
    applier.add_check("kubernetes", lambda: kube_ok)
    await server.start()
    try:
        async with aiohttp.ClientSession() as session:

            async def readyz() -> tuple[int, str]:
                async with session.get(f"http://127.0.0.1:{server.port}/readyz") as resp:
                    return resp.status, await resp.text()

            assert await readyz() == (503, "not ready: watcher/started, applier/started, applier/kubernetes\n")
            await watcher.start()
            await applier.start()
            assert await readyz() == (503, "not ready: applier/kubernetes\n")
            kube_ok = True
            assert await readyz() == (200, "ok\n")
            await applier.stop()  # a stage's stop leaves the server to its owner, and the process not ready
            assert await readyz() == (503, "not ready: applier/started\n")
    finally:
        await server.stop()
