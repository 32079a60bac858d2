"""Where a test run's wall time went: one table at the end of every `scripts/test.sh` and `.ci/run` log.

Why a file of rows and not timing in each script: the phases happen in three places (`.ci/run` installs apt
packages and starts dockerd, `scripts/test.sh` builds and checks, pytest runs the test folders), and the log
must end with ONE table. Each place appends rows to the file `TJPIPE_PHASES` names; `report` prints them.
Why it says cold or warm: a run that built its Go binaries is a different run from one that found them in
the cache (~/.cache/trainjob-pipeline), and the budgets differ (`WARM_BUDGET`, `COLD_BUDGET`).

Only the standard library: `.ci/run` records its apt phase before any environment exists. `go` is the one
command that needs the project (run it with the environment's Python).

    python3 scripts/phases.py run NAME -- COMMAND...      time COMMAND, record it, exit with its code
    python3 scripts/phases.py record NAME --since EPOCH [--note TEXT]
    python3 scripts/phases.py open NAME                   the place in the table of a block's row
    .venv/bin/python scripts/phases.py go kube|jobset|cluster|trainer|helm|node
    python3 scripts/phases.py report [--exit-code N] [--if-not-reported]

The row format (tab-separated: name, seconds, note) is written only by `record` below; the pytest plugin
(tests/phase_times.py) loads this file to use it, and writes a `#tests` row with its counts.

Work that runs side by side (test.sh overlaps the Go builds with the checks, and runs the tests in two
lanes): test.sh opens a block (`open NAME` where it starts, `record NAME --since` when it ends, with its
wall time), and the rows of what ran inside it carry a prefix (`TJPIPE_PHASE_PREFIX`, "  lane 1: "), so
they are indented under the block: the total still adds up from the top-level rows, and the indented ones
say where each part of the block went, on its own clock.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

WARM_BUDGET = 40 * 60
"""A warm run (every Go binary from the cache) over this is drift to look at: CI's hard limit is 90 min."""
COLD_BUDGET = 60 * 60
"""A cold run (Go binaries built, apt packages installed) over this leaves too little of CI's 90 min."""

SIDE_BY_SIDE = "side by side: "
"""The name of a block's row starts with this (test.sh)."""

ENV_FILE = "TJPIPE_PHASES"
ENV_STARTED = "TJPIPE_RUN_STARTED"
COUNTS = "#tests"
REPORTED = "#reported"
OPENED = "#open"
PREFIX = "TJPIPE_PHASE_PREFIX"


def phases_file() -> Path | None:
    named = os.environ.get(ENV_FILE)
    return Path(named) if named else None


def record(name: str, seconds: float, note: str = "", *, path: Path | None = None) -> None:
    """Append one row; a no-op when no run is collecting (a bare `pytest` outside test.sh)."""
    target = path or phases_file()
    if target is None:
        return
    clean = [part.replace("\t", " ").replace("\n", " ") for part in (name, f"{seconds:.1f}", note)]
    with target.open("a", encoding="utf-8") as out:
        out.write("\t".join(clean) + "\n")


def record_counts(passed: int, failed: int, skipped: int, *, path: Path | None = None) -> None:
    record(COUNTS, 0.0, f"{passed} {failed} {skipped}", path=path)


def _rows(path: Path) -> list[tuple[str, float, str]]:
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        parts = line.split("\t")
        if len(parts) == 3:
            rows.append((parts[0], float(parts[1]), parts[2]))
    return rows


def _minutes(seconds: float) -> str:
    return f"{int(seconds // 60)}:{int(seconds % 60):02d}"


# ------------------------------------------------------------------------------------------- Go builds


