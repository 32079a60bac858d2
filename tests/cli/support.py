"""Running ``tjpipe`` as a user does: a subprocess with a chosen environment, stdout and stderr apart."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

TRAINER = "trainer.kubeflow.org/v1alpha1"

SDK_COMMAND = ["bash", "-c", 'x = batch[i]\nopen("[/opt/x]")  # :smile: [bold]not bold[/bold]\n']
"""A container command as the Kubeflow SDK writes one: a function's source, with brackets rich would eat."""


def tjpipe(
    *args: str,
    env: Mapping[str, str] | None = None,
    stdin: str | None = None,
    cwd: Path | None = None,
    timeout: float = 60,
) -> subprocess.CompletedProcess[str]:
    """``python -m tjpipe ARGS`` with no NATS, kube or tjpipe variable from the caller's environment."""
    clean = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("NATS_", "TJPIPE_")) and k not in ("KUBECONFIG", "COLUMNS", "LINES")
    }
    clean.update({"COLUMNS": "250", "HOME": str(cwd or Path.cwd()), **(env or {})})
    return subprocess.run(
        [sys.executable, "-m", "tjpipe", *args],
        env=clean,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        check=False,
    )


def closed_port() -> int:
    """A loopback port nothing listens on: bound, then released."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def trainjob(name: str, namespace: str | None, runtime: str) -> dict[str, object]:
    metadata: dict[str, object] = {"name": name}
    if namespace is not None:
        metadata["namespace"] = namespace
    return {
        "apiVersion": TRAINER,
        "kind": "TrainJob",
        "metadata": metadata,
        "spec": {"runtimeRef": {"name": runtime}, "trainer": {"numNodes": 1, "command": SDK_COMMAND}},
    }


def runtime(name: str) -> dict[str, object]:
    """A one-node ClusterTrainingRuntime with a plain container, the smallest a plan can be made from."""
    return {
        "apiVersion": TRAINER,
        "kind": "ClusterTrainingRuntime",
        "metadata": {"name": name, "labels": {"trainer.kubeflow.org/framework": "torch"}},
        "spec": {
            "mlPolicy": {"numNodes": 1},
            "template": {
                "spec": {
                    "replicatedJobs": [
                        {
                            "name": "node",
                            "template": {
                                "metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}},
                                "spec": {"template": {"spec": {"containers": [{"name": "node", "image": "busybox"}]}}},
                            },
                        }
                    ]
                }
            },
        },
    }
