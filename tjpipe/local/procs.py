"""Child processes the local stack owns: started, watched and stopped as whole process groups.

Why process groups: the servers we run (etcd, kube-apiserver, nats-server) may fork helpers, and a
test that stops "its" server must not leave any descendant holding a port or a data directory. Each child
is therefore started in a new session, which makes it the leader of its own process group, and every stop
signals the whole group.

Why pid files with a start time: `tjpipe down` runs in a different process from `tjpipe up` and only has
the files in the log directory to go on. A bare pid can be recycled by an unrelated process after a
crash or reboot; the kernel's start time (field 22 of /proc/<pid>/stat) next to it tells the two apart,
so we never signal a stranger. Once the leader has exited, its pid stays reserved as long as any member
of its group is alive, so the group can still be cleaned up by pgid.

Why logs go to files and not pipes: a pipe nobody drains blocks the server once it fills up, and a file
is what a developer wants to `tail` when something goes wrong anyway.
"""

from __future__ import annotations

import collections
import contextlib
import http.client
import os
import random
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

_POLL_SECONDS = 0.05
_LOG_TAIL_LINES = 20


class ManagedProcess:
    """One child server, the leader of its own process group, logging into `log_path`."""

    def __init__(self, *, name: str, popen: subprocess.Popen[bytes], log_path: Path, pid_path: Path) -> None:
        self.name = name
        self.popen = popen
        self.log_path = log_path
        self.pid_path = pid_path

    def __repr__(self) -> str:
        return f"ManagedProcess(name={self.name!r}, pid={self.pid}, log_path={str(self.log_path)!r})"

    @property
    def pid(self) -> int:
        return self.popen.pid

    def is_running(self) -> bool:
        return self.popen.poll() is None

    def log_tail(self, lines: int = _LOG_TAIL_LINES) -> str:
        return read_log_tail(self.log_path, lines=lines)

    def stop(self, timeout: float = 10) -> None:
        """SIGTERM the whole group, SIGKILL whatever is left after `timeout`; safe to call twice."""
        pgid = self.popen.pid
        # Until the leader is reaped, or while any member of its group lives, the kernel keeps `pgid`
        # reserved; after that it may belong to a stranger, so a repeated stop() must not signal it.
        if self.popen.poll() is None or _group_has_live_members(pgid):
            _signal_group(pgid, signal.SIGTERM)
            deadline = time.monotonic() + timeout
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout=max(0.0, deadline - time.monotonic()))
            if not _wait_for_group_exit(pgid, deadline=deadline):
                _signal_group(pgid, signal.SIGKILL)
                self.popen.wait()
                _wait_for_group_exit(pgid, deadline=time.monotonic() + 5)
        if _recorded_pid(self.pid_path) == pgid:
            self.pid_path.unlink(missing_ok=True)


NOT_INHERITED = ("NATS_URL", "NATS_CREDS", "NATS_TLS_CA", "NATS_TLS_CERT", "NATS_TLS_KEY", "KUBECONFIG")
"""The environment that points a client at existing servers; ``spawn`` passes it on only when told to."""


def spawn(
    *,
    name: str,
    argv: Sequence[str],
    log_dir: Path,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> ManagedProcess:
    """Start `argv` as a new process-group leader; `env` is added on top of the current environment.

    The variables that point a client at existing servers (``NOT_INHERITED``) are left out of the
    inherited part: a local server or controller that read the user's ``KUBECONFIG`` would act on the
    user's cluster. Whoever needs them passes them in ``env``.
    """
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{name}.log"
    pid_path = log_dir / f"{name}.pid"
    child_env = {k: v for k, v in os.environ.items() if k not in NOT_INHERITED}
    if env:
        child_env.update(env)
    with log_path.open("ab") as log_file:
        log_file.write(f"--- {time.strftime('%Y-%m-%dT%H:%M:%S')} starting: {' '.join(argv)}\n".encode())
        log_file.flush()
        popen = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=child_env,
            cwd=cwd,
            start_new_session=True,
        )
    start_time = _process_start_time(popen.pid)
    partial_pid_path = pid_path.with_name(f".{pid_path.name}.partial")
    partial_pid_path.write_text(f"{popen.pid} {start_time if start_time is not None else '-'}\n")
    os.replace(partial_pid_path, pid_path)
    return ManagedProcess(name=name, popen=popen, log_path=log_path, pid_path=pid_path)


def stop_from_pid_files(log_dir: Path, *, timeout: float = 10) -> list[str]:
    """Stop the process groups recorded in `log_dir/*.pid` by another process; return the names stopped.

    Groups stop one after another, newest first, the reverse of the order they were started in: a
    server must not lose what it depends on while shutting down (kube-apiserver waits out its whole
    grace period retrying a dead etcd if both get SIGTERM together).
    """
    targets: list[tuple[int, str, int]] = []
    for pid_path in sorted(log_dir.glob("*.pid")):
        pgid = _live_group_from_pid_file(pid_path)
        if pgid is None:
            pid_path.unlink(missing_ok=True)
            continue
        targets.append((_process_start_time(pgid) or 0, pid_path.stem, pgid))
    stopped = []
    for _, name, pgid in sorted(targets, reverse=True):
        _signal_group(pgid, signal.SIGTERM)
        if not _wait_for_group_exit(pgid, deadline=time.monotonic() + timeout):
            _signal_group(pgid, signal.SIGKILL)
            _wait_for_group_exit(pgid, deadline=time.monotonic() + 5)
        (log_dir / f"{name}.pid").unlink(missing_ok=True)
        stopped.append(name)
    return stopped


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


