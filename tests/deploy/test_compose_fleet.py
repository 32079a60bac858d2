"""compose/fleet.yml (the hub, profile ``fleet``) and compose/fleet-member.yml (a lone-cluster stack made a
member): valid Compose, and the files their servers would run are ones nats-server runs.

No container is started here (tests/compose/test_fleet.py starts the whole fleet on a Docker engine). Instead:
the files are loaded by compose-go's own loader (the hub alone, the member file over the lone-cluster stack)
and checked against the Compose Specification's schema, as test_compose.py does for the main file; and the
one-shot ``fleet-init``'s script, taken from the loaded model, is run on this machine with its volumes as
folders, so the very commands it runs (``tjpipe fleet ...``, ``tjpipe nats-tls``) write the files, which
``nats-server -t`` then checks where the containers mount them: a member's nats.conf together with a lone
stack's own TLS and authorization, as the member's server reads them.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from jsonschema import Draft202012Validator

from tjpipe.local.kustomize import ensure_go_tool
from tjpipe.local.natsd import nats_server_binary
from tjpipe.local.toolchain import go_module_dir

from .test_compose import COMPOSE_FILE, COMPOSE_GO_MODULE, COMPOSE_GO_VERSION, COMPOSE_SPEC_VALIDATOR, _errors
from .test_fleet_deploy import _check_config

FLEET_FILE = COMPOSE_FILE.parent / "fleet.yml"
MEMBER_FILE = COMPOSE_FILE.parent / "fleet-member.yml"
HUB = ("fleet-hub-0", "fleet-hub-1", "fleet-hub-2")
MEMBERS = ("c1", "c2")

Model = dict[str, Any]


def _loader(*files: Path, home: Path) -> subprocess.CompletedProcess[str]:
    """compose-go's loader on ``files`` (the project folder is the first one's), in a clean environment: the
    loader's command interpolates from no environment at all, so what is checked is the files' defaults."""
    binary = ensure_go_tool(COMPOSE_SPEC_VALIDATOR, progress=lambda line: print(f"[tjpipe] {line}", flush=True))
    return subprocess.run(
        [str(binary), "--format", "json", *(str(file) for file in files)],
        cwd=FLEET_FILE.parent,
        env={"PATH": os.environ.get("PATH", ""), "HOME": str(home)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _load(*files: Path, home: Path) -> Model:
    completed = _loader(*files, home=home)
    assert completed.returncode == 0, f"compose-go rejects {[f.name for f in files]}:\n{completed.stderr}"
    loaded: Model = json.loads(completed.stdout)
    return loaded


@pytest.fixture(scope="module")
def validator() -> Draft202012Validator:
    schema_path = go_module_dir(COMPOSE_GO_MODULE, COMPOSE_GO_VERSION) / "schema" / "compose-spec.json"
    return Draft202012Validator(json.loads(schema_path.read_text()))


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Model:
    return _load(FLEET_FILE, home=tmp_path_factory.mktemp("compose-home"))


def test_the_hub_file_is_valid_and_the_member_file_changes_only_the_lone_stacks_bus(
    model: Model, validator: Draft202012Validator, tmp_path: Path
) -> None:
    assert _errors(validator, yaml.safe_load(FLEET_FILE.read_text())) == []
    assert _errors(validator, yaml.safe_load(MEMBER_FILE.read_text())) == []
    lone = _load(COMPOSE_FILE, home=tmp_path)
    # The cluster's name as TJPIPE_FLEET_CLUSTER=c1 gives it (the loader reads no environment: see _loader).
    required = re.search(r"\$\{TJPIPE_FLEET_CLUSTER:\?[^}]+\}", MEMBER_FILE.read_text())
    assert required is not None
    as_c1 = tmp_path / MEMBER_FILE.name
    as_c1.write_text(MEMBER_FILE.read_text().replace(required.group(0), "c1"))
    member = _load(COMPOSE_FILE, as_c1, home=tmp_path)
    assert set(member["services"]) == set(lone["services"])
    changed = {name for name in lone["services"] if lone["services"][name] != member["services"][name]}
    assert changed == {"nats"}
    nats = member["services"]["nats"]
    assert nats["command"] == ["-m", "8222", "-c", "/etc/nats/fleet/nats.conf"]
    assert set(nats["networks"]) == {"default", "fleet"}
    fleet_network = member["networks"]["fleet"]
    assert (fleet_network["name"], fleet_network["external"]) == ("tjpipe-fleet", True)
    (mount,) = [m for m in nats["volumes"] if m["target"] == "/etc/nats/fleet"]
    assert mount["type"] == "bind" and mount["read_only"] is True
    assert mount["source"] == str(COMPOSE_FILE.parent / "fleet-state" / "members" / "c1")
    # Without a cluster's name the file refuses to load, rather than mount some other member's folder.
    refused = _loader(COMPOSE_FILE, MEMBER_FILE, home=tmp_path)
    assert refused.returncode != 0 and "TJPIPE_FLEET_CLUSTER" in refused.stderr


def test_everything_is_in_the_fleet_profile_and_only_the_hubs_client_port_is_published_on_loopback(
    model: Model,
) -> None:
    services = model["services"]
    assert set(services) == {"fleet-init", *HUB, "fleet-setup"}
    assert {name: service.get("profiles") for name, service in services.items()} == {
        name: ["fleet"] for name in services
    }
    published = {
        name: [(port["host_ip"], port["target"]) for port in service["ports"]]
        for name, service in services.items()
        if service.get("ports")
    }
    assert published == {"fleet-hub-0": [("127.0.0.1", 4222)]}
    assert services["fleet-init"]["network_mode"] == "none"
    assert model["networks"]["fleet"]["name"] == "tjpipe-fleet"


def _volumes(service: Model) -> dict[str, str]:
    return {mount["source"]: mount["target"] for mount in service.get("volumes", [])}


def test_each_seed_goes_only_where_it_is_used(model: Model) -> None:
    services = model["services"]
    users: dict[str, set[str]] = {}
    for name, service in services.items():
        for volume in _volumes(service):
            users.setdefault(volume, set()).add(name)
    assert users["fleet-secrets"] == {"fleet-init"}
    assert users["fleet-hub-admin"] == {"fleet-init", "fleet-setup"}
    assert users["fleet-hub-conf"] == {"fleet-init", *HUB}
    assert users[str(COMPOSE_FILE.parent / "fleet-state")] == {"fleet-init"}


def test_the_setup_job_sets_up_every_member_at_the_hub_over_tls(model: Model) -> None:
    setup = model["services"]["fleet-setup"]
    args = setup["command"]
    assert args[:2] == ["fleet", "setup"]
    assert [args[i + 1] for i, arg in enumerate(args) if arg == "--member"] == list(MEMBERS)
    assert setup["environment"]["NATS_URL"] == "nats://fleet-hub-0:4222"
    assert setup["environment"]["NATS_TLS_CA"] == "/etc/tjpipe/nats/ca.crt"
    assert set(setup["depends_on"]) == set(HUB)


def _lone_stack_bus(conf_dir: Path, tmp_path: Path) -> None:
    """What a lone stack's init gives its nats-server in ../conf: TLS and the authorization block."""
    from tjpipe.cli import main

    conf_dir.mkdir(parents=True)
    assert main(["nats-tls", "--dir", str(tmp_path / "lone-tls"), "--host", "nats"]) == 0
    authorization = conf_dir / "authorization.conf"
    assert main(["nats-credentials", "--dir", str(tmp_path / "lone-creds"), "--authorization", str(authorization)]) == 0
    tls = tmp_path / "lone-tls"
    (conf_dir / "nats.conf").write_text(
        f'tls {{\n  cert_file: "{tls}/tls.crt"\n  key_file: "{tls}/tls.key"\n}}\ninclude ./authorization.conf\n'
    )


