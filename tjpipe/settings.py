"""The edge: what a ``tjpipe`` process runs with, read once from its flags and the environment.

Each setting is declared once, as a field of its service's settings dataclass (``plumbing.configuration``
says how, and why so); this module turns the declarations into argparse arguments (``add_settings``) and the
parsed arguments back into the settings objects (``settings_of``), checking each value as its declaration
says. What spans several settings (a client certificate without its key, the TrainJobStatus gate and what it
needs, one NATS identity per stage of ``tjpipe controller``) is checked here too, in one place.

Every setting is a flag with an environment variable behind it, so the same names work on a command line,
in docker-compose and in a Deployment; a flag given wins over its variable, and each flag's help names
its variable (``env: NAME``). ``build_parser`` reads no environment: an argument left to its variable
holds a ``FromEnvironment`` until ``resolve`` reads the one environment ``cli.main`` passes in, after
parsing. So ``--help`` works whatever the environment holds, a bad value is one error naming the variable,
and nothing below the CLI reads the environment (``plumbing.kube``'s in-cluster detection excepted: the
kubernetes client's in-cluster loader reads the service host from the environment itself).

The settings objects stay one type per process (``WatcherSettings``, ``PlannerSettings``,
``ApplierSettings``, ``WebhookSettings``, ``StatusServerSettings``, ``HistoryServerSettings``) instead of one
object for all: each service and its tests build only what that service uses, and a setting one service has
cannot be misread by another. What they share (``ProcessSettings``, ``NatsSettings``, ``KubeSettings``, ...)
is declared once in ``plumbing.configuration``.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from applier.settings import ApplierSettings
from history_server.settings import HistoryServerSettings
from planner.settings import TRAINJOB_STATUS, PlannerSettings, WebhookSettings
from plumbing.configuration import ProcessSettings, Setting, declared
from status_server.settings import StatusServerSettings
from tjpipe.exits import UsageError
from watcher.settings import WatcherSettings

if TYPE_CHECKING:
    from planner.plugins.trainjobstatus import StatusServer
    from plumbing.bus import TlsFiles

S = TypeVar("S")

STAGES = ("watcher", "planner", "applier")
"""The pipeline's three services, in the order a TrainJob passes them."""
SIGNING_STAGES = ("watcher", "planner")
"""The stages that sign what they publish: the watcher its events, the planner its apply messages."""
STAGE_SETTINGS: dict[str, type] = {"watcher": WatcherSettings, "planner": PlannerSettings, "applier": ApplierSettings}


class SettingsError(UsageError, ValueError):
    """A setting that cannot be used: a malformed environment value, a file that is not there (exit 2)."""


@dataclass(frozen=True)
class FromEnvironment:
    """An argument's value while its flag is not given: ``read`` makes it from the environment."""

    read: Callable[[Mapping[str, str]], object]
    setting: Setting | None = None
    """The declaration the argument was made from (the reference page and the deployment checks read it)."""


class _AppendOverEnvironment(argparse.Action):
    """``action="append"`` whose first use replaces the environment's list instead of adding to it."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        current = getattr(namespace, self.dest, None)
        items = [] if isinstance(current, FromEnvironment) or current is None else list(current)
        items.append(values)
        setattr(namespace, self.dest, items)


def boolean(text: str) -> bool:
    """``true``/``false`` (also ``1``/``0``, ``yes``/``no``, ``on``/``off``), as a variable says a switch."""
    value = text.strip().lower()
    if value in ("true", "1", "yes", "on"):
        return True
    if value in ("false", "0", "no", "off"):
        return False
    raise ValueError(text)


_PARSERS: dict[str, Callable[[str], Any]] = {"int": int, "float": float, "str": str, "str | None": str}


def _kind(setting: Setting) -> str:
    """``switch`` (on/off), ``list`` (repeatable) or ``value``, from the declared field's type."""
    if setting.type == "bool":
        return "switch"
    if setting.type == "tuple[str, ...]":
        return "list"
    if setting.parse is None and setting.type not in _PARSERS:
        raise TypeError(f"{setting.flag}: a {setting.type} setting needs parse= in its declaration")
    return "value"