def _go(target: str) -> int:
    """Build or find one group of Go binaries, recording whether each came from the cache."""
    from tjpipe.local import helm, toolchain

    def executable(path: Path) -> bool:
        return path.is_file() and os.access(path, os.X_OK)

    groups = {
        "kube": (
            "kube-apiserver, etcd",
            lambda: [toolchain.kube_apiserver_path(), toolchain.etcd_path()],
            lambda: toolchain.ensure_kube_binaries(progress=print),
        ),
        "jobset": (
            "JobSet's manager",
            lambda: [toolchain.jobset_manager_path()],
            lambda: toolchain.ensure_jobset_manager(progress=print),
        ),
        "cluster": (
            "kube-controller-manager, kube-scheduler, kwok",
            lambda: list(vars(toolchain.cluster_binaries_paths()).values()),
            lambda: toolchain.ensure_cluster_binaries(progress=print),
        ),
        "trainer": (
            "Trainer's controller manager",
            lambda: [toolchain.trainer_controller_path()],
            lambda: toolchain.ensure_trainer_controller(progress=print),
        ),
        "helm": ("helm", lambda: [helm.helm_path()], lambda: helm.ensure_helm(progress=print)),
        "node": (
            "kubelet, kube-proxy, containerd, runc, CNI plugins, CoreDNS",
            lambda: list(toolchain.node_binaries_paths().all().values()),
            lambda: toolchain.ensure_node_binaries(progress=print),
        ),
    }
    label, paths, ensure = groups[target]
    before = [path for path in paths() if not executable(path)]
    started = time.monotonic()
    failed = ""
    try:
        ensure()
    except BaseException as exc:
        failed = f"failed: {exc.__class__.__name__}"
        raise
    finally:
        took = time.monotonic() - started
        if failed:
            note = failed
        elif before:
            note = "built: " + ", ".join(path.name for path in before)
        else:
            note = "cache"
        record(f"{os.environ.get(PREFIX, '')}go: {label}", took, note)
    return 0


# ---------------------------------------------------------------------------------------------- report


def _blocks_in_place(rows: list[tuple[str, float, str]]) -> list[tuple[str, float, str]]:
    """A block's row is written when it ends; it goes where the block was opened, above what ran in it."""
    ended = {name: (name, seconds, note) for name, seconds, note in rows if not name.startswith("#")}
    opened = {note for name, _, note in rows if name == OPENED}
    placed: list[tuple[str, float, str]] = []
    for name, seconds, note in rows:
        if name == OPENED:
            if note in ended:
                placed.append(ended[note])
        elif name not in opened:
            placed.append((name, seconds, note))
    return _grouped(placed)


def _grouped(rows: list[tuple[str, float, str]]) -> list[tuple[str, float, str]]:
    """Under a block, the rows of one side ("  lane 1: ...") together, in the order each side first wrote;
    a row indented deeper stays with the row above it."""
    out: list[tuple[str, float, str]] = []
    pending: dict[str, list[tuple[str, float, str]]] = {}
    side = ""

    def flush() -> None:
        for group in pending.values():
            out.extend(group)
        pending.clear()

    for row in rows:
        depth = len(row[0]) - len(row[0].lstrip())
        if row[0].startswith("#"):
            out.append(row)
        elif depth == 0:
            flush()
            out.append(row)
        elif depth == 2:
            side = row[0].strip().split(": ", 1)[0]
            pending.setdefault(side, []).append(row)
        else:
            pending.setdefault(side, []).append(row)
    flush()
    return out


