"""The project's version is written once, in pyproject.toml, and read at run time from the installed package's
metadata (``tjpipe --version``). What cannot read it (the manifests' image tag, the Helm chart) repeats it, and
this test holds every copy to it; the changelog and the upgrade notes name it too."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import yaml

from .support import DOCS, REPO

BIN = Path(sys.executable).parent


def _version() -> str:
    version: str = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    return version


def test_tjpipe_version_is_the_packages() -> None:
    assert metadata.version("trainjob-pipeline") == _version(), "reinstall: the environment is stale"
    shown = subprocess.run([str(BIN / "tjpipe"), "--version"], capture_output=True, text=True, timeout=60, check=True)
    assert shown.stdout.strip() == f"tjpipe {_version()}"


def test_every_copy_of_the_version_agrees() -> None:
    version = _version()
    chart = yaml.safe_load((REPO / "charts" / "trainjob-pipeline" / "Chart.yaml").read_text())
    assert (chart["version"], chart["appVersion"]) == (version, version)
    for overlay in ("base", "overlays/fleet-hub"):
        kustomization = yaml.safe_load((REPO / "deploy" / overlay / "kustomization.yaml").read_text())
        tags = {i["name"]: i.get("newTag") for i in kustomization["images"]}
        assert tags["trainjob-pipeline"] == version, overlay


def test_the_release_has_upgrade_notes() -> None:
    version = _version()
    assert f"### {version}" in (DOCS / "upgrading.md").read_text()
    changelog = (REPO / "CHANGELOG.md").read_text()
    assert "## [Unreleased]" in changelog or f"## [{version}]" in changelog
