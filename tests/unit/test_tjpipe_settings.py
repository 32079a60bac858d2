"""The edge (``tjpipe.settings``): flags and the environment read once, the flag winning, settings passed down."""

from __future__ import annotations

import argparse
import ast
import datetime
from collections.abc import Mapping
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization

from applier.service import ApplierSettings
from planner.service import PlannerSettings
from status_server.settings import StatusServerSettings
from tjpipe import cli, settings
from tjpipe.keys.pki import private_key_pem, self_signed_ca
from watcher.service import WatcherSettings

REPO = Path(__file__).resolve().parents[2]


def parse(argv: list[str], environ: Mapping[str, str] | None = None) -> argparse.Namespace:
    return settings.resolve(cli.build_parser().parse_args(argv), environ or {})


def test_a_flag_wins_over_its_variable_which_wins_over_the_default() -> None:
    assert parse(["applier"]).concurrency == 16
    assert parse(["applier"], {"TJPIPE_APPLY_CONCURRENCY": "7"}).concurrency == 7
    assert parse(["applier", "--concurrency", "3"], {"TJPIPE_APPLY_CONCURRENCY": "7"}).concurrency == 3
    assert parse(["planner"], {"NATS_URL": "nats://a:1"}).nats_url == "nats://a:1"
    assert parse(["planner", "--nats-url", "nats://b:2"], {"NATS_URL": "nats://a:1"}).nats_url == "nats://b:2"


def test_an_empty_variable_counts_as_unset() -> None:
    args = parse(["applier"], {"TJPIPE_APPLY_CONCURRENCY": "", "KUBECONFIG": " "})
    assert args.concurrency == 16
    assert args.kubeconfig is None


def test_namespace_flags_replace_the_variable_instead_of_adding_to_it() -> None:
    environ = {"TJPIPE_NAMESPACES": "team-a, team-b,"}
    assert parse(["watcher"], environ).namespace == ["team-a", "team-b"]
    assert parse(["watcher", "--namespace", "c", "--namespace", "d"], environ).namespace == ["c", "d"]
    assert parse(["watcher"]).namespace == []


def test_a_malformed_variable_is_one_usage_error_naming_it() -> None:
    with pytest.raises(settings.SettingsError, match="TJPIPE_METRICS_PORT: not a valid int: 'abc'"):
        parse(["planner"], {"TJPIPE_METRICS_PORT": "abc"})
    with pytest.raises(settings.SettingsError, match="TJPIPE_LOG_FORMAT: 'xml' is not one of json, text, auto"):
        parse(["planner"], {"TJPIPE_LOG_FORMAT": "xml"})
    with pytest.raises(settings.SettingsError, match="TJPIPE_STREAM_REPLICAS"):
        parse(["bus-setup"], {"TJPIPE_STREAM_REPLICAS": "three"})
    # The flag given, the variable is not read at all.
    assert parse(["planner", "--metrics-port", "0"], {"TJPIPE_METRICS_PORT": "abc"}).metrics_port == 0


