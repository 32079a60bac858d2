"""One compose project per test run, driven through the docker CLI as a user would, and always torn down.

Why a project of its own (a random name, free host ports, a state folder under the test's tmp): a run must
never touch a stack someone started by hand from the same file, nor a second run's. Why every wait is
bounded and every call has a timeout: an engine that hangs must fail a test, not CI.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import phase_times
import yaml
from faults.support import WriteCounts, read_write_counts
from nats.aio.client import Client as NATS

from plumbing import bus
from tjpipe.local.kubeapi import LocalKube
from tjpipe.local.procs import free_port

REPO = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO / "compose" / "docker-compose.yml"
ENGINE_TIMEOUT = 10.0
PIPELINE_WRITES = (
    ("jobsets", ""),
    ("configmaps", ""),
    ("secrets", ""),
    ("trainjobs", ""),
    ("trainjobs", "status"),
    ("podgroups", ""),
)
"""What the applier writes; the simulated cluster's own writes (pods, jobs, nodes, leases, JobSet status)
go on while the pipeline is idle and are not counted."""


def pipeline_writes(counts: WriteCounts) -> int:
    return sum(counts.writes(resource, sub) for resource, sub in PIPELINE_WRITES)


def settled_writes(kube: LocalKube, *, rounds: int = 30) -> WriteCounts:
    """The API server's write counts once 3 s pass without a pipeline write (the last status writes of
    finished work are done); the pipeline still writing after ``rounds`` such tries fails."""
    before = read_write_counts(kube)
    for _ in range(rounds):
        time.sleep(3)
        now = read_write_counts(kube)
        if pipeline_writes(now - before) == 0:
            return now
        before = now
    raise AssertionError(f"the pipeline kept writing for {rounds * 3} s with nothing to do")


def build_images(say: Callable[[str], None]) -> None:
    """Every image the compose file names, with the project's offline builder (tools/compose_images.py);
    cached, so a warm run takes seconds."""
    started = time.monotonic()
    assert image_builder().main([]) == 0
    took = time.monotonic() - started
    phase_times.inside("compose images (built or found)", took)
    say(f"images ready in {took:.0f}s")


def engine_problem() -> str | None:
    """Why no stack can run here, in one line, or None when a Docker engine answers."""
    if shutil.which("docker") is None:
        return "no docker command on PATH (.ci/run installs docker.io and starts dockerd)"
    try:
        completed = subprocess.run(
            ["docker", "info", "--format", "{{.ServerVersion}}"], capture_output=True, timeout=ENGINE_TIMEOUT
        )
    except subprocess.TimeoutExpired:
        return "the Docker engine did not answer `docker info` within 10 s"
    if completed.returncode != 0:
        return "no Docker engine answers `docker info` (.ci/run starts dockerd when none runs)"
    return None


def image_builder() -> Any:
    """tools/compose_images.py as a module: the project's offline image builder (not a package, so loaded by path)."""

    spec = importlib.util.spec_from_file_location("compose_images", REPO / "tools" / "compose_images.py")
    assert spec is not None and spec.loader is not None
    builder = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = builder  # its dataclasses look their module up there
    spec.loader.exec_module(builder)
    return builder


def compose_tools(v2_config: Path | None) -> dict[str, list[str]]:
    """The compose commands present: Debian's docker-compose 1.29, and compose v2 as a plugin the docker CLI
    has, or as built from its module (``v2_config``, a Docker configuration folder holding it)."""
    tools: dict[str, list[str]] = {}
    if shutil.which("docker-compose"):
        tools["docker-compose"] = ["docker-compose"]
    native = subprocess.run(["docker", "compose", "version"], capture_output=True, timeout=ENGINE_TIMEOUT, check=False)
    if native.returncode == 0:
        tools["docker compose"] = ["docker", "compose"]
    elif v2_config is not None:
        tools["docker compose"] = ["docker", "--config", str(v2_config), "compose"]
    return tools


