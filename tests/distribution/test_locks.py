"""Every environment is the lock it was installed from, and every lock is what pyproject.toml asks for now.

``tools/locks.py`` says why nothing is installed from pyproject.toml's ranges. These tests hold the locks to it:
a requirement changed in pyproject.toml without ``bash scripts/lock.sh`` fails here, as does a lock whose versions
drift from the locks it is made with, and the test environment itself is compared with its lock package by
package (what ``pip freeze`` lists), so a fresh machine tests exactly what the last one did.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest
from packaging.requirements import Requirement

from contracts import kube

REPO = Path(__file__).resolve().parents[2]


def _load_locks() -> ModuleType:
    spec = importlib.util.spec_from_file_location("locks", REPO / "tools" / "locks.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["locks"] = module
    spec.loader.exec_module(module)
    return module


locks = _load_locks()
LOCKS = {lock.path: lock for lock in locks.LOCKS}


@pytest.mark.parametrize("path", sorted(LOCKS))
def test_the_lock_was_made_from_pyproject_as_it_is(path: str) -> None:
    lock = LOCKS[path]
    assert locks.recorded_digest(REPO / path) == locks.digest(lock), (
        f"{path} was made from other requirements than pyproject.toml's now: run `bash scripts/lock.sh` and "
        "commit the locks with the change"
    )


@pytest.mark.parametrize("path", sorted(LOCKS))
def test_every_requirement_is_met_by_its_pin_and_every_pin_has_hashes(path: str) -> None:
    pinned = locks.pins(REPO / path)
    for text in locks.requirements(LOCKS[path]):
        requirement = Requirement(text)
        name = re.sub(r"[-_.]+", "-", requirement.name).lower()
        assert name in pinned, f"{path}: {text} is required but not locked"
        assert requirement.specifier.contains(pinned[name][0], prereleases=True), f"{path}: {text} vs {pinned[name]}"
    for name, (_version, hashes) in pinned.items():
        assert hashes and all(re.fullmatch(r"[0-9a-f]{64}", h) for h in hashes), f"{path}: {name} has no sha256"


@pytest.mark.parametrize("path", sorted(path for path, lock in LOCKS.items() if lock.constraints))
def test_a_lock_keeps_the_versions_of_the_locks_it_is_made_with(path: str) -> None:
    pinned = locks.pins(REPO / path)
    for constraint in LOCKS[path].constraints:
        for name, (version, _) in locks.pins(REPO / constraint).items():
            if name in pinned:
                assert pinned[name][0] == version, f"{path} has {name}=={pinned[name][0]}, {constraint} {version}"


def test_each_script_installs_the_lock_made_for_its_extras() -> None:
    assert locks.for_extras("test").path == "requirements-test.lock"
    assert locks.for_extras("local").path == "requirements-local.lock"
    assert locks.for_extras("test,sdk").path == "requirements-sdk.lock"
    assert locks.for_extras("sdk").path == "requirements-sdk.lock"
    bootstrap = (REPO / "scripts" / "bootstrap.sh").read_text()
    assert "--require-hashes" in bootstrap and 'tools/locks.py" sync' in bootstrap


def test_the_generated_wire_types_record_the_locked_kubernetes_client() -> None:
    version, _ = locks.pins(REPO / "requirements-test.lock")["kubernetes"]
    assert version == kube.KUBERNETES_CLIENT_VERSION, (
        f"contracts/kube.py was generated with kubernetes {kube.KUBERNETES_CLIENT_VERSION}, the lock has {version}: "
        "`bash scripts/lock.sh` regenerates it"
    )


def test_this_environment_is_its_lock() -> None:
    venv = REPO / ".venv"
    if Path(sys.prefix).resolve() != venv.resolve():
        pytest.skip(f"not the test environment scripts/bootstrap.sh makes ({venv}), but {sys.prefix}")
    installed = locks.installed(sys.executable)
    pinned = {name: version for name, (version, _) in locks.pins(REPO / "requirements-test.lock").items()}
    assert installed == pinned, {
        "installed, not locked": sorted(set(installed) - set(pinned)),
        "locked, not installed": sorted(set(pinned) - set(installed)),
        "other version": sorted(n for n in set(installed) & set(pinned) if installed[n] != pinned[n]),
    }
