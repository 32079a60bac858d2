"""scripts/phases.py: the table at the end of every test.sh log, with steps that ran side by side."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "phases.py"


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("phases_under_test", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def phases(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.setenv("TJPIPE_PHASES", str(tmp_path / "rows"))
    monkeypatch.delenv("TJPIPE_RUN_STARTED", raising=False)
    monkeypatch.delenv("TJPIPE_PHASE_PREFIX", raising=False)
    return load()


def two_lanes(phases: ModuleType) -> None:
    """What test.sh writes: a block opened, the lanes' rows as each pytest ends, the block's row last."""
    phases.record("environment (.venv)", 20.0)
    assert phases.main(["open", "side by side: the tests in two lanes"]) == 0
    phases.record("  lane 2: tests/cli", 50.0, "cpu: machine 70% of 2 cores busy")
    phases.record("  lane 1: tests/compose", 250.0)
    phases.record("    compose images (built or found)", 9.0)
    phases.record_counts(10, 1, 0)
    phases.record("  lane 2: tests/faults", 200.0)
    phases.record_counts(20, 0, 2)
    phases.record("  lane 1: tests/containers", 260.0)
    phases.record_counts(5, 0, 0)
    phases.record("side by side: the tests in two lanes", 520.0, "wall time of the block")


def table(lines: list[str]) -> list[str]:
    start = next(i for i, line in enumerate(lines) if line.startswith("phase"))
    end = next(i for i, line in enumerate(lines) if line.startswith("total"))
    return [re.split(r"\s+\d+:\d\d\s", line)[0] for line in lines[start + 1 : end]]


def test_a_block_row_stands_above_what_ran_in_it_and_each_side_stays_together(phases: ModuleType) -> None:
    two_lanes(phases)
    assert table(phases.report(exit_code=0)) == [
        "environment (.venv)",
        "side by side: the tests in two lanes",
        "  lane 2: tests/cli",
        "  lane 2: tests/faults",
        "  lane 1: tests/compose",
        "    compose images (built or found)",
        "  lane 1: tests/containers",
    ]


def test_the_total_adds_up_from_the_top_rows_and_the_counts_from_every_pytest(phases: ModuleType) -> None:
    two_lanes(phases)
    lines = phases.report(exit_code=1)
    assert "(rows indented under another are part of it; 0s outside every row)" in lines
    assert any(line.startswith("total") and " 540.0 " in line for line in lines)
    assert lines[-1] == "tests: 35 passed, 1 failed, 2 skipped"


def test_the_guard_names_the_slowest_folders_not_the_block(phases: ModuleType) -> None:
    two_lanes(phases)
    phases.record("  lane 1: tests/progress_under_load", 2500.0)
    phases.record("side by side: the tests in two lanes", 2600.0)  # a later block of the same name wins
    warning = next(line for line in phases.report(exit_code=0) if line.startswith("WARNING"))
    assert "progress_under_load 41:40" in warning
    assert "side by side" not in warning and "compose images" not in warning


def test_a_go_build_inside_a_block_still_makes_the_run_cold(
    phases: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TJPIPE_PHASE_PREFIX", "  Go builds: ")
    phases.main(["open", "side by side: Go builds | checks"])
    phases.record("  Go builds: go: helm", 60.0, "built: helm")
    phases.record("side by side: Go builds | checks", 61.0)
    assert "run: COLD (Go binaries built: helm)" in phases.report(exit_code=0)
