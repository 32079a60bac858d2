"""What a test does when something it needs is missing on this machine: skip here, fail in CI.

Why not always skip: the compose and container tests are the only coverage of the stack in containers, and
the browser tests the only coverage of the history pages in a browser; a CI machine where the Docker engine
did not start, or Chromium is missing, would otherwise pass with that coverage silently gone. `.ci/run` sets
`CI=true` (as CI services do); a developer's machine without Docker still gets a skip with the reason.
"""

from __future__ import annotations

import os
from typing import NoReturn

import pytest


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def unavailable(reason: str) -> NoReturn:
    """Skip the test with ``reason``, or fail it where ``CI=true``."""
    if in_ci():
        pytest.fail(f"{reason} (CI=true: a test that would skip here fails instead)", pytrace=False)
    pytest.skip(reason)
