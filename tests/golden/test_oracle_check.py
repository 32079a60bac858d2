"""The golden cases are still what Trainer v2.3.0's own code produces: ``regen.py --check`` in the suite.

Why here: test_golden.py compares the planner with the files under cases/, so a case file edited by hand, or
left behind when the oracle or its variants changed, would make both sides agree on something Trainer never
produced. ``tools/upstream_oracle/regen.py --check`` runs every case through the oracle (Trainer's runtime
framework, built from its Go module) and fails if any file would change.

The oracle binary is cached next to the other Go binaries, named by a hash of its sources (main.go, go.mod,
go.sum), so a warm run does not rebuild it and a change to the oracle does.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from needs import unavailable

from tjpipe.local.toolchain import cache_root

REPO = Path(__file__).resolve().parents[2]
ORACLE_SOURCES = REPO / "tools" / "upstream_oracle"


def oracle_path() -> Path:
    digest = hashlib.sha256()
    for name in ("main.go", "go.mod", "go.sum"):
        digest.update((ORACLE_SOURCES / name).read_bytes())
    return cache_root() / "bin" / f"upstream-oracle-{digest.hexdigest()[:12]}" / "upstream-oracle"


@pytest.mark.timeout(1800)  # a cold first build of the oracle compiles Trainer's packages
def test_the_golden_cases_are_what_the_oracle_gives_today() -> None:
    if shutil.which("go") is None:
        unavailable("regen.py --check builds the oracle with the Go toolchain, which is not on PATH")
    oracle = oracle_path()
    oracle.parent.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [sys.executable, str(ORACLE_SOURCES / "regen.py"), "--check", "--oracle", str(oracle)],
        capture_output=True,
        text=True,
        check=False,
        timeout=1500,
    )
    assert done.returncode == 0, f"regen.py --check: exit {done.returncode}\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
