"""kustomize, built from its Go module once per machine and cached like kube-apiserver and etcd.

Why build it: the deploy manifests are plain kustomize, and the tests render them with the real kustomize
rather than an imitation; the Go module proxy and a Go toolchain are what a developer machine has for this
(see ``toolchain``). The binary lands in ``cache_root()/bin/kustomize-<version>/`` behind a file lock, so
concurrent test sessions build it once.

Why this version: v5.8.3 is the newest the proxy serves, but its go.mod asks for Go 1.27, which the project's
toolchain (Go 1.26) cannot build without fetching another toolchain. v5.8.2 is the newest that builds with
Go 1.26.

``GoTool`` and ``ensure_go_tool`` build any other command the same way (the tests build compose-go's
validator with it).
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tjpipe.local.toolchain import (
    _exclusive_file_lock,
    _fresh_build_dir,
    _go_build,
    _go_command,
    _is_executable,
    _run_go,
    cache_root,
)

KUSTOMIZE_MODULE = "sigs.k8s.io/kustomize/kustomize/v5"
KUSTOMIZE_VERSION = "v5.8.2"


@dataclass(frozen=True)
class GoTool:
    """A command built from ``package`` of ``module@version``, cached as ``bin/<name>-<version>/<name>``."""

    name: str
    module: str
    version: str
    package: str
    ldflags: str = "-s -w"


KUSTOMIZE = GoTool(
    name="kustomize",
    module=KUSTOMIZE_MODULE,
    version=KUSTOMIZE_VERSION,
    package=KUSTOMIZE_MODULE,
    ldflags=f"-s -w -X sigs.k8s.io/kustomize/api/provenance.version=kustomize/{KUSTOMIZE_VERSION}",
)


def go_tool_path(tool: GoTool) -> Path:
    return cache_root() / "bin" / f"{tool.name}-{tool.version}" / tool.name


def ensure_go_tool(tool: GoTool, *, progress: Callable[[str], None] = print) -> Path:
    """The cached binary of ``tool``, built from its Go module first if missing."""
    binary = go_tool_path(tool)
    if _is_executable(binary):
        return binary
    go = _go_command(missing=f"{tool.name} {tool.version} is not built yet")
    with _exclusive_file_lock(cache_root() / "bin" / f".{tool.name}.lock", progress=progress):
        if _is_executable(binary):  # built by another process while we waited
            return binary
        started = time.monotonic()
        progress(f"building {tool.name} {tool.version} from Go modules (first time only)…")
        module_dir = _fresh_build_dir(f"{tool.name}-{tool.version}")
        _run_go([go, "mod", "init", f"local/tjpipe-{tool.name}"], cwd=module_dir, progress=progress)
        _run_go([go, "get", f"{tool.module}@{tool.version}"], cwd=module_dir, progress=progress)
        _go_build(
            go=go, module_dir=module_dir, package=tool.package, ldflags=tool.ldflags, output=binary, progress=progress
        )
        shutil.rmtree(module_dir, ignore_errors=True)  # kept only when a step fails, for inspection
        progress(f"{tool.name} {tool.version} built in {time.monotonic() - started:.0f}s: {binary}")
    return binary


def ensure_kustomize(*, progress: Callable[[str], None] = print) -> Path:
    """The cached kustomize binary, built from ``sigs.k8s.io/kustomize/kustomize/v5`` if missing."""
    return ensure_go_tool(KUSTOMIZE, progress=progress)


def kustomize_build(directory: Path, *, progress: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """``kustomize build directory``, parsed into objects."""
    binary = ensure_kustomize(progress=progress)
    completed = subprocess.run(
        [str(binary), "build", str(directory)], capture_output=True, text=True, check=False, timeout=120
    )
    if completed.returncode != 0:
        raise RuntimeError(f"kustomize build {directory} failed:\n{completed.stderr.strip()}")
    return [document for document in yaml.safe_load_all(completed.stdout) if document]
