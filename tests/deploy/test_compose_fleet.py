"""compose/fleet.yml, profile ``fleet``: valid Compose, and the files its servers would run are ones nats-server runs.

No container is started (a hub of three servers, two members and the images they need take far longer than
these checks, and need a Docker engine). Instead: the file is loaded by compose-go's own loader (alone and
merged over the lone-cluster stack) and checked against the Compose Specification's schema, as
test_compose.py does for the main file; and the one-shot ``fleet-init``'s script, taken from the loaded model,
is run on this machine with its volumes as folders, so the very commands it runs (``tjpipe fleet ...``,
``tjpipe nats-credentials``) write the files, which ``nats-server -t`` then checks where the containers mount them.
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
HUB = ("fleet-hub-0", "fleet-hub-1", "fleet-hub-2")
MEMBERS = ("c1", "c2")

Model = dict[str, Any]


def _load(*files: Path, home: Path) -> Model:
    binary = ensure_go_tool(COMPOSE_SPEC_VALIDATOR, progress=lambda line: print(f"[tjpipe] {line}", flush=True))
    completed = subprocess.run(
        [str(binary), "--format", "json", *(file.name for file in files)],
        cwd=FLEET_FILE.parent,
        env={"PATH": os.environ.get("PATH", ""), "HOME": str(home)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
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


def test_the_fleet_file_is_valid_alone_and_over_the_lone_cluster_stack(
    model: Model, validator: Draft202012Validator, tmp_path: Path
) -> None:
    assert _errors(validator, yaml.safe_load(FLEET_FILE.read_text())) == []
    merged = _load(COMPOSE_FILE, FLEET_FILE, home=tmp_path)
    lone = _load(COMPOSE_FILE, home=tmp_path)
    assert set(merged["services"]) == set(lone["services"]) | set(model["services"])
    assert not set(lone["services"]) & set(model["services"])


def test_everything_is_in_the_fleet_profile_and_nothing_is_published(model: Model) -> None:
    services = model["services"]
    assert set(services) == {
        "fleet-init",
        *HUB,
        *(f"fleet-{c}" for c in MEMBERS),
        *(f"fleet-{c}-bus-setup" for c in MEMBERS),
        "fleet-setup",
    }
    assert {name: service.get("profiles") for name, service in services.items()} == {
        name: ["fleet"] for name in services
    }
    assert not [name for name, service in services.items() if service.get("ports")]
    assert services["fleet-init"]["network_mode"] == "none"


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
    for c in MEMBERS:
        assert users[f"fleet-{c}-admin"] == {"fleet-init", f"fleet-{c}-bus-setup"}
        assert users[f"fleet-{c}-conf"] == {"fleet-init", f"fleet-{c}"}


def test_the_setup_job_sets_up_every_member_at_the_hub(model: Model) -> None:
    setup = model["services"]["fleet-setup"]
    args = setup["command"]
    assert args[:2] == ["fleet", "setup"]
    assert [args[i + 1] for i, arg in enumerate(args) if arg == "--member"] == list(MEMBERS)
    assert setup["environment"]["NATS_URL"] == "nats://fleet-hub-0:4222"
    assert set(setup["depends_on"]) == {*HUB, *(f"fleet-{c}-bus-setup" for c in MEMBERS)}


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
        relocated = tmp_path / f"{name}.conf"
        relocated.write_text(text.replace(mount, str(out / "hub")).replace('"/data"', f'"{tmp_path}/{name}"'))
        _check_config(relocated)
    for c in MEMBERS:
        service = services[f"fleet-{c}"]
        mount = _volumes(service)[f"fleet-{c}-conf"]
        folder = out / c
        member = (folder / "member.conf").read_text()
        assert f'domain: "{c}"' in member
        assert re.findall(r"nats-leaf://([\w-]+):7422", member) == list(HUB)
        (folder / "member.conf").write_text(member.replace(mount, str(folder)).replace('"/data"', f'"{tmp_path}/{c}"'))
        assert service["command"] == ["-c", f"{mount}/nats.conf"]
        _check_config(folder / "nats.conf")
    # The admin seeds, each in its own volume, for its set-up job's user.
    for name in ("hub-admin", "c1-admin", "c2-admin"):
        seed = out / name / "nats.nk"
        assert seed.read_text().startswith("SU") and (seed.stat().st_mode & 0o077) == 0
    assert nats_server_binary().is_file()
