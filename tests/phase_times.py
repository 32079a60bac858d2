"""Wall time per top-level test folder, for the phase table `scripts/test.sh` prints at the end of a run.

Why wall time per folder and not pytest's --durations: a session fixture (a cluster, a compose stack, a
cold Go build) costs its folder minutes that no single test's duration shows, and the question the table
answers is which folder a slow run spent its time in. pytest runs once; each item's whole protocol (its
setup, call and teardown, session fixtures' start and stop included) is charged to its folder.

Rows go to the file `TJPIPE_PHASES` names, in the format `scripts/phases.py` owns (loaded from there, so
the format lives in one place). Outside a run of test.sh (no `TJPIPE_PHASES`) this records nothing.
`inside(name, seconds)` lets a fixture report a part of its folder's time (the compose images) as a row
indented under the folder.
"""

from __future__ import annotations

import importlib.util
import os
import time
from collections.abc import Generator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

_PHASES_SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "phases.py"

_current: list[str] = []
_inside: dict[str, list[tuple[str, float, str]]] = {}


def _phases() -> ModuleType:
    spec = importlib.util.spec_from_file_location("tjpipe_phases_script", _PHASES_SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def inside(name: str, seconds: float, note: str = "") -> None:
    """A part of the running test folder's time worth its own row (for example images built)."""
    folder = _current[-1] if _current else "pytest"
    _inside.setdefault(folder, []).append((name, seconds, note))


class PhaseTimes:
    def __init__(self, rootpath: Path) -> None:
        self.tests = rootpath / "tests"
        self.prefix = os.environ.get("TJPIPE_PHASE_PREFIX", "")
        self.folders: dict[str, float] = {}
        self.counts = {"passed": 0, "failed": 0, "skipped": 0}
        self.session_started = time.monotonic()
        self.collected = 0.0

    def folder_of(self, path: Path) -> str:
        try:
            return "tests/" + path.relative_to(self.tests).parts[0]
        except ValueError:
            return str(path.parent)

    def pytest_collection(self) -> None:
        self.session_started = time.monotonic()

    def pytest_collection_finish(self) -> None:
        self.collected = time.monotonic() - self.session_started

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Generator[None, Any, None]:
        folder = self.folder_of(Path(item.path))
        _current.append(folder)
        started = time.monotonic()
        try:
            yield
        finally:
            self.folders[folder] = self.folders.get(folder, 0.0) + time.monotonic() - started
            _current.pop()

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.failed:
            self.counts["failed"] += 1
        elif report.skipped and report.when in ("setup", "call"):
            self.counts["skipped"] += 1
        elif report.passed and report.when == "call":
            self.counts["passed"] += 1

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed:
            self.counts["failed"] += 1

    def pytest_sessionfinish(self) -> None:
        phases = _phases()
        if phases.phases_file() is None:
            return
        phases.record(f"{self.prefix}pytest collection", self.collected)
        for folder, seconds in self.folders.items():
            phases.record(f"{self.prefix}{folder}", seconds)
            for name, part, note in _inside.get(folder, []):
                phases.record(f"  {name}", part, note)
        phases.record_counts(self.counts["passed"], self.counts["failed"], self.counts["skipped"])
