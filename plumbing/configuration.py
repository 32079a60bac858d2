"""What a process is configured with: how a setting is declared, and the settings every process shares.

A setting is declared once, as a field of its service's settings dataclass, next to the code that reads it::

    concurrency: int = setting(16, flag="--concurrency", env="TJPIPE_APPLY_CONCURRENCY", help="concurrent applies",
                               check=AT_LEAST_ONE)

The field gives the setting's name, type and default; ``setting`` adds the flag, the environment variable,
the help, the unit and the check, kept in the field's metadata. Everything else is made from these
declarations and nothing else: the command line's flags (``tjpipe.settings`` turns each declaration into an
argparse argument, and the parsed arguments back into the dataclass), the settings reference page
(``tools/gen_docs.py``) and the check that compose, ``deploy/`` and the chart set every variable a service
reads (``tests/deploy``). Adding a setting is one field here or in a service's ``settings`` module, its use,
and its test.

Why dataclass field metadata, and not a descriptor or a settings library: the settings objects already were
dataclasses that tests and benchmarks build directly, and metadata adds the declaration without changing
what they are (a plain instance, no validation layer at attribute access, no import beyond the standard
library). A settings library (pydantic-settings and the like) would also read the environment itself, which
here only the command line does, and would cost every service its import time and memory for what four
dataclass fields of metadata say. This module imports nothing that does I/O, so the command line can build
its parser from the services' declarations without loading NATS or the Kubernetes client.

Checks that span several settings (a TLS certificate without its key, a feature gate that needs a URL) are
not declarations: they stay in ``tjpipe.settings``, the one module that turns flags into settings objects.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

SETTING = "tjpipe.setting"
"""The key of a field's metadata that holds its ``Setting``."""

_FIELD_DEFAULT: Any = object()
"""A command starts from the field's default (``Setting.command_default`` not given)."""

SWEEP_SECONDS = 15.0
"""How often a partitioned consumer looks in its work stream for finished work the server kept, by default."""


@dataclass(frozen=True)
class Check:
    """A condition one setting's value must meet, and how the error and the reference page say it."""

    test: Callable[[Any], bool]
    words: str
    """What the value must be, as in "must be {words}"."""


def positive_seconds(text: str) -> float:
    """A ``parse`` for seconds above 0 (and finite): a value that cannot be one is refused as it is read."""
    value = float(text)
    if not value > 0 or value == float("inf"):
        raise ValueError(text)
    return value


positive_seconds.__name__ = "positive number"

ABOVE_ZERO = Check(lambda value: value > 0 and value != float("inf"), "above 0")
AT_LEAST_ZERO = Check(lambda value: value >= 0, "0 or more")
AT_LEAST_ONE = Check(lambda value: value >= 1, "1 or more")


Deployment = str
"""Where a deployment sets a setting's variable: ``shared`` (the configuration every service of it reads),
``per-replica`` (each replica its own, e.g. the pod's name), ``per-service`` (a path to one service's own key
material), ``identity`` (one service's NATS identity), ``optional`` (a deployment may leave it out), or
``flag`` (no variable: a container's args set it)."""


@dataclass(frozen=True)
class Setting:
    """One setting's declaration. ``name``, ``type`` and ``default`` come from the field it is declared on."""

    flag: str
    env: str | None
    help: str
    unit: str = ""
    """What a number counts (``seconds``); shown in the help and on the reference page."""
    check: Check | None = None
    choices: tuple[str, ...] = ()
    parse: Callable[[str], Any] | None = None
    """Text to value, where the field's type alone does not say how (``int``, ``float``, ``str`` and ``bool``
    do; ``tuple[str, ...]`` is a repeatable flag or a comma-separated variable)."""
    deployment: Deployment = "shared"
    per_stage: bool = False
    """In ``tjpipe controller``, which runs three stages in one process, each stage has its own:
    ``--{stage}-{flag}`` and ``TJPIPE_{STAGE}_{variable}`` (a NATS identity, a signing key)."""
    command_default: Any = _FIELD_DEFAULT
    """What a command gets when neither the flag nor the variable is set, where that differs from the
    field's default (the metrics port: a process the command line starts serves 9090, one a test or a
    benchmark makes in code serves none)."""
    name: str = ""
    type: str = ""
    default: Any = None

    @property
    def names(self) -> str:
        """The flag and the variable, as an error names them: ``--concurrency / TJPIPE_APPLY_CONCURRENCY``."""
        return f"{self.flag} / {self.env}" if self.env else self.flag

    @property
    def starting_value(self) -> Any:
        """The value a command starts from: ``command_default`` if declared, else the field's default."""
        return self.default if self.command_default is _FIELD_DEFAULT else self.command_default

    def for_stage(self, stage: str) -> Setting:
        """This per-stage setting as ``tjpipe controller`` names it for one stage."""
        env = f"TJPIPE_{stage.upper()}_{self.env.removeprefix('TJPIPE_')}" if self.env else None
        own = self.help.replace("this process's", f"the {stage}'s").replace("this stage's", f"the {stage}'s")
        return dataclasses.replace(self, flag=f"--{stage}-{self.flag.removeprefix('--')}", env=env, help=own)


