"""What ``pip install trainjob-pipeline`` puts into an environment: one import name, ``tjpipe``, and nothing generic.

The repository keeps its top-level folders (``contracts/``, ``planner/``, ...); ``tjpipe/<name>`` links to
them. These tests build the wheel as the Dockerfile does (``pip wheel --no-deps``), install it without its
dependencies into a fresh virtual environment, and read what it claims from the installed ``RECORD``.
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
SUBPACKAGES = ("contracts", "planner", "watcher", "applier", "plumbing")
GENERIC_NAMES = {*SUBPACKAGES, "bench", "tests", "tools", "compose", "deploy", "scripts"}


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


def test_the_wheel_holds_every_module_under_tjpipe_and_nothing_else(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    assert {name.split("/")[0] for name in names if ".dist-info/" not in name} == {"tjpipe"}
    packed = {name for name in names if name.endswith(".py")}
    for sub in SUBPACKAGES:
        # Every file of the top-level folder, reached through the tjpipe/<sub> link.
        in_repo = {f"tjpipe/{p.relative_to(REPO).as_posix()}" for p in (REPO / sub).rglob("*.py")}
        assert in_repo and in_repo <= packed, sorted(in_repo - packed)
    assert "tjpipe/planner/core.py" in packed and any(n.startswith("tjpipe/planner/plugins/") for n in packed)
    assert not [name for name in names if name.startswith("tjpipe/bench") or "/tests/" in name]
    assert any(name.endswith(".dist-info/licenses/LICENSE") for name in names)


def test_pip_install_claims_only_the_tjpipe_import_name(venv: Path) -> None:
    site = _site_packages(venv)
    (dist_info,) = site.glob("trainjob_pipeline-*.dist-info")
    with (dist_info / "RECORD").open() as record:
        paths = [row[0] for row in csv.reader(record) if row]
    installed = {p.split("/")[0] for p in paths if not p.startswith("..")}
    top_level = {name.removesuffix(".py") for name in installed if not name.endswith(".dist-info")}
    assert top_level == {"tjpipe"}
    assert not GENERIC_NAMES & top_level
    scripts = {Path(p).name for p in paths if p.startswith("..")}
    assert scripts == {"tjpipe"}
    # Nothing else on disk either: the links were resolved into real files, not copied as links.
    assert not [p for p in (site / "tjpipe").rglob("*") if p.is_symlink()]


def test_the_installed_package_imports_from_outside_the_repository(venv: Path, tmp_path: Path) -> None:
    """``import tjpipe.planner.core`` from another folder finds the installed files; bare names are gone.

    The dependencies (msgspec, ...) come from this interpreter's site-packages, added after the fresh
    environment's own (a ``.pth`` line adds a folder without running the ``.pth`` files in it, so this
    project's editable install there stays off).
    """
    deps = sysconfig.get_paths()["purelib"]
    (_site_packages(venv) / "zz_dependencies.pth").write_text(deps + "\n")
    python = venv / "bin" / "python"
    probe = (
        "import importlib.util, tjpipe, tjpipe.planner.core, tjpipe.contracts.messages; "
        "print(tjpipe.__file__); print(tjpipe.planner.core.__file__); "
        f"print(sorted(n for n in {sorted(GENERIC_NAMES)!r} if importlib.util.find_spec(n)))"
    )
    out = _run(python, "-I", "-c", probe, cwd=tmp_path).stdout.splitlines()
    site = str(_site_packages(venv))
    assert out[0].startswith(site) and out[1] == f"{site}/tjpipe/planner/core.py"
    assert out[2] == "[]"
    (dist_info,) = _site_packages(venv).glob("trainjob_pipeline-*.dist-info")
    version = dist_info.name.removesuffix(".dist-info").split("-")[1]
    assert _run(python, "-I", "-m", "tjpipe", "--version", cwd=tmp_path).stdout.split() == ["tjpipe", version]
