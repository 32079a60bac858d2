"""``tjpipe fleet``: the files it writes are what ``tjpipe.fleet_nats`` renders and what nats-server accepts, with seeds
kept private; ``setup`` and ``status`` work on a real hub as its ``fleet-admin``."""

from __future__ import annotations

import stat
import subprocess
from pathlib import Path

import pytest

from contracts import fleet as fleet_contract
from fleet.support import Fleet
from tjpipe import fleet_nats
from tjpipe.cli import main
from tjpipe.local.natsd import nats_server_binary

pytestmark = [pytest.mark.nats, pytest.mark.timeout(60)]


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_files_of_a_fleet(tmp_path: Path) -> None:
    folder = tmp_path / "fleet"
    members = ["--member", "c1", "--member", "c2"]
    assert main(["fleet", "credentials", "--dir", str(folder), *members, "--hub-host", "127.0.0.1"]) == 0
    creds = fleet_nats.FleetCredentials(folder)
    assert _mode(folder) == 0o700 and _mode(creds.leaf_seed("c1")) == 0o600
    assert _mode(folder / "tls" / "members" / "c1.key") == 0o600
    assert (folder / "hub-authorization.conf").read_text() == fleet_nats.hub_authorization(creds, ["c1", "c2"])

    (tmp_path / "pw").write_text("route-secret\n")
    hub = tmp_path / "hub-0.conf"
    hub_args = ["--name", "hub-0", "--route", "127.0.0.1:6223", "--store-dir", str(tmp_path / "store")]
    hub_args += ["--route-password-file", str(tmp_path / "pw"), "--out", str(hub)]
    assert main(["fleet", "hub-config", "--dir", str(folder), *members, *hub_args]) == 0
    assert _mode(hub) == 0o600 and "verify: true" in hub.read_text()
    checked = subprocess.run([str(nats_server_binary()), "-c", str(hub), "-t"], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr

    member = tmp_path / "c1.conf"
    member_args = ["--cluster", "c1", "--hub", "127.0.0.1:7422", "--store-dir", "/data", "--out", str(member)]
    assert main(["fleet", "member-config", "--dir", str(folder), *member_args]) == 0
    assert _mode(member) == 0o600
    assert creds.leaf_seed("c1").read_text().strip() in member.read_text()
    assert 'domain: "c1"' in member.read_text() and "members/c1.crt" in member.read_text()


def test_a_member_the_fleet_does_not_know_or_a_bad_name_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "fleet"
    assert main(["fleet", "credentials", "--dir", str(folder), "--member", "c1", "--hub-host", "127.0.0.1"]) == 0
    base = ["fleet", "member-config", "--dir", str(folder), "--hub", "h:7422", "--store-dir", "/d"]
    assert main([*base, "--cluster", "c9", "--out", str(tmp_path / "c9.conf")]) == 2
    assert "run 'tjpipe fleet credentials' first" in capsys.readouterr().err
    assert main([*base, "--cluster", "prod.eu", "--out", str(tmp_path / "x.conf")]) == 2
    assert "not a DNS label" in capsys.readouterr().err
    assert not (tmp_path / "c9.conf").exists() and not (tmp_path / "x.conf").exists()


def test_setup_and_status_on_the_hub(fleet_servers: Fleet, capsys: pytest.CaptureFixture[str]) -> None:
    nats = [
        "--nats-url",
        fleet_servers.hub.url,
        "--nats-creds",
        str(fleet_servers.creds.hub_seed(fleet_nats.HUB_ADMIN)),
    ]
    assert main(["fleet", "setup", "--member", "c1", "--member", "c2", *nats]) == 0
    reader = [
        "--nats-url",
        fleet_servers.hub.url,
        "--nats-creds",
        str(fleet_servers.creds.hub_seed(fleet_nats.HUB_READER)),
    ]
    assert main(["fleet", "status", *reader]) == 0
    rows = [line.split("\t") for line in capsys.readouterr().out.splitlines() if line.startswith("FLEET_")]
    # Twice (setup prints them too): every fleet stream, each member once, connected.
    assert len(rows) == 2 * 5 * 2
    assert {(row[0], row[1]) for row in rows} == {
        (spec.name, cluster) for spec in fleet_contract.FLEET_STREAMS for cluster in ("c1", "c2")
    }
    # Connected, nothing lost, no error: stream, cluster, lag, lost, last contact.
    assert not [row for row in rows if row[3] != "lost 0" or "not connected" in row[4] or len(row) > 5]
