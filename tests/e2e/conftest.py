"""One pipeline per test module: the three services as subprocesses on the session's servers."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import dynamic

from tjpipe.local.stack import Stack

from .support import stack_on_session_servers

RUNTIMES = ("torch-distributed", "deepspeed-distributed")


@pytest.fixture(scope="module")
def pipeline(
    kube: Any, nats_url: str, nats_credentials: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    with stack_on_session_servers(kube, nats_url, nats_credentials, tmp_path_factory, RUNTIMES) as stack:
        stack.start_services()
        yield stack


@pytest.fixture(scope="module")
def dyn(kube: Any) -> dynamic.DynamicClient:
    return dynamic.DynamicClient(kube.api_client())
