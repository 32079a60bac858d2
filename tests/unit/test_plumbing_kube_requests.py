"""``plumbing.kube.KubeClient``'s typed requests without a server: what each sends, and what it reads back."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping

from contracts import resources
from plumbing.kube import MERGE_PATCH, KubeClient, Response


class Recording(KubeClient):
    """Records each request and answers it with ``answer``."""

    def __init__(self, answer: bytes) -> None:  # no connection: only ``request`` is used
        self.answer = answer
        self.sent: list[tuple[str, str, dict[str, str], bytes | None, str | None]] = []

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        body: bytes | None = None,
        content_type: str | None = None,
        timeout: float | None = None,
        accept: str | None = None,
    ) -> Response:
        self.sent.append((method, path, dict(params or {}), body, content_type))
        return Response(status=200, body=self.answer)


def test_a_merge_patch_is_sent_under_its_field_manager() -> None:
    kube = Recording(b'{"metadata": {"resourceVersion": "7"}}')
    patch = b'{"metadata": {"labels": {"a": "b"}}}'
    resp = asyncio.run(
        kube.merge_patch(resources.CONFIG_MAP, namespace="ns", name="cm", body=patch, field_manager="labeller")
    )
    assert kube.sent == [
        ("PATCH", "/api/v1/namespaces/ns/configmaps/cm", {"fieldManager": "labeller"}, patch, MERGE_PATCH)
    ]
    assert resp.body == kube.answer


def test_the_current_revision_is_a_one_item_lists_resource_version() -> None:
    answer = {"kind": "ConfigMapList", "metadata": {"resourceVersion": "42"}, "items": [{"metadata": {"name": "a"}}]}
    kube = Recording(json.dumps(answer).encode())
    assert asyncio.run(kube.list_revision(resources.CONFIG_MAP, namespace="ns")) == "42"
    assert asyncio.run(kube.list_revision(resources.CONFIG_MAP)) == "42"
    assert [(method, path, params) for method, path, params, _, _ in kube.sent] == [
        ("GET", "/api/v1/namespaces/ns/configmaps", {"limit": "1"}),
        ("GET", "/api/v1/configmaps", {"limit": "1"}),
    ]
