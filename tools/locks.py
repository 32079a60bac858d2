"""Every Python environment the scripts make is installed from a hash-checked lock, never from pyproject.toml's ranges.

A range such as ``kubernetes>=33`` resolves to whatever was released last, so two fresh machines a day apart
would test different code, and a generated file that records a dependency's version (``contracts/kube.py``
records the Kubernetes client's) goes stale with no commit at all. Each lock below pins every package with the
sha256 of each of its files; ``scripts/bootstrap.sh`` installs one with ``pip --require-hashes`` and removes
whatever the lock does not name, so ``pip freeze`` of the environment is the lock. A dependency upgrade is then a
commit: ``bash scripts/lock.sh --upgrade`` (or ``--upgrade-package NAME``) makes the locks again, regenerates the
files that record a version, and the diff shows both.

Each lock's first line is the digest of the pyproject.toml requirements it was made from
(``tests/distribution/test_locks.py`` fails when they change without a new lock), and the locks that share
packages agree on their versions: the test environment is made with the image's runtime lock and the
documentation lock as constraints, so the tests run the versions the image ships.

    python tools/locks.py digest LOCK        # the inputs' digest line of one lock
    python tools/locks.py stamp LOCK         # put that line (and the lock's purpose) at the top of LOCK
    python tools/locks.py sync LOCK PYTHON   # uninstall from PYTHON's environment what LOCK does not pin
    python tools/locks.py for-extras EXTRAS  # the lock that scripts/bootstrap.sh installs for EXTRAS
    python tools/locks.py make LOCK PIP_COMPILE [OPTIONS]   # make one lock (scripts/lock.sh, in LOCKS' order)
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DIGEST_PREFIX = "# inputs sha256: "


@dataclass(frozen=True)
class Lock:
    path: str
    extras: tuple[str, ...]
    """pyproject.toml's optional-dependency groups the lock resolves."""
    runtime: bool
    """Whether ``[project.dependencies]`` are resolved with them."""
    constraints: tuple[str, ...]
    """Locks whose versions this one keeps (made first, passed to pip-compile as constraints)."""
    purpose: str