def test_the_parser_reads_no_environment_and_every_variable_is_named_in_its_flags_help(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TJPIPE_METRICS_PORT", "not a number")  # --help must still work
    parser = cli.build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for command, sub in subparsers.choices.items():
        for action in sub._actions:
            if isinstance(action.default, settings.FromEnvironment):
                assert "(env: " in (action.help or ""), (command, action.dest)


def test_bus_setup_takes_stream_retention_and_replicas_from_the_environment() -> None:
    specs, replicas = parse(["bus-setup"], {"TJPIPE_STREAM_REPLICAS": "3", "TJPIPE_EVENTS_MAX_AGE": "2h"}).bus
    events = next(s for s in specs if s.name == "TJ_EVENTS")
    assert (replicas, events.replicas, events.max_age_seconds) == (3, 3, 7200.0)


def test_each_service_gets_its_settings_with_the_common_part_built_once() -> None:
    common = ["--nats-url", "nats://n:4222", "--metrics-port", "0", "--log-format", "json", "--replica-id", "r-1"]
    environ = {"NATS_CREDS": "/creds/x.nk", "NATS_TLS_CA": "/tls/ca.crt", "TJPIPE_NAMESPACES": "a,a,b"}
    watcher = settings.watcher(parse(["watcher", *common], environ))
    planner = settings.planner(parse(["planner", *common], environ))
    applier = settings.applier(parse(["applier", *common, "--stale-claim-grace", "9"], environ))
    assert isinstance(watcher, WatcherSettings) and watcher.namespaces == ("a", "b")
    assert isinstance(planner, PlannerSettings) and planner.replica == "r-1"
    assert isinstance(applier, ApplierSettings) and applier.stale_claim_grace_seconds == 9.0
    assert applier.namespaces == ("a", "b")  # its TrainJob watch is of the namespaces the watcher's is
    for made in (watcher, planner, applier):
        assert (made.nats_url, made.nats_creds, made.nats_tls_ca, made.nats_tls_cert) == (
            "nats://n:4222",
            "/creds/x.nk",
            "/tls/ca.crt",
            None,
        )
        assert (made.metrics_port, made.json_logs, made.log_level) == (0, True, "info")


def test_the_controller_gives_each_stage_its_own_identity_and_key_and_the_process_the_health_port() -> None:
    environ = {
        "NATS_URL": "nats://n:4222",
        "NATS_CREDS": "/creds/ignored.nk",  # the controller has no single identity
        "TJPIPE_METRICS_PORT": "9191",
        **{f"TJPIPE_{s.upper()}_NATS_CREDS": f"/creds/{s}.nk" for s in settings.STAGES},
        **{f"TJPIPE_{s.upper()}_SIGNING_KEY": f"/keys/{s}.pem" for s in settings.SIGNING_STAGES},
        "TJPIPE_TRUSTED_EVENT_KEYS": "/keys/events",
        "TJPIPE_TRUSTED_PLAN_KEYS": "/keys/plans",
    }
    args = parse(["controller", "--namespace", "team-a", "--concurrency", "4"], environ)
    assert settings.process(args).metrics_port == 9191
    watcher = settings.watcher(settings.stage(args, "watcher"))
    planner = settings.planner(settings.stage(args, "planner"))
    applier = settings.applier(settings.stage(args, "applier"))
    assert (watcher.nats_creds, planner.nats_creds, applier.nats_creds) == (
        "/creds/watcher.nk",
        "/creds/planner.nk",
        "/creds/applier.nk",
    )
    assert (watcher.signing_key, planner.signing_key) == ("/keys/watcher.pem", "/keys/planner.pem")
    assert planner.signing_key_setting == "--planner-signing-key / TJPIPE_PLANNER_SIGNING_KEY"
    assert (planner.trusted_event_keys, applier.trusted_plan_keys) == ("/keys/events", "/keys/plans")
    assert (watcher.namespaces, applier.namespaces, applier.concurrency) == (("team-a",), ("team-a",), 4)
    assert {made.metrics_port for made in (watcher, planner, applier)} == {0}  # the process serves health
    assert {made.nats_url for made in (watcher, planner, applier)} == {"nats://n:4222"}
    # A single service keeps its own names.
    alone = settings.planner(parse(["planner"], {"TJPIPE_SIGNING_KEY": "/keys/p.pem"}))
    assert (alone.signing_key, alone.signing_key_setting) == ("/keys/p.pem", "--signing-key / TJPIPE_SIGNING_KEY")


def test_the_controller_refuses_one_nats_identity_for_two_stages(tmp_path: Path) -> None:
    same = str(tmp_path / "admin.nk")
    environ = {"TJPIPE_WATCHER_NATS_CREDS": same, "TJPIPE_APPLIER_NATS_CREDS": str(tmp_path / "." / "admin.nk")}
    with pytest.raises(settings.SettingsError, match="--watcher-nats-creds and --applier-nats-creds name the same"):
        settings.require_own_identities(parse(["controller"], environ), settings.STAGES)
    # Unset (a server without authorization) is not a shared identity.
    settings.require_own_identities(parse(["controller"], {}), settings.STAGES)


def test_the_webhook_refuses_to_start_without_its_serving_certificate(tmp_path: Path) -> None:
    args = parse(["webhook", "--tls-cert", str(tmp_path / "tls.crt"), "--tls-key", str(tmp_path / "tls.key")])
    with pytest.raises(settings.SettingsError, match="no such file"):
        settings.webhook(args)
    (tmp_path / "tls.crt").write_text("x")
    (tmp_path / "tls.key").write_text("x")
    made = settings.webhook(args)
    assert (made.port, made.host, made.metrics_port) == (9443, "0.0.0.0", 9090)


def _reads_environment(tree: ast.AST) -> list[int]:
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv", "environb"):
            lines.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.module == "os":
            lines += [node.lineno for alias in node.names if alias.name in ("environ", "getenv")]
    return lines


# In a pod, Kubernetes gives the API server's address only in the environment (KUBERNETES_SERVICE_HOST and
# _PORT): plumbing.kube reads them, as the kubernetes client's in-cluster loader does, the one place below
# the CLI that looks at the environment.
_ALLOWED = {"plumbing/kube.py"}


def test_nothing_below_the_cli_reads_the_environment() -> None:
    found = {}
    for package in ("contracts", "plumbing", "watcher", "planner", "applier", "history_server", "status_server"):
        for path in sorted((REPO / package).rglob("*.py")):
            where = str(path.relative_to(REPO))
            lines = _reads_environment(ast.parse(path.read_text(), filename=where))
            if lines and where not in _ALLOWED:
                found[where] = lines
    assert found == {}


def _ca() -> tuple[str, str]:
    """A CA certificate and its private key, both PEM, made here for the run (nothing of them is tracked)."""
    now = datetime.datetime.now(datetime.UTC)
    key, cert = self_signed_ca("settings-test", not_before=now, not_after=now + datetime.timedelta(hours=1))
    return cert.public_bytes(serialization.Encoding.PEM).decode(), private_key_pem(key).decode()


CA_PEM, CA_KEY_PEM = _ca()
ON_WITH_URL = {"TJPIPE_TRAINJOB_STATUS": "true", "TJPIPE_STATUS_SERVER_URL": "https://x"}


def test_trainjob_status_is_off_unless_asked_for_as_in_trainer() -> None:
    planner = settings.planner(parse(["planner"]))
    assert (planner.trainjob_status, planner.status_server_url, planner.status_server_ca) == (False, "", "")


def test_trainjob_status_on_reads_the_url_and_the_ca_file_once(tmp_path: Path) -> None:
    ca = tmp_path / "ca.crt"
    ca.write_text(CA_PEM)
    environ = {
        "TJPIPE_TRAINJOB_STATUS": "true",
        "TJPIPE_STATUS_SERVER_URL": "https://status.example:10443/",
        "TJPIPE_STATUS_SERVER_CA": str(ca),
    }
    for argv in (["planner"], ["controller"]):
        args = parse(argv, environ)
        planner = settings.planner(settings.stage(args, "planner") if argv == ["controller"] else args)
        assert planner.trainjob_status is True
        assert planner.status_server_url == "https://status.example:10443"
        assert planner.status_server_ca == CA_PEM
    assert settings.planner(parse(["planner", "--no-trainjob-status"], environ)).trainjob_status is False


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"TJPIPE_TRAINJOB_STATUS": "maybe"}, "TJPIPE_TRAINJOB_STATUS: not true or false"),
        ({"TJPIPE_TRAINJOB_STATUS": "1"}, "--status-server-url / TJPIPE_STATUS_SERVER_URL: required"),
        ({"TJPIPE_TRAINJOB_STATUS": "on", "TJPIPE_STATUS_SERVER_URL": "http://x:1"}, "must be https://HOST[:PORT]"),
        ({"TJPIPE_TRAINJOB_STATUS": "yes", "TJPIPE_STATUS_SERVER_URL": "https://x/apis"}, "give only https://HOST"),
        ({"TJPIPE_TRAINJOB_STATUS": "true", "TJPIPE_STATUS_SERVER_URL": "https://x:1"}, "SERVER_CA: required"),
        (
            {
                "TJPIPE_TRAINJOB_STATUS": "true",
                "TJPIPE_STATUS_SERVER_URL": "https://x",
                "TJPIPE_STATUS_SERVER_CA": "/no",
            },
            "cannot read /no",
        ),
    ],
)
def test_trainjob_status_settings_that_cannot_work_are_one_clear_error(environ: dict[str, str], message: str) -> None:
    with pytest.raises(settings.SettingsError, match=message.replace("[", r"\[").replace("]", r"\]")):
        settings.planner(parse(["planner"], environ))


