"""``plumbing.informer`` without a server: paged lists, what a relist reports, and the compact cache."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import msgspec

from contracts import resources
from contracts.jobset import JobSet
from contracts.kube import ConfigMap
from contracts.values import meta, name_of
from plumbing.informer import Cached, Informer, Key
from plumbing.kube import METADATA_LIST_ACCEPT, KubeClient, Response

Obj = dict[str, Any]


def config_map(name: str, rv: str, *, data: Obj | None = None) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": f"uid-{name}",
            "resourceVersion": rv,
            "managedFields": [{"manager": "someone", "operation": "Apply"}],
        },
        "data": data or {"k": name},
    }


class PagedLists(KubeClient):
    """Answers list requests from ``objects`` in pages of ``limit``, as the API server does."""

    def __init__(self, objects: list[Obj], rv: str) -> None:  # no connection: only ``request`` is used
        self.objects = objects
        self.rv = rv
        self.requests: list[Mapping[str, str]] = []
        self.accepts: list[str | None] = []

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
        assert method == "GET" and path == "/api/v1/namespaces/ns/configmaps"
        params = params or {}
        self.requests.append(dict(params))
        self.accepts.append(accept)
        start = int(params.get("continue", "0"))
        limit = int(params["limit"])
        end = start + limit
        metadata: Obj = {"resourceVersion": self.rv}
        if end < len(self.objects):
            metadata["continue"] = str(end)
        answer = {"kind": "ConfigMapList", "metadata": metadata, "items": self.objects[start:end]}
        return Response(status=200, body=json.dumps(answer).encode())


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Key, str]] = []

    async def __call__(self, kind: str, key: Key, cached: Cached[ConfigMap] | None) -> None:
        assert cached is not None
        self.calls.append((kind, key, cached.resource_version))


def informer(server: PagedLists, handler: Recorder, **kwargs: Any) -> Informer[ConfigMap]:
    return Informer(server, resources.CONFIG_MAP, ConfigMap, handler, namespace="ns", page_size=2, **kwargs)


async def test_a_list_is_read_in_pages_of_one_snapshot() -> None:
    server = PagedLists([config_map(f"cm-{i}", str(10 + i)) for i in range(5)], rv="99")
    handler = Recorder()
    inf = informer(server, handler)
    assert await inf._list() == "99"
    assert server.requests == [{"limit": "2"}, {"limit": "2", "continue": "2"}, {"limit": "2", "continue": "4"}]
    assert sorted(inf.cache) == [("ns", f"cm-{i}") for i in range(5)]
    assert [c[0] for c in handler.calls] == ["ADDED"] * 5
    assert inf.synced.is_set()
    cached = inf.cache[("ns", "cm-3")]
    assert (cached.resource_version, cached.uid) == ("13", "uid-cm-3")
    assert cached.obj.data == {"k": "cm-3"}
    assert meta(cached.obj).managed_fields is msgspec.UNSET


async def test_selector_and_metadata_only_go_to_the_server_on_every_page() -> None:
    server = PagedLists([config_map(f"cm-{i}", str(10 + i)) for i in range(3)], rv="99")
    inf: Informer[ConfigMap] = Informer(
        server,
        resources.CONFIG_MAP,
        ConfigMap,
        Recorder(),
        namespace="ns",
        page_size=2,
        label_selector="app.kubernetes.io/managed-by=trainjob-pipeline",
        metadata_only=True,
    )
    await inf._list()
    assert server.requests == [
        {"limit": "2", "labelSelector": "app.kubernetes.io/managed-by=trainjob-pipeline"},
        {"limit": "2", "labelSelector": "app.kubernetes.io/managed-by=trainjob-pipeline", "continue": "2"},
    ]
    assert server.accepts == [METADATA_LIST_ACCEPT] * 2
    assert METADATA_LIST_ACCEPT == "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
    # Without them, a plain list: every object, whole.
    plain = PagedLists([config_map("cm-0", "1")], rv="5")
    await informer(plain, Recorder())._list()
    assert plain.requests == [{"limit": "2"}] and plain.accepts == [None]


async def test_an_empty_metadata_list_with_null_items_is_an_empty_list() -> None:
    """The API server answers an empty PartialObjectMetadataList with ``"items": null``."""

    class NullItems(PagedLists):
        async def request(self, method: str, path: str, **kwargs: Any) -> Response:
            body = {"kind": "PartialObjectMetadataList", "metadata": {"resourceVersion": "3"}, "items": None}
            return Response(status=200, body=json.dumps(body).encode())

    inf = informer(NullItems([], rv="3"), Recorder(), metadata_only=True)
    assert await inf._list() == "3"
    assert inf.cache == {} and inf.synced.is_set()


async def test_a_relist_reports_what_changed_and_what_went() -> None:
    server = PagedLists([config_map(f"cm-{i}", "1") for i in range(3)], rv="5")
    handler = Recorder()
    inf = informer(server, handler)
    await inf._list()
    handler.calls.clear()
    server.objects = [config_map("cm-0", "1"), config_map("cm-2", "7"), config_map("cm-3", "8")]
    await inf._list()
    assert sorted(handler.calls) == [
        ("ADDED", ("ns", "cm-3"), "8"),
        ("DELETED", ("ns", "cm-1"), "1"),
        ("MODIFIED", ("ns", "cm-2"), "7"),
    ]
    assert sorted(inf.cache) == [("ns", "cm-0"), ("ns", "cm-2"), ("ns", "cm-3")]


async def test_keep_then_trim_decide_what_is_cached() -> None:
    server = PagedLists([config_map("mine", "1"), config_map("other", "2")], rv="3")
    handler = Recorder()

    def keep(cm: ConfigMap) -> bool:
        return name_of(cm) == "mine"

    def trim(cm: ConfigMap) -> ConfigMap:
        return msgspec.structs.replace(cm, data=msgspec.UNSET)

    inf = informer(server, handler, keep=keep, trim=trim)
    await inf._list()
    assert list(inf.cache) == [("ns", "mine")]
    assert inf.cache[("ns", "mine")].obj.data is msgspec.UNSET


def test_cached_objects_decode_to_what_was_stored() -> None:
    js = msgspec.convert(
        {
            "apiVersion": "jobset.x-k8s.io/v1alpha2",
            "kind": "JobSet",
            "metadata": {"name": "a", "namespace": "ns", "resourceVersion": "4"},
            "spec": {
                "suspend": True,
                "replicatedJobs": [
                    {
                        "name": "node",
                        "replicas": 1,
                        "template": {
                            "spec": {
                                "template": {
                                    "spec": {
                                        "containers": [
                                            {
                                                "name": "node",
                                                "image": "example.com/x",
                                                "resources": {"limits": {"cpu": "1500m", "memory": 4}},
                                            }
                                        ]
                                    }
                                }
                            }
                        },
                    }
                ],
            },
        },
        JobSet,
    )
    cached = Cached(js, "4", "u")
    assert cached.obj == js
    assert cached.obj is not cached.obj  # a fresh copy each time; nothing shared to mutate
    assert cached.size < len(msgspec.json.encode(js))
    assert "4" in repr(cached) and "JobSet" in repr(cached)
