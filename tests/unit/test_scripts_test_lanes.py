"""scripts/test.sh's split of the test folders: the pure ones beside the Go builds, then two lanes.

What must hold for the split to lose nothing: every folder under tests/ that holds tests runs in exactly
one place, and every folder the script names exists (a renamed folder would otherwise drop out of lane 1
and be run nowhere, or twice).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def split() -> dict[str, list[str]]:
    """The arrays test.sh builds, computed by bash from the script's own lines (from `pure=(` to `done`)."""
    script = (REPO / "scripts" / "test.sh").read_text().splitlines()
    start = next(i for i, line in enumerate(script) if line.startswith("pure=("))
    end = next(i for i in range(start, len(script)) if script[i] == "done")
    snippet = "\n".join(
        [
            "set -euo pipefail",
            *script[start : end + 1],
            'echo "pure ${pure[*]}"',
            'echo "lane1 ${lane1[*]}"',
            'echo "lane2 ${lane2[*]}"',
            'echo "alone ${alone[*]}"',
        ]
    )
    out = subprocess.run(["bash", "-c", snippet], cwd=REPO, capture_output=True, text=True, check=True).stdout
    return {line.split(" ", 1)[0]: line.split(" ", 1)[1].split() for line in out.splitlines()}


def test_every_test_folder_runs_in_exactly_one_place() -> None:
    placed = [path for paths in split().values() for path in paths]
    assert len(placed) == len(set(placed)), placed
    holding_tests = {
        f"tests/{folder.name}"
        for folder in (REPO / "tests").iterdir()
        if folder.is_dir() and any(folder.rglob("test_*.py"))
    }
    assert holding_tests <= set(placed), holding_tests - set(placed)


def test_every_folder_the_script_names_exists() -> None:
    for paths in split().values():
        for path in paths:
            assert (REPO / path).exists(), path


def test_the_cost_budgets_run_alone() -> None:
    """What they count moves with the machine's pace, so nothing runs beside them."""
    assert split()["alone"] == ["tests/budgets"]


def test_the_docker_folders_share_a_lane() -> None:
    lanes = split()
    assert {"tests/compose", "tests/containers"} <= set(lanes["lane1"])