@dataclass
class Project:
    """``<tool> -p NAME -f compose/docker-compose.yml …`` with this run's ports and state folder."""

    tool: Sequence[str]
    state: Path
    name: str = field(default_factory=lambda: f"tjtest{secrets.token_hex(4)}")
    kube_port: int = field(default_factory=free_port)
    nats_port: int = field(default_factory=free_port)
    history_port: int = field(default_factory=free_port)
    status_port: int = field(default_factory=free_port)
    """The status server's host port, which is also the URL the planner gives trainer pods."""
    overrides: list[Path] = field(default_factory=list)
    """Compose files read after the main one (``-f``), e.g. other images for some services."""
    main_file: Path = COMPOSE_FILE
    """The first compose file (the fleet's hub is a file of its own)."""
    options: list[str] = field(default_factory=list)
    """Options before the command, e.g. ``--profile fleet``."""
    settings: dict[str, str] = field(default_factory=dict)
    """Variables the compose file reads (``${TJPIPE_…}``) set for this project alone."""

    @property
    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TJPIPE_", "COMPOSE_"))}
        env.update(
            TJPIPE_COMPOSE_STATE=str(self.state),
            TJPIPE_COMPOSE_KUBE_PORT=str(self.kube_port),
            TJPIPE_COMPOSE_NATS_PORT=str(self.nats_port),
            TJPIPE_COMPOSE_HISTORY_PORT=str(self.history_port),
            TJPIPE_COMPOSE_STATUS_PORT=str(self.status_port),
            TJPIPE_POD_RUN_SECONDS="3",
        )
        env.update(self.settings)
        return env

    def run(self, *args: str, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess[str]:
        completed = subprocess.run(
            [*self.tool, "-p", self.name, "-f", str(self.main_file), *self._override_args(), *self.options, *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and completed.returncode != 0:
            raise AssertionError(
                f"{' '.join(self.tool)} {' '.join(args)} failed ({completed.returncode}):\n"
                f"{completed.stdout[-3000:]}\n{completed.stderr[-3000:]}"
            )
        return completed

    def _override_args(self) -> list[str]:
        return [arg for path in self.overrides for arg in ("-f", str(path))]

    def container(self, service: str) -> str:
        """The id of the service's container (one replica), stopped or not."""
        project = f"label=com.docker.compose.project={self.name}"
        service_label = f"label=com.docker.compose.service={service}"
        found = _docker("ps", "-a", "-q", "--filter", project, "--filter", service_label).split()
        assert found, f"no container for {service} in project {self.name}"
        return found[0]

    def state_of(self, service: str) -> dict[str, Any]:
        state: dict[str, Any] = json.loads(_docker("inspect", "--format", "{{json .State}}", self.container(service)))
        return state

    def wait_exited(self, service: str, *, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = self.state_of(service)
            if state["Status"] == "exited":
                return int(state["ExitCode"])
            time.sleep(2)
        raise AssertionError(f"{service} still running after {timeout:.0f}s:\n{self.logs(service)[-4000:]}")

    def wait_healthy(self, service: str, *, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if (self.state_of(service).get("Health") or {}).get("Status") == "healthy":
                return
            time.sleep(1)
        raise AssertionError(f"{service} not healthy after {timeout:.0f}s:\n{self.logs(service)[-4000:]}")

    def exec(self, service: str, *argv: str) -> subprocess.CompletedProcess[str]:
        """``argv`` in the service's running container, as its user."""
        return subprocess.run(
            ["docker", "exec", self.container(service), *argv], capture_output=True, text=True, timeout=60, check=False
        )

    def logs(self, *services: str) -> str:
        return self.run("logs", "--no-color", *services, timeout=60, check=False).stdout

    def down(self) -> None:
        self.run("down", "-v", "--remove-orphans", "--timeout", "5", timeout=180, check=False)

    def leftovers(self) -> dict[str, list[str]]:
        label = f"label=com.docker.compose.project={self.name}"
        return {
            "containers": _docker("ps", "-a", "-q", "--filter", label).split(),
            "volumes": _docker("volume", "ls", "-q", "--filter", label).split(),
            "networks": _docker("network", "ls", "-q", "--filter", label).split(),
        }

    def kube(self) -> LocalKube:
        """The published apiserver as the host sees it, from the kubeconfig init wrote into the state folder."""
        kubeconfig = self.state / "kubeconfig"
        loaded = yaml.safe_load(kubeconfig.read_text())
        cluster = loaded["clusters"][0]["cluster"]
        ca_file = self.state / "apiserver-ca.crt"
        ca_file.write_bytes(base64.b64decode(cluster["certificate-authority-data"]))
        token = loaded["users"][0]["user"]["token"]
        return LocalKube(server=cluster["server"], token=token, ca_file=ca_file, kubeconfig=kubeconfig, processes=())

    async def reader(self) -> NATS:
        """The bus from the host, as the read-only ``reader`` identity init gave the state folder."""
        url = f"tls://127.0.0.1:{self.nats_port}"  # as the state folder's env file says
        tls = bus.TlsFiles(ca=str(self.state / "nats-ca.crt"))
        return await bus.connect(url, name=f"{self.name}-test-reader", creds=self.state / "reader.nk", tls=tls)


def _docker(*args: str) -> str:
    completed = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=60, check=True)
    return completed.stdout


# ------------------------------------------------------------------------------------ exactly once, counted

WRITTEN = ("created", "configured")
"""The results that stand for a write to the API server."""


def plan_key(source_seq: int, component: str, target: object) -> tuple[int, str, str]:
    """One plan: the event it was made from, the component and the target. A plan published twice under
    two message ids (the stream's duplicate check only drops the same id) shows as this key twice."""
    return (source_seq, component, str(target))


def exactly_once_problems(plans: Sequence[Any], results: Sequence[Any], *, redeliveries: bool) -> list[str]:
    """What breaks "nothing doubled" in one namespace's recorded plans (``ApplyMessage``, from the apply
    history) and results (``ApplyResult``): each plan recorded once, each target created once, each plan
    written at most once; and, where nothing could make the bus deliver a plan again (``redeliveries``
    False: no replica killed, no server lost), exactly one result per plan and none for a plan never made.
    """
    from collections import Counter

    from contracts.messages import component_of

    problems: list[str] = []
    planned = Counter(plan_key(p.source_seq, component_of(p), p.target) for p in plans)
    twice = {k: n for k, n in planned.items() if n > 1}
    if twice:
        problems.append(f"{len(twice)} plan(s) recorded more than once, e.g. {sorted(twice.items())[:3]}")
    answered = Counter(plan_key(r.source_seq, r.component, r.target) for r in results)
    if not redeliveries:
        many = {k: n for k, n in answered.items() if n > 1}
        if many:
            problems.append(f"{len(many)} plan(s) with more than one result, e.g. {sorted(many.items())[:3]}")
        unanswered = sorted(set(planned) - set(answered))
        if unanswered:
            problems.append(f"{len(unanswered)} plan(s) with no result, e.g. {unanswered[:3]}")
    orphans = sorted(set(answered) - set(planned))
    if orphans:
        problems.append(f"{len(orphans)} result(s) for no recorded plan, e.g. {orphans[:3]}")
    writes = Counter(plan_key(r.source_seq, r.component, r.target) for r in results if r.action in WRITTEN)
    rewritten = {k: n for k, n in writes.items() if n > 1}
    if rewritten:
        problems.append(f"{len(rewritten)} plan(s) written more than once, e.g. {sorted(rewritten.items())[:3]}")
    created = Counter(str(r.target) for r in results if r.action == "created")
    recreated = {k: n for k, n in created.items() if n > 1}
    if recreated:
        problems.append(f"{len(recreated)} target(s) created more than once, e.g. {sorted(recreated.items())[:3]}")
    return problems


async def namespace_record(nc: NATS, namespace: str) -> tuple[list[Any], list[Any]]:
    """The plans (apply history) and results of ``namespace``, decoded, as a reader reads them."""
    from faults.support import apply_filter, results_filter

    from contracts import messages, streams
    from tjpipe import history_tools

    js = nc.jetstream()
    plans = [
        messages.decode_apply(stored.data)
        for stored in await history_tools.read_stream(js, streams.APPLY_HISTORY.name, apply_filter(namespace))
    ]
    results = [
        messages.decode_result(stored.data)
        for stored in await history_tools.read_stream(js, streams.RESULTS.name, results_filter(namespace))
    ]
    return plans, results
