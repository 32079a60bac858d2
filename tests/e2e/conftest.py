"""One pipeline per test module: the three services as subprocesses on the session's servers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import dynamic

from tjpipe.stack import Stack, StatePaths

RUNTIMES = ("torch-distributed", "deepspeed-distributed")


@pytest.fixture(scope="module")
def pipeline(
    kube: Any, nats_url: str, nats_credentials: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    stack = Stack(paths=StatePaths(tmp_path_factory.mktemp("stack")), progress=lambda _: None)
    stack.start_infrastructure(
        nats_url=nats_url, kubeconfig=Path(kube.kubeconfig), install_crds=False, credentials=nats_credentials
    )
    if kube.local is not None:
        stack.use_own_identities()  # as tjpipe up runs them: each service as its own ServiceAccount
    for name in RUNTIMES:
        stack.install_runtime(name)
    stack.start_services()
    yield stack
    logs = {p.name: p.log_tail() for p in stack.services}
    stack.stop()
    for process_name, tail in logs.items():
        print(f"--- {process_name} ---\n{tail}")


@pytest.fixture(scope="module")
def dyn(kube: Any) -> dynamic.DynamicClient:
    return dynamic.DynamicClient(kube.api_client())
