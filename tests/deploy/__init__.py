"""Checks of the deployment files (Dockerfile, compose, kustomize) against what the code actually reads and does.

The helpers here derive the facts the files must agree with from the code itself: which environment
variables each ``tjpipe`` subcommand reads and where a deployment sets each (from the settings' declarations,
through the parser made from them), which the streams read, and what each Dockerfile stage runs.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "Dockerfile"


def _declarations() -> dict[str, list[Any]]:
    """Subcommand (``watcher``, ``planner``, ...) -> the settings its flags were made from, each with its
    environment variable and where a deployment sets it (``plumbing.configuration.Setting``)."""
    from tjpipe import cli
    from tjpipe.settings import FromEnvironment

    parser = cli.build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {
        command: [
            action.default.setting
            for action in sub._actions
            if isinstance(action.default, FromEnvironment) and action.default.setting is not None
        ]
        for command, sub in subparsers.choices.items()
    }


SERVICE_COMMANDS = ("watcher", "planner", "applier")


def _deployed(where: str) -> frozenset[str]:
    """The variables of the pipeline's services that a deployment sets in the way ``where`` says."""
    declarations = _declarations()
    return frozenset(s.env for c in SERVICE_COMMANDS for s in declarations[c] if s.deployment == where)


# Read by every service but different in every replica (the holder's name in partition leases), so a shared
# configuration must not set it: it defaults to host-pid, and Kubernetes sets it to the pod name.
PER_REPLICA_ENV = _deployed("per-replica")
# Paths of key material that one service alone is given: set per service, next to what it points at,
# never in a configuration every service shares.
PER_SERVICE_ENV = _deployed("per-service")
# The NATS identity of one service (its nkey seed file): set per service, next to its own Secret.
NATS_IDENTITY_ENV = _deployed("identity")
OPTIONAL_ENV = _deployed("optional")
"""Settings a deployment may leave out: the client certificate of mutual TLS (this deployment authenticates
with nkeys), and the event loop (uvloop is not in the image; asyncio's own loop, the default, is what it runs)."""


SERVER_COMMANDS = ("history-server", "status-server")
"""The servers beside the pipeline, each a Deployment of its own (and a compose service): every variable one
reads is set where it runs, checked against its declarations (``unset_settings``)."""

LEFT_OUT = frozenset({"optional", "per-replica"})
"""Where a declaration says a deployment may leave its variable out: a setting that needs not be set, and a
name each replica takes for itself."""


def unset_settings(command: str, env: Iterable[str], args: Sequence[str] = (), *, in_cluster: bool) -> list[str]:
    """The variables ``command`` reads that a deployment of it leaves unset although it must set them.

    ``env`` is what the container's environment sets (its ``env`` and the ConfigMaps of its ``envFrom``),
    ``args`` its arguments (a flag given there sets its setting too). Each declaration says whether a
    deployment may leave its variable out (``LEFT_OUT``); in a cluster, ``KUBECONFIG`` is left out too
    (in-cluster credentials). So a setting added to a server without its variable in ``deploy/`` and compose
    fails here, not in a pod.
    """
    given = set(env)
    missing = set()
    for each in _declarations()[command]:
        if each.deployment in LEFT_OUT or (in_cluster and each.env == "KUBECONFIG") or each.env in given:
            continue
        if any(arg == each.flag or arg.startswith(each.flag + "=") for arg in args):
            continue
        missing.add(each.env)
    return sorted(missing)


def cli_env_names() -> dict[str, set[str]]:
    """Subcommand (``watcher``, ``planner``, ...) -> the environment variables its flags read, from the
    declarations the parser was made from (``tjpipe.settings``)."""
    return {command: {s.env for s in settings} for command, settings in _declarations().items()}


class _RecordingDict(dict[str, str]):
    """An empty environment that remembers which variables were asked for."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: set[str] = set()

    def get(self, key: str, default: Any = None) -> Any:
        self.asked.add(key)
        return default


def stream_env_names() -> set[str]:
    """The variables ``contracts.streams.configured_streams`` reads (retention, replicas)."""
    from contracts import streams

    recorder = _RecordingDict()
    streams.configured_streams(recorder)
    return recorder.asked


def service_env_names() -> dict[str, set[str]]:
    """Per service: the variables its CLI flags read."""
    cli_names = cli_env_names()
    return {service: cli_names[service] for service in SERVICE_COMMANDS}


def known_env_names() -> set[str]:
    """Every variable some service reads; a deployment file that sets anything else has a typo."""
    cli_names = cli_env_names()
    return set().union(*(cli_names[s] for s in SERVICE_COMMANDS)) | stream_env_names()


# --------------------------------------------------------------------------------------------- Dockerfile


@dataclass
class Stage:
    name: str
    base: str
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def last(self, instruction: str) -> str | None:
        values = [args for name, args in self.instructions if name == instruction]
        return values[-1] if values else None

    def all(self, instruction: str) -> list[str]:
        return [args for name, args in self.instructions if name == instruction]

    def exec_form(self, instruction: str) -> list[str] | None:
        value = self.last(instruction)
        if value is None:
            return None
        if value.startswith("["):
            parsed: list[str] = json.loads(value)
            return parsed
        return ["/bin/sh", "-c", value]


def dockerfile_stages(path: Path = DOCKERFILE) -> dict[str, Stage]:
    """The stages of a Dockerfile by name, with global ARG defaults substituted into FROM."""
    text = re.sub(r"\\\n", " ", path.read_text())
    args: dict[str, str] = {}
    stages: dict[str, Stage] = {}
    current: Stage | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        instruction, _, rest = line.partition(" ")
        instruction = instruction.upper()
        rest = rest.strip()
        if instruction == "ARG" and current is None:
            key, _, value = rest.partition("=")
            args[key] = value
            continue
        if instruction == "FROM":
            parts = shlex.split(rest)
            base = re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args.get(m.group(1) or m.group(2), ""), parts[0])
            name = parts[2] if len(parts) >= 3 and parts[1].upper() == "AS" else str(len(stages))
            current = Stage(name=name, base=base)
            stages[name] = current
            continue
        if current is None:
            raise ValueError(f"{path}: {instruction} before the first FROM")
        current.instructions.append((instruction, rest))
    return stages
