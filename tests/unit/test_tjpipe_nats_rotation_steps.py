"""The rotation's steps on a folder of seeds: their order, what each leaves behind, the block they produce.

The server's side (reloads, connections moving to the new keys) is tests/security/test_nats_rotation.py.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tjpipe import cli
from tjpipe.credentials import (
    IDENTITIES,
    Credentials,
    RotationError,
    begin_rotation,
    finish_rotation,
    generate_credentials,
    rotation_step,
    server_authorization,
    swap_seeds,
)


@pytest.fixture
def creds(tmp_path: Path) -> Credentials:
    return generate_credentials(tmp_path / "creds")


def users(block: str) -> list[str]:
    return re.findall(r'nkey: "(U[A-Z2-7]+)"', block)


def test_the_block_trusts_both_keys_of_an_identity_while_it_rotates(creds: Credentials) -> None:
    old = creds.public_keys()
    new = begin_rotation(creds, ["planner"])
    block = server_authorization(creds)
    assert sorted(users(block)) == sorted([*old.values(), new["planner"]])
    lines = {line for line in block.splitlines() if new["planner"] in line or old["planner"] in line}
    assert len(lines) == 2
    # The same permissions for both, and each may use the identity's inbox and its own key's.
    without_key = {line.replace(new["planner"], "K").replace(old["planner"], "K") for line in lines}
    assert len(without_key) == 1
    assert '"_INBOX_planner.>"' in lines.pop()

    swap_seeds(creds)
    assert creds.public_key("planner") == new["planner"]
    assert sorted(users(server_authorization(creds))) == sorted([*old.values(), new["planner"]])
    assert finish_rotation(creds) == {"planner": old["planner"]}
    assert sorted(users(server_authorization(creds))) == sorted({**old, "planner": new["planner"]}.values())


def test_steps_out_of_order_are_refused_and_change_nothing(creds: Credentials) -> None:
    with pytest.raises(RotationError, match="rotate begin"):
        swap_seeds(creds)
    with pytest.raises(RotationError, match="no rotation to finish"):
        finish_rotation(creds)
    begin_rotation(creds)
    before = {path.name: path.read_bytes() for path in creds.root.iterdir()}
    with pytest.raises(RotationError, match="under way"):
        begin_rotation(creds, ["reader"])
    with pytest.raises(RotationError, match="rotate swap"):
        finish_rotation(creds)
    assert {path.name: path.read_bytes() for path in creds.root.iterdir()} == before


def test_what_each_step_leaves_in_the_folder(creds: Credentials) -> None:
    old = creds.public_keys()
    begin_rotation(creds)
    for identity in IDENTITIES:
        assert creds.rotation_phase(identity) == "begun"
        assert creds.next_seed_file(identity).stat().st_mode & 0o777 == 0o600
    swap_seeds(creds)
    for identity in IDENTITIES:
        assert creds.rotation_phase(identity) == "swapped"
        assert not creds.next_seed_file(identity).exists()
        assert creds.seed_file(identity).stat().st_mode & 0o777 == 0o600
        assert creds.retiring_file(identity).read_text().strip() == old[identity]  # the public key, no seed
    finish_rotation(creds)
    assert sorted(path.name for path in creds.root.iterdir()) == sorted(f"{i}.nk" for i in IDENTITIES)


def test_the_command_writes_the_block_and_says_no_seed(creds: Credentials, tmp_path: Path) -> None:
    block = tmp_path / "authorization.conf"
    said: list[str] = []
    for step in ("begin", "swap", "status", "finish"):
        rotation_step(step, creds, authorization=block, say=said.append)
        assert block.read_text() == server_authorization(creds) or step in ("swap", "status")
    text = "\n".join(said)
    assert "rotate swap" in text and "no longer trusted" in text
    assert not re.search(r"\bSU[A-Z2-7]{50,}", text)


def test_the_cli_takes_dir_before_or_after_the_step(creds: Credentials, capsys: pytest.CaptureFixture[str]) -> None:
    parser = cli.build_parser()
    for argv in (
        ["nats-credentials", "rotate", "status", "--dir", str(creds.root)],
        ["nats-credentials", "--dir", str(creds.root), "rotate", "status"],
    ):
        args = parser.parse_args(argv)
        assert args.dir == creds.root
        assert cli._nats_credentials(args) == 0
    assert "planner: no rotation" in capsys.readouterr().out