def report(*, exit_code: int | None) -> list[str]:
    """The table, the cold/warm verdict, the budget guard, and last of all the one-line test summary."""
    path = phases_file()
    rows = _blocks_in_place(_rows(path)) if path is not None and path.exists() else []
    started = float(os.environ.get(ENV_STARTED) or 0) or None
    total = time.time() - started if started else sum(s for n, s, _ in rows if not n.startswith(("#", " ")))
    phases = [(n, s, note) for n, s, note in rows if not n.startswith("#")]
    passed = failed = skipped = 0
    for name, _, note in rows:
        if name == COUNTS:
            p, f, s = (int(x) for x in note.split())
            passed, failed, skipped = passed + p, failed + f, skipped + s
    built = [note[len("built: ") :] for name, _, note in phases if "go: " in name and note.startswith("built")]
    installed = [note for name, _, note in phases if name == "apt" and note.startswith("installed")]
    cold = bool(built or installed)

    width = max([len(n) for n, _, _ in phases] + [len("total")])
    lines = ["", "=" * 26 + " where this run's time went " + "=" * 26]
    lines.append(f"{'phase':<{width}}  {'m:ss':>6}  {'s':>7}  note")
    for name, seconds, note in phases:
        lines.append(f"{name:<{width}}  {_minutes(seconds):>6}  {seconds:7.1f}  {note}")
    accounted = sum(s for n, s, _ in phases if not n.startswith("  "))
    lines.append(f"{'total':<{width}}  {_minutes(total):>6}  {total:7.1f}  wall clock of the whole run")
    lines.append(f"(rows indented under another are part of it; {total - accounted:.0f}s outside every row)")
    if any(name.startswith(SIDE_BY_SIDE) for name, _, _ in phases):
        lines.append(
            f"('{SIDE_BY_SIDE.strip()}' rows are wall time: what is indented under one ran at the same time as the"
            " rest of it, each on its own clock, so its rows add up to more than the block)"
        )
    if cold:
        why = "; ".join([*(f"Go binaries built: {b}" for b in built), *installed])
        lines.append(f"run: COLD ({why})")
    else:
        lines.append("run: warm (every Go binary from the cache, no apt package installed)")
    budget = COLD_BUDGET if cold else WARM_BUDGET
    if total > budget:
        # The phases themselves: top-level rows, or the rows one level under a side-by-side block.
        blocks = any(n.startswith(SIDE_BY_SIDE) for n, _, _ in phases)
        deepest = 2 if blocks else 0
        parts = [p for p in phases if len(p[0]) - len(p[0].lstrip()) <= deepest and not p[0].startswith(SIDE_BY_SIDE)]
        top = sorted(parts, key=lambda p: -p[1])[:4]
        slowest = ", ".join(f"{n.strip()} {_minutes(s)}" for n, s, _ in top)
        lines.append(
            f"WARNING: this {'cold' if cold else 'warm'} run took {_minutes(total)}, over its "
            f"{budget // 60}-minute budget (CI stops at 90); slowest phases: {slowest}"
        )
    if exit_code not in (None, 0):
        lines.append(f"exit code {exit_code}" + ("" if failed else " (a step outside the tests failed, see above)"))
    lines.append(f"tests: {passed} passed, {failed} failed, {skipped} skipped")
    return lines


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="phases.py")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run")
    run.add_argument("name")
    run.add_argument("argv", nargs=argparse.REMAINDER)
    rec = sub.add_parser("record")
    rec.add_argument("name")
    rec.add_argument("--since", type=float, required=True, help="the phase's start, seconds since the epoch")
    rec.add_argument("--note", default="")
    opening = sub.add_parser("open")
    opening.add_argument("name")
    go = sub.add_parser("go")
    go.add_argument("target", choices=["kube", "jobset", "cluster", "trainer", "helm", "node"])
    rep = sub.add_parser("report")
    rep.add_argument("--exit-code", type=int)
    rep.add_argument("--if-not-reported", action="store_true", help="print nothing when test.sh already did")
    args = parser.parse_args(argv)

    if args.command == "run":
        command = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
        started = time.monotonic()
        code = subprocess.call(command)
        name = os.environ.get(PREFIX, "") + args.name
        record(name, time.monotonic() - started, "" if code == 0 else f"failed: exit {code}")
        return code
    if args.command == "record":
        record(args.name, time.time() - args.since, args.note)
        return 0
    if args.command == "open":
        record(OPENED, 0.0, args.name)
        return 0
    if args.command == "go":
        return _go(args.target)
    path = phases_file()
    if args.if_not_reported and path is not None and path.exists() and any(n == REPORTED for n, _, _ in _rows(path)):
        return 0
    sys.stdout.flush()
    print("\n".join(report(exit_code=args.exit_code)), flush=True)
    record(REPORTED, 0.0)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
