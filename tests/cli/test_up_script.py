"""``bash scripts/up.sh``, the README's first command: what it installs before it starts the stack.

The demo's training stand-in calls the Kubeflow SDK, which needs an older Kubernetes client than the project's;
the script must install it into ``.venv-sdk`` (where ``tjpipe.standin.sdk_python`` looks) before ``tjpipe up
--demo``, or a new user sees no training progress. The script runs here against a recording ``bootstrap.sh`` and
``tjpipe``: the order and arguments are the behaviour under test, the installs themselves are pip's.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

from tjpipe.standin import sdk_python

REPO = Path(__file__).resolve().parents[2]


def test_up_script_installs_the_sdk_environment_before_the_demo(tmp_path: Path) -> None:
    (tmp_path / "scripts").mkdir()
    shutil.copy(REPO / "scripts" / "up.sh", tmp_path / "scripts" / "up.sh")
    calls = tmp_path / "calls"
    (tmp_path / "scripts" / "bootstrap.sh").write_text(f'echo "bootstrap ${{TJPIPE_VENV:-.venv}} $1" >> {calls}\n')
    tjpipe = tmp_path / ".venv" / "bin" / "tjpipe"
    tjpipe.parent.mkdir(parents=True)
    tjpipe.write_text(f'#!/bin/sh\necho "tjpipe $*" >> {calls}\n')
    tjpipe.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "TJPIPE_VENV"}
    done = subprocess.run(
        ["bash", str(tmp_path / "scripts" / "up.sh"), "--detach"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert calls.read_text().splitlines() == [
        "bootstrap .venv local",
        f"bootstrap {tmp_path / '.venv-sdk'} sdk",
        "tjpipe up --demo --detach",
    ]


def test_up_script_with_a_real_node_builds_the_nodes_images_first(tmp_path: Path) -> None:
    (tmp_path / "scripts").mkdir()
    shutil.copy(REPO / "scripts" / "up.sh", tmp_path / "scripts" / "up.sh")
    calls = tmp_path / "calls"
    (tmp_path / "scripts" / "bootstrap.sh").write_text(f'echo "bootstrap $1" >> {calls}\n')
    (tmp_path / "scripts" / "node-images.sh").write_text(f'echo "node-images" >> {calls}\n')
    tjpipe = tmp_path / ".venv" / "bin" / "tjpipe"
    tjpipe.parent.mkdir(parents=True)
    tjpipe.write_text(f'#!/bin/sh\necho "tjpipe $*" >> {calls}\n')
    tjpipe.chmod(0o755)
    done = subprocess.run(
        ["bash", str(tmp_path / "scripts" / "up.sh"), "--real-node"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert calls.read_text().splitlines() == [
        "bootstrap local",
        "bootstrap sdk",
        "node-images",
        "tjpipe up --demo --real-node",
    ]


def test_the_demo_finds_the_sdk_in_the_checkouts_sdk_environment(tmp_path: Path) -> None:
    python = tmp_path / ".venv-sdk" / "bin" / "python"
    python.parent.mkdir(parents=True)
    # An interpreter that imports kubeflow.trainer, as far as the probe can tell: it exits 0.
    python.write_text("#!/bin/sh\nexit 0\n")
    python.chmod(0o755)
    # This interpreter comes first where it has the SDK itself (an environment made with the `sdk` extra).
    here = sys.executable if _imports_the_sdk() else None
    assert sdk_python(tmp_path) == (here or str(python))
    python.write_text("#!/bin/sh\nexit 1\n")
    assert sdk_python(tmp_path) == here


def _imports_the_sdk() -> bool:
    try:
        return importlib.util.find_spec("kubeflow.trainer") is not None
    except ModuleNotFoundError:
        return False


def test_a_real_node_that_cannot_start_says_why_in_one_sentence_and_starts_nothing(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "NATS_URL")}
    env["TJPIPE_CACHE_DIR"] = str(tmp_path / "empty-cache")  # no node images there
    done = subprocess.run(
        [sys.executable, "-m", "tjpipe", "up", "--real-node"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    said = (done.stdout + done.stderr).strip()
    if os.geteuid() == 0:
        assert said == (
            "the real node's images are not built yet (tjpipe.local/pause:1, tjpipe.local/trainer-demo:1): run bash "
            "scripts/node-images.sh (needs a running Docker engine and debootstrap)"
        )
    else:
        assert said.startswith("a real node needs root"), said
    assert "Traceback" not in said and len(said.splitlines()) == 1
    assert not (tmp_path / ".tjpipe").exists()
