"""The documentation site's tools are pinned once in pyproject.toml and locked, with every package they pull
in and its hashes, in requirements-docs.lock; the two must name the same versions, and the environment that
builds the site in scripts/test.sh must run them."""

from __future__ import annotations

import re
import tomllib
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TOOLS = ("mkdocs", "mkdocs-material")


def _locked() -> dict[str, tuple[str, list[str]]]:
    text = re.sub(r"\\\n", " ", (REPO / "requirements-docs.lock").read_text())
    locked: dict[str, tuple[str, list[str]]] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        requirement, *hashes = line.split()
        name, version = requirement.split("==")
        locked[name.lower()] = (version, [h.removeprefix("--hash=sha256:") for h in hashes])
    return locked


def _pinned(extra: str) -> dict[str, str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    pins = (p.split("==") for p in project["optional-dependencies"][extra] if "==" in p)
    return {name.lower(): version for name, version in pins}


def test_the_lock_pins_every_package_with_a_hash() -> None:
    locked = _locked()
    assert set(TOOLS) <= set(locked)
    for name, (_version, hashes) in locked.items():
        assert hashes and all(re.fullmatch(r"[0-9a-f]{64}", h) for h in hashes), name


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
