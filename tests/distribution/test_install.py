"""What ``pip install trainjob-pipeline`` puts into an environment: its eight import roots and nothing else.

Each top-level folder of the repository (``contracts/``, ``planner/``, ...) is an import root of its own,
next to ``tjpipe`` (CONTRIBUTING.md, "Module paths"); the repository's tools (``bench``, ``tests``, ...)
stay out. These tests build the wheel as the Dockerfile does (``pip wheel --no-deps``), install it without
its dependencies into a fresh virtual environment, and read what it claims from the installed ``RECORD``.
Building needs the build backend (setuptools) from the package index or pip's cache: about a minute.
"""

from __future__ import annotations

import csv
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

pytestmark = [pytest.mark.packaging]

REPO = Path(__file__).resolve().parents[2]
IMPORT_ROOTS = ("tjpipe", "contracts", "planner", "watcher", "applier", "plumbing", "history_server", "status_server")
REPOSITORY_TOOLS = {"bench", "tests", "tools", "compose", "deploy", "scripts"}


def _run(*argv: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([str(a) for a in argv], cwd=cwd, capture_output=True, text=True, timeout=600, check=False)
    assert result.returncode == 0, f"{argv}:\n{result.stdout}\n{result.stderr}"
    return result


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    _run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "--wheel-dir", out, REPO, cwd=out)
    (built,) = out.glob("trainjob_pipeline-*.whl")
    return built


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh environment with the wheel installed and no dependencies."""
    root = tmp_path_factory.mktemp("venv")
    _run(sys.executable, "-m", "venv", root, cwd=root)
    _run(root / "bin" / "python", "-m", "pip", "install", "--no-deps", "--quiet", wheel, cwd=root)
    return root


def _site_packages(venv: Path) -> Path:
    (site,) = venv.glob("lib/python*/site-packages")
    return site


def test_the_wheel_holds_every_module_of_the_import_roots_and_nothing_else(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    assert {name.split("/")[0] for name in names if ".dist-info/" not in name} == set(IMPORT_ROOTS)
    packed = {name for name in names if name.endswith(".py")}
    for root in IMPORT_ROOTS:
        # Every file of the top-level folder, at the same path.
        in_repo = {p.relative_to(REPO).as_posix() for p in (REPO / root).rglob("*.py")}
        assert in_repo and in_repo <= packed, sorted(in_repo - packed)
    assert "planner/core.py" in packed and any(n.startswith("planner/plugins/") for n in packed)
    assert not [name for name in names if "/tests/" in name]
    assert any(name.endswith(".dist-info/licenses/LICENSE") for name in names)


def test_pip_install_claims_only_the_import_roots(venv: Path) -> None:
    site = _site_packages(venv)
    (dist_info,) = site.glob("trainjob_pipeline-*.dist-info")
    with (dist_info / "RECORD").open() as record:
        paths = [row[0] for row in csv.reader(record) if row]
    installed = {p.split("/")[0] for p in paths if not p.startswith("..")}
    top_level = {name.removesuffix(".py") for name in installed if not name.endswith(".dist-info")}
    assert top_level == set(IMPORT_ROOTS)
    assert not REPOSITORY_TOOLS & top_level
    scripts = {Path(p).name for p in paths if p.startswith("..")}
    assert scripts == {"tjpipe"}
    # Nothing on disk is a link: every module is a real file at its own path.
    assert not [p for root in IMPORT_ROOTS for p in (site / root).rglob("*") if p.is_symlink()]


def test_the_installed_package_imports_from_outside_the_repository(venv: Path, tmp_path: Path) -> None:
    """``import planner.core`` from another folder finds the installed files; the repository's tools are absent.

    The dependencies (msgspec, ...) come from this interpreter's site-packages, added after the fresh
    environment's own (a ``.pth`` line adds a folder without running the ``.pth`` files in it, so this
    project's editable install there stays off).
    """
    deps = sysconfig.get_paths()["purelib"]
    (_site_packages(venv) / "zz_dependencies.pth").write_text(deps + "\n")
    python = venv / "bin" / "python"
    probe = (
        "import importlib.util, tjpipe, planner.core, contracts.messages; "
        "print(tjpipe.__file__); print(planner.core.__file__); "
        f"print(sorted(n for n in {sorted(REPOSITORY_TOOLS)!r} if importlib.util.find_spec(n)))"
    )
    out = _run(python, "-I", "-c", probe, cwd=tmp_path).stdout.splitlines()
    site = str(_site_packages(venv))
    assert out[0].startswith(site) and out[1] == f"{site}/planner/core.py"
    assert out[2] == "[]"
    (dist_info,) = _site_packages(venv).glob("trainjob_pipeline-*.dist-info")
    version = dist_info.name.removesuffix(".dist-info").split("-")[1]
    assert _run(python, "-I", "-m", "tjpipe", "--version", cwd=tmp_path).stdout.split() == ["tjpipe", version]