def setting(
    default: Any,
    *,
    flag: str,
    env: str | None,
    help: str,
    unit: str = "",
    check: Check | None = None,
    choices: tuple[str, ...] = (),
    parse: Callable[[str], Any] | None = None,
    deployment: Deployment = "shared",
    per_stage: bool = False,
    command_default: Any = _FIELD_DEFAULT,
) -> Any:
    """A dataclass field declaring one setting (see the module's docstring); ``env=None``: a flag only."""
    declared = Setting(
        flag=flag,
        env=env,
        help=help,
        unit=unit,
        check=check,
        choices=choices,
        parse=parse,
        deployment=deployment if env else "flag",
        per_stage=per_stage,
        command_default=command_default,
    )
    return field(default=default, metadata={SETTING: declared})


def declared(settings_type: type) -> Iterator[Setting]:
    """Every setting a settings dataclass declares, in field order, with its name, type and default."""
    for each in dataclasses.fields(settings_type):
        if SETTING in each.metadata:
            yield dataclasses.replace(each.metadata[SETTING], name=each.name, type=str(each.type), default=each.default)


# ------------------------------------------------------------------------------- what every process shares


@dataclass(kw_only=True)
class LoggingSettings:
    """How a process logs: every long-running process, the history server's included."""

    log_level: str = setting("info", flag="--log-level", env="TJPIPE_LOG_LEVEL", help="debug, info, warning or error")
    log_format: str = setting(
        "auto",
        flag="--log-format",
        env="TJPIPE_LOG_FORMAT",
        choices=("json", "text", "auto"),
        help="auto: JSON unless stderr is a terminal",
    )

    @property
    def json_logs(self) -> bool | None:
        """JSON lines (True), plain text (False), or JSON unless stderr is a terminal (None)."""
        return {"json": True, "text": False}.get(self.log_format)


@dataclass(kw_only=True)
class ProcessSettings(LoggingSettings):
    """What every long-running ``tjpipe`` service is started with: the common part of each one's settings.

    The CLI builds it once from flags and the environment (``tjpipe.settings``) and passes it down; nothing
    below the CLI reads the environment. Each process's own settings extend it.
    """

    metrics_port: int = setting(
        0,
        flag="--metrics-port",
        env="TJPIPE_METRICS_PORT",
        help="serve /metrics, /healthz and /readyz here; 0 turns it off",
        command_default=9090,
    )
    event_loop: str = setting(
        "asyncio",
        flag="--event-loop",
        env="TJPIPE_EVENT_LOOP",
        choices=("asyncio", "uvloop"),
        help="uvloop needs the uvloop package (pip install 'trainjob-pipeline[uvloop]')",
        deployment="optional",
    )
    replica: str = setting(
        "",
        flag="--replica-id",
        env="TJPIPE_REPLICA_ID",
        help="name of this replica in partition leases; default host-pid",
        deployment="per-replica",
    )
    """Empty: ``plumbing.partitions.default_replica_id``, the host and the process."""


