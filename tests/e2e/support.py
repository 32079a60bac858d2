"""Small waits and reads shared by the end-to-end tests."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from faults.support import condition_of as condition_of  # shared with the fault tests
from kubernetes import dynamic

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