@pytest.mark.parametrize(("content", "message"), [("not a pem", "holds no PEM"), (CA_PEM + CA_KEY_PEM, "private key")])
def test_the_ca_file_must_be_a_certificate_and_never_a_key(tmp_path: Path, content: str, message: str) -> None:
    ca = tmp_path / "ca.crt"
    ca.write_text(content)
    environ = {
        "TJPIPE_TRAINJOB_STATUS": "true",
        "TJPIPE_STATUS_SERVER_URL": "https://x",
        "TJPIPE_STATUS_SERVER_CA": str(ca),
    }
    with pytest.raises(settings.SettingsError, match=message):
        settings.planner(parse(["planner"], environ))


def test_the_applier_paces_running_statuses_at_five_seconds_unless_told() -> None:
    assert settings.applier(parse(["applier"])).status_interval_seconds == 5.0
    assert settings.applier(parse(["applier"], {"TJPIPE_STATUS_INTERVAL_SECONDS": "0"})).status_interval_seconds == 0
    with pytest.raises(settings.SettingsError, match="--status-interval / TJPIPE_STATUS_INTERVAL_SECONDS"):
        settings.applier(parse(["applier", "--status-interval", "-1"]))


def test_a_setting_declared_on_its_service_is_a_flag_a_variable_and_a_checked_field() -> None:
    """``--apply-attempts``: one declaration on ``ApplierSettings``, nothing else written for it."""
    assert settings.applier(parse(["applier"])).attempts == 5
    assert settings.applier(parse(["applier"], {"TJPIPE_APPLY_ATTEMPTS": "2"})).attempts == 2
    assert settings.applier(parse(["applier", "--apply-attempts", "3"], {"TJPIPE_APPLY_ATTEMPTS": "2"})).attempts == 3
    controller = parse(["controller", "--apply-attempts", "4"])
    assert settings.applier(settings.stage(controller, "applier")).attempts == 4
    with pytest.raises(
        settings.SettingsError, match="--apply-attempts / TJPIPE_APPLY_ATTEMPTS: must be 1 or more, got 0"
    ):
        settings.applier(parse(["applier", "--apply-attempts", "0"]))


