"""Operating a running nats-server from outside it: have it read its configuration again, and see who is
logged in with which key. A seed rotation needs both on a real deployment, so this lives beside the
credentials and not in the local developer stack, which uses it too.

Why a reload by signal, read back from ``/varz``: nats-server reads its configuration again on SIGHUP
(what ``nats-server --signal reload`` sends) and keeps every connection whose user it still lists; the
signal itself says nothing about when the new configuration is in force, but ``config_load_time`` does.
``/connz?auth=true`` names the nkey each connection logged in with, which tells a key rotation when no
connection uses an old key any more.
"""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

# Monitoring endpoints are reached directly: a proxy from the environment would hide the server.
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def server_pid(target: str) -> int:
    """The pid in ``target``: a number, or a pid file (nats-server's ``pid_file``, or the local stack's
    ``logs/nats.pid``, whose first word is the pid)."""
    text = target.strip()
    if not text.isdigit():
        try:
            words = Path(target).read_text().split()
        except OSError as exc:
            raise ValueError(f"cannot read the nats-server pid file {target}: {exc.strerror}") from exc
        text = words[0] if words else ""
    if not text.isdigit():
        raise ValueError(f"{target}: neither a pid nor a file holding one")
    return int(text)


def reload_config(target: str, *, monitor_url: str | None = None, timeout: float = 15.0) -> None:
    """Have the nats-server ``target`` (:func:`server_pid`) read its configuration again (SIGHUP).

    With ``monitor_url``, returns once its ``/varz`` shows the configuration reloaded, and fails if that
    does not happen within ``timeout`` (a config file it cannot parse is refused and logged by the server,
    which goes on with the old one).
    """
    pid = server_pid(target)
    before = get_json(f"{monitor_url}/varz").get("config_load_time") if monitor_url else None
    try:
        os.kill(pid, signal.SIGHUP)
    except ProcessLookupError:
        raise ValueError(f"no nats-server with pid {pid} ({target})") from None
    if monitor_url is None:
        return
    deadline = time.monotonic() + timeout
    while get_json(f"{monitor_url}/varz").get("config_load_time") in (before, None):
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"nats-server {pid} did not reload its configuration within {timeout:.0f}s; see its log "
                "(a config it cannot read is refused and the old one kept)"
            )
        time.sleep(0.1)


def connections_by_key(monitor_url: str) -> dict[str, list[str]]:
    """Public nkey → the names of the client connections logged in with it, from ``/connz?auth=true``."""
    out: dict[str, list[str]] = {}
    offset = 0
    while True:
        page = get_json(f"{monitor_url}/connz?auth=true&limit=1024&offset={offset}")
        if not page:
            raise ValueError(f"no answer from the NATS monitoring endpoint {monitor_url}/connz")
        connections = page.get("connections") or []
        for connection in connections:
            key = str(connection.get("authorized_user") or "")
            out.setdefault(key, []).append(str(connection.get("name") or connection.get("cid")))
        offset += len(connections)
        if not connections or offset >= int(page.get("total") or 0):
            return out


def get_json(url: str) -> dict[str, Any]:
    try:
        with _DIRECT.open(url, timeout=1) as response:
            body = json.loads(response.read())
    except (urllib.error.URLError, ConnectionError, TimeoutError, ValueError):
        return {}
    return body if isinstance(body, dict) else {}