def test_the_init_script_writes_files_nats_server_runs_where_the_containers_mount_them(
    model: Model, tmp_path: Path
) -> None:
    services = model["services"]
    init = services["fleet-init"]
    assert init["entrypoint"][0] == "/bin/sh"
    (script,) = init["command"]
    out = tmp_path / "out"
    folders = {
        target: out / Path(target).relative_to("/out") for target in _volumes(init).values() if target != "/fleet"
    }
    for folder in folders.values():
        folder.mkdir(parents=True)
    env = {
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "HOME": str(tmp_path),
        "FLEET": str(tmp_path / "fleet"),
        "OUT": str(out),
        "FLEET_OWNER": f"{os.getuid()}:{os.getgid()}",
        "HUB_HOST_PORT": "4230",
    }
    done = subprocess.run([*init["entrypoint"], script], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    # Twice: the seeds are kept, and it runs again over its own files (a restart of the project).
    again = subprocess.run([*init["entrypoint"], script], env=env, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stdout + again.stderr

    for name in HUB:
        mount = _volumes(services[name])["fleet-hub-conf"]
        conf_path = services[name]["command"][1]
        text = (out / "hub" / Path(conf_path).relative_to(mount)).read_text()
        assert f'server_name: "{name}"' in text and 'domain: "hub"' in text and "verify: true" in text
        assert f"{mount}/client-tls/tls.crt" in text
        relocated = tmp_path / f"{name}.conf"
        relocated.write_text(text.replace(mount, str(out / "hub")).replace('"/data"', f'"{tmp_path}/{name}"'))
        _check_config(relocated)
    host = out / "host"
    _lone_stack_bus(host / "members" / "conf", tmp_path)
    for c in MEMBERS:
        folder = host / "members" / c
        member = (folder / "member.conf").read_text()
        assert f'domain: "{c}"' in member
        assert re.findall(r"nats-leaf://([\w-]+):7422", member) == list(HUB)
        assert (folder / "member.conf").stat().st_mode & 0o077 == 0 and (folder / "tls.key").stat().st_mode & 0o077 == 0
        (folder / "member.conf").write_text(
            member.replace("/etc/nats/fleet", str(folder)).replace('"/data"', f'"{tmp_path}/{c}"')
        )
        _check_config(folder / "nats.conf")
    # The admin seed in its set-up job's volume, for its user; the host's reader seed and how to use it.
    seed = out / "hub-admin" / "nats.nk"
    assert seed.read_text().startswith("SU") and (seed.stat().st_mode & 0o077) == 0
    reader = host / "fleet-reader.nk"
    assert reader.read_text().startswith("SU") and (reader.stat().st_mode & 0o077) == 0
    assert reader.read_text() != seed.read_text()
    assert "export NATS_URL=tls://127.0.0.1:4230\n" in (host / "hub.env").read_text()
    assert sorted(p.name for p in host.iterdir()) == ["fleet-reader.nk", "hub-ca.crt", "hub.env", "members"]
    assert nats_server_binary().is_file()