def test_every_declared_setting_of_a_service_is_on_its_command() -> None:
    from plumbing.configuration import declared

    parser = cli.build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for command, types in cli.SERVICE_SETTINGS.items():
        flags = {flag for action in subparsers.choices[command]._actions for flag in action.option_strings}
        for each in (s for t in types for s in declared(t)):
            if command == "controller" and each.per_stage:
                assert any(each.for_stage(stage).flag in flags for stage in settings.STAGES), each.flag
            else:
                assert each.flag in flags, (command, each.flag)


def _serving_pair(tmp_path: Path) -> list[str]:
    for name in ("tls.crt", "tls.key"):
        (tmp_path / name).write_text("x")
    return ["--tls-cert", str(tmp_path / "tls.crt"), "--tls-key", str(tmp_path / "tls.key")]


def test_the_status_servers_settings_are_its_declarations_flags_and_variables(tmp_path: Path) -> None:
    from status_server.core import Rate

    args = parse(["status-server", *_serving_pair(tmp_path), "--pod-rate", "2/5"], {"NATS_URL": "nats://n:1"})
    made = settings.status_server(args)
    assert (made.nats_url, made.port, made.coalesce_seconds, made.max_token_reviews) == ("nats://n:1", 10443, 5.0, 8)
    assert (made.pod_rate, made.trainjob_rate) == (Rate(per_second=2.0, burst=5.0), Rate(per_second=20.0, burst=200))
    assert str(made.trainjob_rate) == "20/200"  # as the settings reference shows the default
    environ = {"TJPIPE_STATUS_TRAINJOB_RATE": "3/4", "TJPIPE_STATUS_MAX_CLOCK_SKEW": "0", "KUBECONFIG": "/k"}
    made = settings.status_server(parse(["status-server", *_serving_pair(tmp_path), "--context", "c"], environ))
    assert (made.trainjob_rate, made.max_clock_skew, made.kubeconfig, made.kube_context) == (
        Rate(per_second=3.0, burst=4.0),
        0.0,
        "/k",
        "c",
    )


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"TJPIPE_STATUS_POD_RATE": "0/10"}, "TJPIPE_STATUS_POD_RATE: not a valid PER_SECOND/BURST rate"),
        ({"TJPIPE_STATUS_TRAINJOB_RATE": "5"}, "TJPIPE_STATUS_TRAINJOB_RATE: not a valid PER_SECOND/BURST rate"),
        ({"TJPIPE_STATUS_POD_RATE": "1/0.5"}, "a burst of 1 or more"),
        (
            {"TJPIPE_STATUS_COALESCE_SECONDS": "0"},
            "--coalesce-seconds / TJPIPE_STATUS_COALESCE_SECONDS: must be above 0",
        ),
        ({"TJPIPE_STATUS_MAX_TOKEN_REVIEWS": "0"}, "TJPIPE_STATUS_MAX_TOKEN_REVIEWS: must be 1 or more"),
        ({"TJPIPE_STATUS_MAX_CLOCK_SKEW": "-1"}, "TJPIPE_STATUS_MAX_CLOCK_SKEW: must be 0 or more"),
    ],
)
def test_a_status_server_setting_that_cannot_work_is_one_error_naming_it(
    tmp_path: Path, environ: dict[str, str], message: str
) -> None:
    with pytest.raises(settings.SettingsError, match=message):
        settings.status_server(parse(["status-server", *_serving_pair(tmp_path)], environ))


