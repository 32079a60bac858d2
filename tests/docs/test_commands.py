"""The commands the getting-started and operating pages tell a user to paste, run against a real local stack.

Every shell block of those pages is either run here, in page order, in one fresh folder (so ``.tjpipe``
is the test's own, never the developer's), or marked ``<!-- not run: REASON -->`` right above it; a block
with neither fails ``test_every_block_is_run_or_says_why_not``. The first block starts the stack
(``tjpipe up --demo --detach``); the block marked ``<!-- run: last -->`` (``tjpipe down``) runs last even when
an earlier block failed, and the stack's processes are then checked to be gone.

Each block is run as the user would paste it: ``bash -e`` in the folder, the project's environment first on
``PATH``, ``NATS_URL`` and ``KUBECONFIG`` removed (a block that needs them sources ``.tjpipe/env``, as the
page says). The demo TrainJob is created before ``up`` returns, so its history exists for the blocks after
it. Bounded: each block has a timeout, and the whole run is a few minutes once the Go binaries are built.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tjpipe.local import toolchain

from .support import Block, blocks

PAGES = ("getting-started.md", "operating.md")
BIN = Path(sys.executable).parent
# The blocks' own timeouts are for the stack, not for compiling: on a cold machine the fixture first waits for
# the simulated cluster's Go binaries, which CI builds beside this test, and the module's timeout covers that wait.
pytestmark = [pytest.mark.cluster, pytest.mark.nats, pytest.mark.timeout(2400)]


def _runnable() -> tuple[list[Block], list[Block]]:
    every = [b for page in PAGES for b in blocks(page)]
    return [b for b in every if b.marker == ""], [b for b in every if b.marker == "run"]


def test_every_block_is_run_or_says_why_not() -> None:
    for block in (b for page in PAGES for b in blocks(page)):
        where = f"docs/{block.page}:{block.line}"
        if block.marker == "not run":
            assert block.note, f"{where}: say why it is not run"
        elif block.marker == "run":
            assert block.note == "last", f"{where}: the one run marker is 'run: last'"
        else:
            assert block.info != "console", f"{where}: a transcript cannot be run; mark it not run, with a reason"
    first, last = _runnable()
    commands = " ".join(b.text for b in [*first, *last])
    for command in ("up", "history", "replay", "plan", "dlq", "history-server", "down"):
        assert f"tjpipe {command} " in commands or f"tjpipe {command}\n" in commands, command


def _run(block: Block, cwd: Path, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    proc = subprocess.Popen(
        ["bash", "-e", "-o", "pipefail", "-c", block.text],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        # A block's background job (the history server) goes with it, however the block ended. The stack
        # itself is not in this group: `tjpipe up --detach` starts its processes in sessions of their own.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 15)
        proc.wait()
    return subprocess.CompletedProcess(block.text, proc.returncode, out, err)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, str]]]:
    cwd = tmp_path_factory.mktemp("docs-commands")
    env = {k: v for k, v in os.environ.items() if k not in ("NATS_URL", "KUBECONFIG", "NATS_CREDS")}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    for ensure in (toolchain.ensure_kube_binaries, toolchain.ensure_jobset_manager, toolchain.ensure_cluster_binaries):
        ensure(progress=lambda _line: None)
    yield cwd, env
    _, last = _runnable()
    for block in last:
        done = _run(block, cwd, env, timeout=120)
        assert done.returncode == 0, f"docs/{block.page}:{block.line}\n{done.stdout}\n{done.stderr}"
    assert not list((cwd / ".tjpipe" / "logs").glob("*.pid")), "tjpipe down left processes running"


def test_the_pages_commands_run_on_the_local_stack(folder: tuple[Path, dict[str, str]]) -> None:
    cwd, env = folder
    first, _ = _runnable()
    assert "tjpipe up" in first[0].text, "the first block run must start the stack"
    for block in first:
        done = _run(block, cwd, env, timeout=600 if "tjpipe up" in block.text else 120)
        where = f"docs/{block.page}:{block.line}"
        assert done.returncode == 0, f"{where} failed ({done.returncode}):\n{block.text}\n{done.stdout}\n{done.stderr}"
        if "tjpipe history tjpipe-demo/mnist" in block.text:
            assert "mnist" in done.stdout, done.stdout
    history = (cwd / "mnist-history.json").read_text()
    assert '"event"' in history or "event" in history, history[:500]