def add_setting(parser: argparse.ArgumentParser | argparse._ArgumentGroup, setting: Setting) -> argparse.Action:
    """One declared setting as an argument: the flag wins, then the variable, then the declared default."""
    kind = _kind(setting)
    env = setting.env
    start = setting.starting_value
    help = f"{setting.help} (env: {env})" if env else setting.help
    if kind == "list":
        start = list(start)
    if env is None:
        if kind == "switch":
            return parser.add_argument(setting.flag, action=argparse.BooleanOptionalAction, default=start, help=help)
        parse = setting.parse or _PARSERS[setting.type]
        return parser.add_argument(
            setting.flag, type=parse, default=start, help=help, metavar=setting.unit.upper() or None
        )

    def read(environ: Mapping[str, str]) -> object:
        text = environ.get(env, "").strip()
        if kind == "list":
            return [v.strip() for v in text.split(",") if v.strip()]
        if not text:
            return start
        if kind == "switch":
            try:
                return boolean(text)
            except ValueError:
                raise SettingsError(f"{env}: not true or false: {text!r}") from None
        parse = setting.parse or _PARSERS[setting.type]
        try:
            value = parse(text)
        except ValueError:
            raise SettingsError(f"{env}: not a valid {getattr(parse, '__name__', 'value')}: {text!r}") from None
        if setting.choices and value not in setting.choices:
            raise SettingsError(f"{env}: {text!r} is not one of {', '.join(setting.choices)}")
        return value

    default = FromEnvironment(read, setting)
    if kind == "switch":
        return parser.add_argument(setting.flag, action=argparse.BooleanOptionalAction, default=default, help=help)
    if kind == "list":
        return parser.add_argument(setting.flag, action=_AppendOverEnvironment, default=default, help=help)
    return parser.add_argument(
        setting.flag,
        default=default,
        type=setting.parse or _PARSERS[setting.type],
        choices=setting.choices or None,
        metavar=setting.unit.upper() or None,
        help=help,
    )


def add_settings(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    *types: type,
    only: Iterable[str] = (),
    skip: Iterable[str] = (),
    stages: Mapping[str, type] | None = None,
) -> None:
    """The arguments of every setting ``types`` declare (once each, where two declare the same flag).

    ``only``/``skip`` name fields; with ``stages`` (``tjpipe controller``), a per-stage setting becomes one
    argument for each stage whose settings declare it, instead of one for the process.
    """
    wanted, unwanted = set(only), set(skip)
    seen: set[str] = set()
    per_stage: list[Setting] = []
    for each in (s for t in types for s in declared(t)):
        if each.flag in seen or (wanted and each.name not in wanted) or each.name in unwanted:
            continue
        seen.add(each.flag)
        if stages is not None and each.per_stage:
            per_stage.append(each)
            continue
        add_setting(parser, each)
    for each in per_stage:
        for stage, stage_type in stages.items() if stages is not None else ():
            if any(s.flag == each.flag for s in declared(stage_type)):
                add_setting(parser, each.for_stage(stage))


def resolve(args: argparse.Namespace, environ: Mapping[str, str]) -> argparse.Namespace:
    """Give every argument whose flag was not given its value from ``environ``; raises ``SettingsError``."""
    for name, value in list(vars(args).items()):
        if isinstance(value, FromEnvironment):
            setattr(args, name, value.read(environ))
    return args


def dest(setting: Setting) -> str:
    """The name argparse gives a setting's argument: its flag's (``--replica-id``: ``replica_id``)."""
    return setting.flag.removeprefix("--").replace("-", "_")


def settings_of(settings_type: type[S], args: argparse.Namespace, **more: Any) -> S:
    """The settings object of ``settings_type`` from parsed, resolved arguments: each declared setting's value,
    checked as declared; one left empty keeps the field's default. ``more`` sets fields no flag sets."""
    values: dict[str, Any] = {}
    for each in declared(settings_type):
        value = getattr(args, dest(each), None)
        if value is None or value == "":
            continue
        if _kind(each) == "list":
            value = tuple(dict.fromkeys(value))
        if each.check is not None and not each.check.test(value):
            raise SettingsError(f"{each.names}: must be {each.check.words}, got {value}")
        values[each.name] = value
    return settings_type(**values, **more)


