"""Wall time per top-level test folder, for the phase table `scripts/test.sh` prints at the end of a run.

Why wall time per folder and not pytest's --durations: a session fixture (a cluster, a compose stack, a
cold Go build) costs its folder minutes that no single test's duration shows, and the question the table
answers is which folder a slow run spent its time in. pytest runs once; each item's whole protocol (its
setup, call and teardown, session fixtures' start and stop included) is charged to its folder.

Rows go to the file `TJPIPE_PHASES` names, in the format `scripts/phases.py` owns (loaded from there, so
the format lives in one place). Outside a run of test.sh (no `TJPIPE_PHASES`) this records nothing.
`inside(name, seconds)` lets a fixture report a part of its folder's time (the compose images) as a row
indented under the folder.

Each folder's note says how busy the CPUs were meanwhile, because what can overlap depends on it: a folder
that waits (sleeps, deadlines, servers idling between steps) with the cores idle can run beside another
one; a folder that keeps both cores busy cannot. Two figures, from /proc: the machine's busy share over the
folder's time (everything on the machine, a second lane of the run included), and the CPU time of this
pytest and the processes it started (servers, stages, CLIs; not Docker's containers, which are dockerd's
children), in cores. On a machine with other work the first is inflated and the second is still this
folder's own. `TJPIPE_PHASE_PREFIX` (test.sh: "  lane 1: ") goes before every row's name.
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

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")

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


def machine_jiffies() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs since boot, from /proc/stat; (0, 0) where there is none."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return 0, 0
    total = sum(fields[:8])  # user nice system idle iowait irq softirq steal (guest is inside user)
    return total - fields[3] - fields[4], total


def tree_cpu_seconds() -> float:
    """CPU seconds of this process and its live descendants, each with its reaped children's."""
    parents: dict[int, int] = {}
    times: dict[int, int] = {}
    try:
        entries = list(Path("/proc").iterdir())
    except OSError:
        return 0.0
    for entry in entries:
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        rest = stat[stat.rfind(")") + 2 :].split()
        pid = int(entry.name)
        parents[pid] = int(rest[1])
        times[pid] = sum(int(x) for x in rest[11:15])  # utime stime cutime cstime
    children: dict[int, list[int]] = {}
    for pid, parent in parents.items():
        children.setdefault(parent, []).append(pid)
    total, todo = 0, [os.getpid()]
    while todo:
        pid = todo.pop()
        total += times.get(pid, 0)
        todo.extend(children.get(pid, []))
    return total / _CLOCK_TICKS


class _Busy:
    """How busy the CPUs were over a folder's time (added up over its stretches, if it has several)."""

    def __init__(self) -> None:
        self.busy = self.total = 0
        self.own = 0.0
        self.opened: tuple[int, int, float] | None = None

    def open(self) -> None:
        self.opened = (*machine_jiffies(), tree_cpu_seconds())

    def close(self) -> None:
        if self.opened is None:
            return
        busy, total = machine_jiffies()
        self.busy += busy - self.opened[0]
        self.total += total - self.opened[1]
        self.own += tree_cpu_seconds() - self.opened[2]
        self.opened = None

    def note(self, seconds: float) -> str:
        cores = os.cpu_count() or 1
        if self.total <= 0 or seconds <= 0:
            return ""
        share = 100 * self.busy / self.total
        return (
            f"cpu: machine {share:.0f}% of {cores} cores busy; this pytest's processes {self.own / seconds:.2f} cores"
        )


class PhaseTimes:
    def __init__(self, rootpath: Path) -> None:
        self.tests = rootpath / "tests"
        self.prefix = os.environ.get("TJPIPE_PHASE_PREFIX", "")
        self.folders: dict[str, float] = {}
        self.busy: dict[str, _Busy] = {}
        self.open_folder: str | None = None
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
        if folder != self.open_folder:
            if self.open_folder is not None:
                self.busy[self.open_folder].close()
            self.busy.setdefault(folder, _Busy()).open()
            self.open_folder = folder
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
        if self.open_folder is not None:
            self.busy[self.open_folder].close()
        indent = self.prefix[: len(self.prefix) - len(self.prefix.lstrip())]
        phases.record(f"{self.prefix}pytest collection", self.collected)
        for folder, seconds in self.folders.items():
            phases.record(f"{self.prefix}{folder}", seconds, self.busy[folder].note(seconds))
            for name, part, note in _inside.get(folder, []):
                phases.record(f"{indent}  {name}", part, note)
        phases.record_counts(self.counts["passed"], self.counts["failed"], self.counts["skipped"])
