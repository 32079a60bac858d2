"""What the real node's tests share: the machine check and the node's images, built once per run.

Where the machine cannot run a node (not root, no Docker engine for the images, a missing command) a test that
asks for ``node_images`` skips with the reason, and fails where ``CI=true`` (``tests/needs.py``).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from needs import unavailable

from tjpipe.local import realnode

REPO = Path(__file__).resolve().parents[2]


def _build(*args: str) -> None:
    try:
        realnode.preflight(images=False)
    except realnode.NodeUnavailable as exc:
        unavailable(str(exc))
    engine = subprocess.run(["docker", "info"], capture_output=True, check=False) if shutil.which("docker") else None
    if engine is None or engine.returncode != 0:
        unavailable("the real node's images are built with Docker, and no Docker engine answers `docker info`")
    built = subprocess.run(
        [sys.executable, str(REPO / "tools" / "node_images.py"), *args], capture_output=True, text=True, check=False
    )
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]


@pytest.fixture(scope="session")
def node_images() -> None:
    """The node's images (tools/node_images.py; cached, so a warm run takes seconds)."""
    _build()


@pytest.fixture(scope="session")
def pipeline_images(node_images: None) -> None:
    """The node's images and the pipeline's own (the project's runtime image, NATS), as archives to load."""
    _build("--pipeline")