LOCKS: tuple[Lock, ...] = (
    Lock("requirements.lock", (), True, (), "the image's runtime (the Dockerfile installs it)"),
    Lock("requirements-docs.lock", ("docs",), False, (), "the documentation site's tools (.venv-docs)"),
    Lock(
        "requirements-test.lock",
        ("test",),
        True,
        ("requirements.lock", "requirements-docs.lock"),
        "the test environment (.venv, scripts/test.sh and .ci/run)",
    ),
    Lock("requirements-local.lock", ("local",), True, ("requirements.lock",), "the local stack (.venv, scripts/up.sh)"),
    Lock(
        "requirements-sdk.lock",
        ("test", "sdk"),
        True,
        ("requirements-docs.lock",),
        "the Kubeflow SDK's tests (.venv-sdk; kubeflow 0.5.0 needs kubernetes<36, so not the runtime's versions)",
    ),
)
BY_PATH = {lock.path: lock for lock in LOCKS}


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirements(lock: Lock) -> list[str]:
    """The pyproject.toml requirement strings the lock is made from, in a stable order."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    wanted = list(project["dependencies"]) if lock.runtime else []
    for extra in lock.extras:
        wanted += project["optional-dependencies"][extra]
    return sorted(set(wanted))


def digest(lock: Lock) -> str:
    payload = json.dumps({"requirements": requirements(lock), "constraints": list(lock.constraints)})
    return hashlib.sha256(payload.encode()).hexdigest()


def pins(path: Path) -> dict[str, tuple[str, list[str]]]:
    """A lock as {canonical name: (version, sha256 hashes)}; anything but ``name==version`` is refused."""
    text = re.sub(r"\\\n", " ", path.read_text())
    out: dict[str, tuple[str, list[str]]] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        requirement, *hashes = line.split()
        name, sep, version = requirement.partition("==")
        if not sep:
            raise ValueError(f"{path.name}: {requirement!r} is not pinned as name==version")
        out[_canonical(name)] = (version, [h.removeprefix("--hash=sha256:") for h in hashes])
    return out


def recorded_digest(path: Path) -> str | None:
    first = path.read_text().splitlines()[:1]
    return first[0].removeprefix(DIGEST_PREFIX) if first and first[0].startswith(DIGEST_PREFIX) else None


def stamp(lock: Lock) -> None:
    """Replace whatever stands above pip-compile's own header with the digest line and the lock's purpose."""
    path = REPO / lock.path
    body = path.read_text().splitlines(keepends=True)
    start = next(i for i, line in enumerate(body) if line.startswith("# This file is autogenerated by pip-compile"))
    header = [
        f"{DIGEST_PREFIX}{digest(lock)}\n",
        f"# {lock.purpose}: every package pinned with the sha256 of each of its files.\n",
        "# Made by `bash scripts/lock.sh` (tools/locks.py says why); never edit it by hand.\n",
        "#\n",
    ]
    path.write_text("".join(header + body[start:]))


def installed(python: str) -> dict[str, str]:
    """The environment's distributions but the editable project, as ``pip freeze`` lists them."""
    out = subprocess.run(
        [python, "-m", "pip", "freeze", "--exclude-editable", "--disable-pip-version-check"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    found: dict[str, str] = {}
    for line in out.splitlines():
        name, sep, version = line.partition("==")
        if sep:
            found[_canonical(name)] = version
    return found


def sync(lock: Lock, python: str) -> list[str]:
    """Uninstall every distribution the lock does not pin (left by an older lock); returns their names."""
    extra = sorted(set(installed(python)) - set(pins(REPO / lock.path)))
    if extra:
        subprocess.run([python, "-m", "pip", "uninstall", "-q", "-y", *extra], check=True)
    return extra


def for_extras(extras: str) -> Lock:
    """The lock made for exactly these extras, else the smallest that holds them all (``sdk`` alone: the SDK's)."""
    wanted = {e for e in extras.split(",") if e}
    fits = [lock for lock in LOCKS if lock.runtime and wanted <= set(lock.extras)]
    if not fits:
        raise SystemExit(f"no lock is made for the extras {extras!r}: add one to tools/locks.py's LOCKS")
    return min(fits, key=lambda lock: (set(lock.extras) != wanted, len(lock.extras)))


def make(lock: Lock, pip_compile: str, options: list[str]) -> None:
    """Run pip-compile for one lock (its constraints made before it), then stamp it."""
    command = [pip_compile, "-q", "--allow-unsafe", "--generate-hashes", "--no-emit-index-url"]
    command += ["--no-emit-find-links", "--strip-extras", f"--output-file={lock.path}", *options]
    command += [f"--constraint={constraint}" for constraint in lock.constraints]
    source = None
    if lock.runtime:
        command += [f"--extra={extra}" for extra in lock.extras] + ["pyproject.toml"]
    else:  # only the extras' own packages: pyproject.toml as input would bring the runtime's too
        command += ["-"]
        source = "".join(f"{requirement}\n" for requirement in requirements(lock))
    subprocess.run(command, cwd=REPO, input=source, text=True, check=True)
    stamp(lock)


def main(argv: list[str]) -> int:
    command, *args = argv
    if command == "digest":
        print(f"{DIGEST_PREFIX}{digest(BY_PATH[args[0]])}")
    elif command == "stamp":
        stamp(BY_PATH[args[0]])
    elif command == "sync":
        for name in sync(BY_PATH[args[0]], args[1]):
            print(f"· removed {name}: not in {args[0]}")
    elif command == "for-extras":
        print(for_extras(args[0]).path)
    elif command == "make":
        make(BY_PATH[args[0]], args[1], args[2:])
    elif command == "order":
        print(" ".join(lock.path for lock in LOCKS))
    else:
        raise SystemExit(f"unknown command {command!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