LISTEN_PORTS_FROM = 10000
"""The lowest port ``free_port`` hands out: above the well-known and the usual fixed service ports."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago, chosen below the kernel's ephemeral range.

    Between this answer and the server's own bind the port is free for anyone to take. Taken from the
    ephemeral range (a bind to port 0), it was taken, on a busy machine, by the local end of some outgoing
    connection or by another process's bind to port 0, and the server failed with "address already in use".
    Nothing takes a port below that range unless it asks for that port, so a random one there is left alone.
    """
    low, _high = _ephemeral_range()
    rng = random.SystemRandom()
    for _ in range(100):
        port = rng.randrange(LISTEN_PORTS_FROM, max(LISTEN_PORTS_FROM + 1, low))
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:  # a crowded range: the kernel's pick
        probe.bind(("127.0.0.1", 0))
        chosen: int = probe.getsockname()[1]
        return chosen


def wait_until(
    predicate: Callable[[], bool],
    *,
    timeout: float,
    what: str,
    process: ManagedProcess | None = None,
) -> None:
    """Poll `predicate` until it holds; fail early, with its log, if `process` dies meanwhile."""
    deadline = time.monotonic() + timeout
    interval = _POLL_SECONDS
    while True:
        if predicate():
            return
        if process is not None and not process.is_running():
            raise RuntimeError(
                f"{process.name} exited with code {process.popen.returncode} while waiting for {what}; "
                f"last lines of {process.log_path}:\n{process.log_tail()}"
            )
        if time.monotonic() >= deadline:
            log_hint = f"; see {process.log_path}" if process is not None else ""
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}{log_hint}")
        time.sleep(interval)
        interval = min(interval * 1.5, 0.25)


# Loopback probes must never go through an HTTP proxy configured in the environment.
_NO_PROXY = urllib.request.ProxyHandler({})


def http_status(
    url: str, *, tls: ssl.SSLContext | None = None, token: str | None = None, timeout: float = 2
) -> int | None:
    """The HTTP status a local server answers ``url`` with (a bearer ``token`` if given), None if it does not
    answer: the one readiness probe for the servers the local stack starts."""
    handlers: list[urllib.request.BaseHandler] = [_NO_PROXY]
    if tls is not None:
        handlers.append(urllib.request.HTTPSHandler(context=tls))
    request = urllib.request.Request(url)
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.build_opener(*handlers).open(request, timeout=timeout) as response:
            status: int = response.status
            return status
    except urllib.error.HTTPError as error:
        return error.code
    except (urllib.error.URLError, http.client.HTTPException, ConnectionError, TimeoutError, ssl.SSLError):
        return None


def http_ok(url: str, *, timeout: float = 2) -> bool:
    """Whether a local server answers ``url`` with 200."""
    return http_status(url, timeout=timeout) == 200


def read_log_tail(log_path: Path, *, lines: int = _LOG_TAIL_LINES) -> str:
    try:
        with log_path.open("r", errors="replace") as log_file:
            return "".join(collections.deque(log_file, maxlen=lines)).rstrip("\n")
    except FileNotFoundError:
        return "(no log file)"


def _signal_group(pgid: int, signum: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


def _proc_stat_fields(pid: int) -> list[str] | None:
    """Fields 3.. of /proc/<pid>/stat (the command name may contain spaces, so split after it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return stat[stat.rindex(")") + 2 :].split()


def _process_start_time(pid: int) -> int | None:
    fields = _proc_stat_fields(pid)
    return int(fields[22 - 3]) if fields is not None else None


def _group_has_live_members(pgid: int) -> bool:
    """True while a non-zombie process is in group `pgid` (zombies hold no ports or files)."""
    proc = Path("/proc")
    if not proc.is_dir():
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return False
        return True
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        fields = _proc_stat_fields(int(entry.name))
        if fields is not None and fields[0] != "Z" and int(fields[5 - 3]) == pgid:
            return True
    return False


def _wait_for_group_exit(pgid: int, *, deadline: float) -> bool:
    while _group_has_live_members(pgid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(_POLL_SECONDS)
    return True


def _recorded_pid(pid_path: Path) -> int | None:
    try:
        return int(pid_path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _live_group_from_pid_file(pid_path: Path) -> int | None:
    """The pgid to stop for this pid file, or None when it is stale or belongs to someone else now."""
    try:
        recorded_pid, recorded_start = pid_path.read_text().split()[:2]
        pid = int(recorded_pid)
    except (OSError, ValueError):
        return None
    fields = _proc_stat_fields(pid)
    if fields is None:
        # The leader is gone, but while any member of its group lives the kernel keeps the pid reserved as
        # that group's id, so the group is still ours.
        return pid if _group_has_live_members(pid) else None
    if fields[0] == "Z":
        return pid if _group_has_live_members(pid) else None
    if recorded_start == "-" or int(fields[22 - 3]) != int(recorded_start):
        return None  # a recycled pid: some unrelated process
    if int(fields[5 - 3]) != pid:
        return None  # no longer a group leader, so not the process we started
    return pid