@dataclass(kw_only=True)
class NatsSettings:
    """Where NATS is and who this process is on it: every command that reaches the bus."""

    nats_url: str = setting(
        "nats://127.0.0.1:4222", flag="--nats-url", env="NATS_URL", help="NATS servers, comma-separated"
    )
    nats_creds: str | None = setting(
        None,
        flag="--nats-creds",
        env="NATS_CREDS",
        help="this process's NATS identity: an nkey seed file or a JWT .creds file",
        deployment="identity",
        per_stage=True,
    )
    nats_tls_ca: str | None = setting(
        None, flag="--nats-tls-ca", env="NATS_TLS_CA", help="CA file that signed the NATS server"
    )
    nats_tls_cert: str | None = setting(
        None,
        flag="--nats-tls-cert",
        env="NATS_TLS_CERT",
        help="client certificate, if the server asks for one",
        deployment="optional",
    )
    nats_tls_key: str | None = setting(
        None, flag="--nats-tls-key", env="NATS_TLS_KEY", help="its private key", deployment="optional"
    )


@dataclass(kw_only=True)
class ConnectSettings:
    """How long a command that reaches the bus waits for an answer before it gives up (exit code 4)."""

    connect_timeout: float = setting(
        5.0,
        flag="--connect-timeout",
        env="TJPIPE_CONNECT_TIMEOUT",
        unit="seconds",
        parse=positive_seconds,
        deployment="optional",
        help="give up after this many seconds without an answer from NATS (exit code 4)",
    )


@dataclass(kw_only=True)
class ServiceSettings(ProcessSettings, NatsSettings):
    """The common part of the pipeline services' settings: the process's, and its NATS connection."""


@dataclass(kw_only=True)
class KubeSettings:
    """Which cluster a process speaks to, and as whom."""

    kubeconfig: str | None = setting(
        None, flag="--kubeconfig", env="KUBECONFIG", help="unset: ~/.kube/config, else in-cluster credentials"
    )
    kube_context: str | None = setting(
        None, flag="--context", env=None, help="the kubeconfig context to use (default: its current context)"
    )


@dataclass(kw_only=True)
class PartitionedSettings(ServiceSettings):
    """A service that consumes its work stream in partitions, leased among its replicas."""

    batch: int = 32
    lease_ttl: float = 6.0
    work_sweep_seconds: float = setting(
        SWEEP_SECONDS,
        flag="--work-sweep-seconds",
        env="TJPIPE_WORK_SWEEP_SECONDS",
        unit="seconds",
        check=ABOVE_ZERO,
        help="how often to look in the work stream for finished work the server kept (plumbing.work_trim)",
    )


@dataclass(kw_only=True)
class NamespaceSettings:
    """The namespaces whose TrainJobs a service follows: the watcher's, and the applier's TrainJob watch."""

    namespaces: tuple[str, ...] = setting(
        (),
        flag="--namespace",
        env="TJPIPE_NAMESPACES",
        help="namespace whose TrainJobs to watch (repeatable; replaces the comma-separated variable); default: all",
    )
    """Empty: all."""


STATUS_INTERVAL_SECONDS = 5.0
"""The default of ``--status-interval``: the Kubeflow SDK's own rate of progress reports per process."""


@dataclass(kw_only=True)
class StatusIntervalSettings:
    """How often a running TrainJob's Jobs' counts are written: the applier holds a status that changes only
    them (``applier.pacing``), and the watcher a JobSet change that does (``watcher.pacing``)."""

    status_interval_seconds: float = setting(
        STATUS_INTERVAL_SECONDS,
        flag="--status-interval",
        env="TJPIPE_STATUS_INTERVAL_SECONDS",
        unit="seconds",
        check=AT_LEAST_ZERO,
        help="at most one write of a running TrainJob's Jobs' counts per this many seconds; conditions are"
        " written at once (0: every status at once)",
    )


@dataclass(kw_only=True)
class SigningSettings:
    """A stage that signs what it publishes (the watcher its events, the planner its apply messages)."""

    signing_key: str | None = setting(
        None,
        flag="--signing-key",
        env="TJPIPE_SIGNING_KEY",
        deployment="per-service",
        per_stage=True,
        help="this stage's ed25519 private key, PEM; required",
    )
    """The stage's ed25519 private key (PEM); every message it publishes is signed with it."""
    signing_key_setting: str = "--signing-key / TJPIPE_SIGNING_KEY"
    """The flag and variable that set ``signing_key``, named when it cannot be used."""
