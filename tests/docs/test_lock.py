"""The documentation site's tools are pinned once in pyproject.toml and locked, with every package they pull
in and its hashes, in requirements-docs.lock; the two must name the same versions, and the environment that
builds the site in scripts/test.sh must run them."""

from __future__ import annotations

import importlib.util
import sys
import tomllib
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TOOLS = ("mkdocs", "mkdocs-material")


def _locked() -> dict[str, tuple[str, list[str]]]:
    """``requirements-docs.lock`` as tools/locks.py reads every lock (which also checks each pin's hashes)."""
    spec = importlib.util.spec_from_file_location("locks", REPO / "tools" / "locks.py")
    assert spec and spec.loader
    locks = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("locks", locks)
    spec.loader.exec_module(locks)
    pins: dict[str, tuple[str, list[str]]] = locks.pins(REPO / "requirements-docs.lock")
    return pins


def _pinned(extra: str) -> dict[str, str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    pins = (p.split("==") for p in project["optional-dependencies"][extra] if "==" in p)
    return {name.lower(): version for name, version in pins}


def test_the_lock_and_both_extras_name_the_same_tool_versions() -> None:
    locked = _locked()
    for extra in ("docs", "test"):
        pinned = _pinned(extra)
        for tool in TOOLS:
            version = locked[tool][0]
            assert pinned[tool] == version, f"{tool}: pyproject [{extra}] {pinned[tool]}, lock {version}"


def test_the_site_is_built_with_the_locked_tools() -> None:
    locked = _locked()
    for tool in TOOLS:
        assert metadata.version(tool) == locked[tool][0], f"{tool} installed here differs from requirements-docs.lock"