# ---------------------------------------------------------------------------------------- TrainJobStatus

TRAINJOB_STATUS_SETTING = "--trainjob-status / TJPIPE_TRAINJOB_STATUS"
STATUS_SERVER_URL_SETTING = "--status-server-url / TJPIPE_STATUS_SERVER_URL"
STATUS_SERVER_CA_SETTING = "--status-server-ca / TJPIPE_STATUS_SERVER_CA"


def add_trainjob_status_flags(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """Trainer's alpha feature gate ``TrainJobStatus`` and what its plugin tells the pods about the server.

    Off by default, as in Trainer. On, every trainer container is told where the status server is
    (``--status-server-url``) and which CA signs its certificate (``--status-server-ca``, copied into the
    ``<trainjob>-tls-config`` ConfigMap).
    """
    add_settings(parser, PlannerSettings, only=TRAINJOB_STATUS)


def status_server_url(text: str) -> str:
    """The URL as the plugin needs it: ``https://host[:port]``, no path, no trailing slash."""
    from urllib.parse import urlsplit

    url = text.strip().rstrip("/")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (raises ValueError for a port that is not a number in range)
    except ValueError as exc:
        raise SettingsError(f"{STATUS_SERVER_URL_SETTING}: not a URL: {text!r} ({exc})") from None
    if parts.scheme != "https" or not parts.hostname:
        raise SettingsError(f"{STATUS_SERVER_URL_SETTING}: must be https://HOST[:PORT], got {text!r}")
    if parts.path or parts.query or parts.fragment or parts.username or parts.password:
        raise SettingsError(
            f"{STATUS_SERVER_URL_SETTING}: give only https://HOST[:PORT]; the status path is Trainer's "
            f"and is added per TrainJob (got {text!r})"
        )
    return url


def read_status_server_ca(path: str) -> str:
    """The CA bundle's PEM text, read once by the shell so the planner's core gets it as data."""
    if not path:
        raise SettingsError(f"{STATUS_SERVER_CA_SETTING}: required with {TRAINJOB_STATUS_SETTING}")
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise SettingsError(f"{STATUS_SERVER_CA_SETTING}: cannot read {path}: {exc}") from None
    if "-----BEGIN CERTIFICATE-----" not in text:
        raise SettingsError(f"{STATUS_SERVER_CA_SETTING}: {path} holds no PEM certificate")
    if "PRIVATE KEY" in text:
        # The bundle is copied into a ConfigMap in every TrainJob's namespace: a key must never go there.
        raise SettingsError(f"{STATUS_SERVER_CA_SETTING}: {path} holds a private key; give the CA certificate only")
    return text


def trainjob_status(args: argparse.Namespace) -> dict[str, Any]:
    """``PlannerSettings``' TrainJobStatus fields: off, or on with the server's URL and CA (PEM text)."""
    if not getattr(args, "trainjob_status", False):
        return {}
    if not args.status_server_url:
        raise SettingsError(f"{STATUS_SERVER_URL_SETTING}: required with {TRAINJOB_STATUS_SETTING}")
    return {
        "trainjob_status": True,
        "status_server_url": status_server_url(args.status_server_url),
        "status_server_ca_file": args.status_server_ca,
        "status_server_ca": read_status_server_ca(args.status_server_ca),
    }


def status_server_of(args: argparse.Namespace) -> StatusServer | None:
    """The TrainJobStatus plugin's server from the same flags, for commands that plan as the planner does
    (``tjpipe replay``, ``tjpipe plan``); ``None`` with the gate off."""
    from planner.plugins.trainjobstatus import StatusServer

    fields = trainjob_status(args)
    if not fields:
        return None
    return StatusServer(url=fields["status_server_url"], ca_cert=fields["status_server_ca"])


# ------------------------------------------------------------------------------------------- settings objects


class NatsTlsOptions(Protocol):
    """Where the ``--nats-tls-*`` files are: parsed arguments, or a settings object with ``NatsSettings``."""

    nats_tls_ca: str | None
    nats_tls_cert: str | None
    nats_tls_key: str | None


def nats_tls(args: NatsTlsOptions) -> TlsFiles | None:
    """The TLS files the ``--nats-tls-*`` flags name, if any."""
    from plumbing.bus import TlsFiles

    try:
        return TlsFiles.from_options(args.nats_tls_ca, args.nats_tls_cert, args.nats_tls_key)
    except ValueError as exc:
        raise SettingsError(str(exc)) from None


def process(args: argparse.Namespace) -> ProcessSettings:
    """The settings of the process itself, where several services share it (``tjpipe controller``)."""
    return settings_of(ProcessSettings, args)


def stage(args: argparse.Namespace, name: str) -> argparse.Namespace:
    """One stage's arguments within ``tjpipe controller``: its own NATS identity and signing key.

    The health endpoint is the process's, so the stage itself serves none.
    """
    own = argparse.Namespace(**vars(args))
    for each in declared(STAGE_SETTINGS[name]):
        if each.per_stage:
            setattr(own, dest(each), getattr(args, dest(each.for_stage(name)), None))
        if each.name == "signing_key":
            own.signing_key_setting = each.for_stage(name).names
    own.metrics_port = 0
    return own


def require_own_identities(args: argparse.Namespace, stages: tuple[str, ...]) -> None:
    """Refuse one NATS identity file for two stages of ``tjpipe controller``.

    Each stage's permissions on the bus are its identity's; one file for two would give each the other's
    rights, which is what running them as separate identities in one process is meant to keep apart.
    """
    seen: dict[str, str] = {}
    for name in stages:
        creds = getattr(args, f"{name}_nats_creds")
        if not creds:
            continue
        key = str(Path(creds).resolve())
        if key in seen:
            raise SettingsError(
                f"--{seen[key]}-nats-creds and --{name}-nats-creds name the same file ({creds}): "
                "each stage needs its own NATS identity"
            )
        seen[key] = name


def _signing_key_setting(args: argparse.Namespace) -> dict[str, Any]:
    """How a stage of ``tjpipe controller`` names its own key's flag (each service's default otherwise)."""
    setting = getattr(args, "signing_key_setting", None)
    return {"signing_key_setting": setting} if setting else {}


def watcher(args: argparse.Namespace) -> WatcherSettings:
    nats_tls(args)
    return settings_of(WatcherSettings, args, **_signing_key_setting(args))


def planner(args: argparse.Namespace) -> PlannerSettings:
    nats_tls(args)
    made = settings_of(PlannerSettings, args, **_signing_key_setting(args))
    return dataclasses.replace(made, **trainjob_status(args))


def applier(args: argparse.Namespace) -> ApplierSettings:
    nats_tls(args)
    return settings_of(ApplierSettings, args)


def _serving_pair(args: argparse.Namespace, named: str) -> None:
    """A serving certificate and key are checked at start: a missing one is a settings error, not a traceback."""
    for path in (args.tls_cert, args.tls_key):
        if not Path(path).is_file():
            raise SettingsError(f"no such file: {path} ({named})")


def webhook(args: argparse.Namespace) -> WebhookSettings:
    _serving_pair(args, "--tls-cert/--tls-key")
    return settings_of(WebhookSettings, args)


def status_server(args: argparse.Namespace) -> StatusServerSettings:
    _serving_pair(args, "--tls-cert/--tls-key, TJPIPE_STATUS_SERVER_TLS_*")
    nats_tls(args)
    return settings_of(StatusServerSettings, args)


def history_server(args: argparse.Namespace) -> HistoryServerSettings:
    """The history server's settings; a certificate needs its key, and retention its identity and one cluster."""
    made = settings_of(HistoryServerSettings, args)
    if bool(made.tls_cert) != bool(made.tls_key):
        raise SettingsError("--tls-cert and --tls-key go together (TJPIPE_HISTORY_TLS_CERT, TJPIPE_HISTORY_TLS_KEY)")
    for flag, path in (("--retention-policy", made.retention_policy), ("--retention-creds", made.retention_creds)):
        if path and not Path(path).expanduser().is_file():
            raise SettingsError(f"{flag} {path}: no such file")
    if made.retention_policy and (made.fleet_clusters or not made.retention_creds):
        raise SettingsError(
            "--retention-policy needs --retention-creds (the history-keeper identity), on one cluster's server"
        )
    return made
