"""helm, built from its Go module once per machine and cached like kustomize.

Why build it: the Kubeflow install path ships a Helm chart (``tjpipe kubeflow-chart``), and its tests render
it with the real ``helm template`` rather than an imitation; a Go toolchain and the module proxy are what a
developer machine has for this (see ``toolchain``). It goes through the same wrapper-module build as
kustomize (``kustomize.ensure_go_tool``): its own lock, its own cache folder.

Why these stamps: helm's Makefile stamps the release into ``internal/version`` and the Kubernetes minor its
client-go pins into ``chartutil`` (the ``.Capabilities.KubeVersion`` of ``helm template``); without the
second, an unstamped build claims Kubernetes 1.20. v3.22.0 pins client-go v0.37.0, hence 1.37.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

from tjpipe.local.kustomize import GoTool, ensure_go_tool, go_tool_path

HELM_MODULE = "helm.sh/helm/v3"
HELM_VERSION = "v3.22.0"
_HELM_KUBERNETES_MINOR = "37"  # client-go v0.37.0 in helm v3.22.0's go.mod

HELM = GoTool(
    name="helm",
    module=HELM_MODULE,
    version=HELM_VERSION,
    package=f"{HELM_MODULE}/cmd/helm",
    ldflags=" ".join(
        [
            "-s -w",
            f"-X {HELM_MODULE}/internal/version.version={HELM_VERSION}",
            f"-X {HELM_MODULE}/internal/version.gitTreeState=clean",
            *(
                f"-X {HELM_MODULE}/pkg/{package}.k8sVersion{part}={value}"
                for package in ("lint/rules", "chartutil")
                for part, value in (("Major", "1"), ("Minor", _HELM_KUBERNETES_MINOR))
            ),
        ]
    ),
)


def helm_path() -> Path:
    return go_tool_path(HELM)


def ensure_helm(*, progress: Callable[[str], None] = print) -> Path:
    """The cached helm binary, built from ``helm.sh/helm/v3/cmd/helm`` if missing."""
    return ensure_go_tool(HELM, progress=progress)


def run_helm(*args: str, progress: Callable[[str], None] = print) -> str:
    """Run helm with ``args`` and return its output; a failure raises with helm's own message."""
    binary = ensure_helm(progress=progress)
    with tempfile.TemporaryDirectory(prefix="tjpipe-helm-") as scratch:
        # Not the caller's repositories, plugins or cache: rendering a local chart needs none of them.
        homes = {f"HELM_{kind}_HOME": str(Path(scratch) / kind.lower()) for kind in ("CACHE", "CONFIG", "DATA")}
        completed = subprocess.run(
            [str(binary), *args], capture_output=True, text=True, check=False, timeout=120, env={**os.environ, **homes}
        )
    if completed.returncode != 0:
        raise RuntimeError(f"helm {' '.join(args[:2])} failed:\n{(completed.stderr or completed.stdout).strip()}")
    return completed.stdout


def helm_template(
    chart: Path,
    *,
    release: str,
    namespace: str,
    extra_args: Sequence[str] = (),
    progress: Callable[[str], None] = print,
) -> list[dict[str, Any]]:
    """``helm template`` of a chart directory (its ``crds/`` included), parsed into objects."""
    rendered = run_helm(
        "template", release, str(chart), "--namespace", namespace, "--include-crds", *extra_args, progress=progress
    )
    return [document for document in yaml.safe_load_all(rendered) if document]
