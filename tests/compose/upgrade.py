"""The release a rolling upgrade starts from, and that release's code and image, made from git here.

Why one place: the wire-compatibility unit test (tests/unit/test_contracts_wire_compat.py) and the rolling upgrade on
the compose stack (test_rolling_upgrade.py) must start from the same release, or one would prove
compatibility with a version the other never ran. There are no release tags; the previous release is
the last commit of the session before the one that added ``wire_version`` to the messages.

Why from ``git archive``: the old image is built from that commit's own files and its own Dockerfile, as
a release pipeline would have built it then, not from today's files with an old label.
"""

from __future__ import annotations

import subprocess
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]

PREVIOUS_RELEASE = "1ccf0d43c6625a0088038fae7d5a159413d67062"
"""The previous release: README "what CI installs and runs", the end of the session before wire versions.
Its events and apply messages carry no ``wire_version`` (they decode as ``UNVERSIONED``)."""

WATCHER_WITHOUT_IMMUTABLE_FIELDS = "59fa278e2ab2043d4285a2fa91daca0b31494cc9"  # e7131db's parent
"""The last commit whose watcher kept none of the JobSet spec fields JobSet keeps as created (an
event of that watcher lacks what a newer planner reads). Too old to run on today's compose stack, so
only its encoder is used (in the unit test). Both are full names: a shallow clone can fetch a commit by its
full name only (``commit_problem``)."""

OLD_RELEASE_IMAGE = "trainjob-pipeline:previous-release"
CURRENT_IMAGE = "trainjob-pipeline:upgrade-current"


def _has_commit(commit: str) -> bool:
    found = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}"],
        capture_output=True,
        text=True,
        check=False,
    )
    return found.returncode == 0


def commit_problem(commit: str) -> str | None:
    """Why ``commit`` cannot be read from this checkout, or None.

    A shallow clone (as CI makes) lacks it: then it is fetched from ``origin``, that one commit alone, so
    the tests do not depend on how deep the clone is. Only a checkout with no way to fetch it has a problem.
    """
    if _has_commit(commit):
        return None
    fetched = subprocess.run(
        ["git", "-C", str(REPO), "fetch", "--quiet", "--no-tags", "--depth=1", "origin", commit],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    if _has_commit(commit):
        return None
    why = (fetched.stderr or fetched.stdout).strip().splitlines()[:1] or ["no output"]
    return f"commit {commit} is not in this checkout and could not be fetched from origin ({why[0]})"


def archive(commit: str, dest: Path, *paths: str) -> Path:
    """The files of ``commit`` (all, or ``paths``) under ``dest``, symbolic links included."""
    dest.mkdir(parents=True, exist_ok=True)
    produced = subprocess.run(
        ["git", "-C", str(REPO), "archive", "--format=tar", commit, *paths],
        capture_output=True,
        check=True,
        timeout=120,
    )
    with tempfile.TemporaryFile() as handle:
        handle.write(produced.stdout)
        handle.seek(0)
        with tarfile.open(fileobj=handle) as tar:
            tar.extractall(dest, filter="tar")
    return dest


def build_release_image(commit: str | None, tag: str, *, base_image: str) -> float:
    """``tag``: the runtime image of ``commit`` (None: this checkout as it is), built from its own Dockerfile
    on the offline Debian base. Returns the seconds taken; Docker's layer cache makes a rebuild seconds.

    This checkout gets a tag of its own rather than the compose file's ``trainjob-pipeline:dev``, which
    another run on the same engine may build from other files meanwhile."""
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="tjpipe-release-") as scratch:
        context = REPO if commit is None else archive(commit, Path(scratch) / "src")
        built = subprocess.run(
            [
                "docker",
                "build",
                "--quiet",
                "--network",
                "host",
                "--build-arg",
                f"PYTHON_IMAGE={base_image}",
                "--target",
                "runtime",
                "--label",
                f"tjpipe.release={commit or 'checkout'}",
                "-t",
                tag,
                str(context),
            ],
            capture_output=True,
            text=True,
            check=False,
            timeout=900,
        )
    if built.returncode != 0:
        raise AssertionError(
            f"docker build of {commit or 'this checkout'} failed ({built.returncode}):\n{built.stderr[-4000:]}"
        )
    return time.monotonic() - started


def missing_from(old: Any, new: Any, path: str = "") -> list[str]:
    """Paths of what ``old`` holds that ``new`` does not hold alike; ``new`` may hold more (an added field,
    a server default). Lists are compared item by item."""
    if isinstance(old, dict):
        if not isinstance(new, dict):
            return [path or "."]
        return [p for key, value in old.items() for p in missing_from(value, new.get(key, _ABSENT), f"{path}.{key}")]
    if isinstance(old, list):
        if not isinstance(new, list) or len(old) != len(new):
            return [path]
        return [p for i, (a, b) in enumerate(zip(old, new, strict=True)) for p in missing_from(a, b, f"{path}[{i}]")]
    return [] if old == new else [path]


_ABSENT = object()
