"""Small waits and reads shared by the end-to-end tests."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from faults.support import condition_of as condition_of  # shared with the fault tests
from kubernetes import dynamic

from tjpipe.local.stack import Stack, StatePaths

TRAINER = "trainer.kubeflow.org/v1alpha1"


def eventually(check: Callable[[], Any], *, timeout: float = 30.0, what: str) -> Any:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = check()
            if value:
                return value
        except Exception as exc:  # not there yet
            last = exc
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}" + (f": {last}" if last else ""))


def get(dyn: dynamic.DynamicClient, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any]:
    obj: dict[str, Any] = (
        dyn.resources.get(api_version=api_version, kind=kind).get(namespace=namespace, name=name).to_dict()
    )
    return obj


def create(dyn: dynamic.DynamicClient, body: dict[str, Any]) -> dict[str, Any]:
    res = dyn.resources.get(api_version=body["apiVersion"], kind=body["kind"])
    created: dict[str, Any] = res.create(body=body, namespace=body["metadata"]["namespace"]).to_dict()
    return created


@contextlib.contextmanager
def stack_on_session_servers(
    kube: Any, nats_url: str, nats_credentials: Any, tmp_path_factory: pytest.TempPathFactory, runtimes: Sequence[str]
) -> Iterator[Stack]:
    """A Stack on the session's nats-server and kube-apiserver with these runtimes; its services are the
    caller's to start. On the way out the services stop and each one's log tail is printed."""
    stack = Stack(paths=StatePaths(tmp_path_factory.mktemp("stack")), progress=lambda _: None)
    stack.start_infrastructure(
        nats_url=nats_url, kubeconfig=Path(kube.kubeconfig), install_crds=False, credentials=nats_credentials
    )
    if kube.local is not None:
        stack.use_own_identities()  # as tjpipe up runs them: each service as its own ServiceAccount
    for name in runtimes:
        stack.install_runtime(name)
    try:
        yield stack
    finally:
        logs = {p.name: p.log_tail() for p in stack.services}
        stack.stop()
        for process_name, tail in logs.items():
            print(f"--- {process_name} ---\n{tail}")
