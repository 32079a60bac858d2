"""The cost budgets page shows the budgets the tests hold: its tables are generated from their one declaration."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_budget_tables_are_generated_from_the_declaration() -> None:
    result = subprocess.run(
        [sys.executable, str(REPO / "tools" / "gen_budgets.py"), "--check"], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr


def test_every_unit_a_row_counts_per_is_declared_and_every_figure_has_one_row() -> None:
    sys.path.insert(0, str(REPO / "tools"))
    try:
        import gen_budgets
    finally:
        sys.path.remove(str(REPO / "tools"))
    declared = gen_budgets.declared()
    for title, rows in declared.SCENARIOS:
        figures = [row.figure for row in rows]
        assert len(figures) == len(set(figures)), f"{title}: a figure has two rows"
        assert all(row.reason for row in rows), f"{title}: a row without its reason"