def test_a_setting_declared_on_the_status_server_is_a_flag_a_variable_and_a_checked_field(tmp_path: Path) -> None:
    """``--sweep-seconds``: one declaration on ``StatusServerSettings``; its deployments set it because
    tests/deploy fails while they do not."""
    pair = _serving_pair(tmp_path)
    assert settings.status_server(parse(["status-server", *pair])).sweep_seconds == 30.0
    environ = {"TJPIPE_STATUS_SWEEP_SECONDS": "12"}
    assert settings.status_server(parse(["status-server", *pair], environ)).sweep_seconds == 12.0
    assert settings.status_server(parse(["status-server", *pair, "--sweep-seconds", "7"], environ)).sweep_seconds == 7
    with pytest.raises(settings.SettingsError, match="--sweep-seconds / TJPIPE_STATUS_SWEEP_SECONDS: must be above 0"):
        settings.status_server(parse(["status-server", *pair, "--sweep-seconds", "0"]))


def test_the_history_servers_settings_are_its_declarations_flags_and_variables() -> None:
    environ = {
        "NATS_CREDS": "/creds/reader.nk",
        "TJPIPE_HISTORY_LISTEN": "0.0.0.0:8443",
        "TJPIPE_HISTORY_SCRAPE": "http://a/metrics, http://b/metrics",
        "TJPIPE_CONNECT_TIMEOUT": "3",
        "TJPIPE_LOG_FORMAT": "json",
    }
    made = settings.history_server(parse(["history-server", "--refresh-seconds", "0.5", "--context", "c"], environ))
    assert (made.nats_creds, made.listen, made.connect_timeout, made.json_logs) == (
        "/creds/reader.nk",
        "0.0.0.0:8443",
        3.0,
        True,
    )
    assert (made.refresh_seconds, made.auth_cache_seconds, made.stalled_after, made.kube_context) == (
        0.5,
        10.0,
        600.0,
        "c",
    )
    assert made.scrape == ("http://a/metrics", "http://b/metrics")
    assert settings.history_server(parse(["history-server", "--scrape", "http://c"], environ)).scrape == ("http://c",)
    assert settings.history_server(parse(["history-server"])).listen == "127.0.0.1:8080"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--listen", "8080"], "--listen / TJPIPE_HISTORY_LISTEN: must be HOST:PORT"),
        (["--refresh-seconds", "0"], "--refresh-seconds / TJPIPE_HISTORY_REFRESH_SECONDS: must be above 0"),
        (["--stalled-after", "-1"], "TJPIPE_HISTORY_STALLED_AFTER_SECONDS: must be 0 or more"),
        (["--tls-cert", "/x.crt"], "--tls-cert and --tls-key go together"),
        (["--retention-policy", "/no/policy.yaml"], "--retention-policy /no/policy.yaml: no such file"),
        (["--retention-policy", "{file}"], "--retention-policy needs --retention-creds"),
        (["--retention-policy", "{file}", "--retention-creds", "{file}", "--fleet-clusters", "f"], "one cluster's"),
    ],
)
def test_a_history_server_setting_that_cannot_work_is_one_error_naming_it(
    tmp_path: Path, argv: list[str], message: str
) -> None:
    (tmp_path / "file").write_text("x")
    argv = [arg.replace("{file}", str(tmp_path / "file")) for arg in argv]
    with pytest.raises(settings.SettingsError, match=message):
        settings.history_server(parse(["history-server", *argv]))


def test_every_declared_setting_of_a_server_is_on_its_command() -> None:
    from history_server.settings import HistoryServerSettings
    from plumbing.configuration import declared

    parser = cli.build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for command, declares in (("history-server", HistoryServerSettings), ("status-server", StatusServerSettings)):
        flags = {flag for action in subparsers.choices[command]._actions for flag in action.option_strings}
        assert {each.flag for each in declared(declares)} <= flags, command
