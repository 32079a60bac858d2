"""A thin asynchronous client for the few Kubernetes API calls the services make.

The official client's generated layer turns every response into model objects and retries some calls on
its own. Here every byte that arrives is decoded once, by msgspec, straight into the project's wire types,
one pooled HTTPS connection set is reused for the life of a process, and retrying is left entirely to the
caller, which knows whether an error is transient. The official package still does what it does best:
reading kubeconfig files and in-cluster credentials.
"""

from __future__ import annotations

import json
import os
import ssl
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import msgspec

from tjpipe.contracts.resources import Resource

APPLY_PATCH = "application/apply-patch+yaml"
MERGE_PATCH = "application/merge-patch+json"
METADATA_LIST_ACCEPT = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
"""Asks the API server for a list of metadata only (``PartialObjectMetadataList``): no spec, no data."""
METADATA_ACCEPT = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"
"""The same for a watch (each event's object is a ``PartialObjectMetadata``) or a single GET.

No plain ``application/json`` fallback is offered: a server that cannot answer with metadata only must
refuse (406), not quietly send whole objects, Secret data included.
"""


class KubeApiError(Exception):
    """A non-success answer from the API server (or no answer at all: ``status`` 0)."""

    def __init__(self, status: int, reason: str, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(f"{status} {reason}: {message}" if status else message)
        self.status = status
        self.reason = reason
        self.message = message
        self.retry_after = retry_after


@dataclass(frozen=True)
class KubeConfig:
    server: str
    token: str | None = None
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    verify: bool = True

    @classmethod
    def load(cls, kubeconfig: str | None = None, *, context: str | None = None) -> KubeConfig:
        """From a kubeconfig file (the argument, then ``~/.kube/config``) or in-cluster.

        ``$KUBECONFIG`` is read by the CLI (``--kubeconfig``'s default), which passes the path down; only
        the in-cluster check looks at the environment Kubernetes gives every pod.
        """
        from kubernetes import client, config

        cfg = client.Configuration()
        path = kubeconfig
        default = Path.home() / ".kube" / "config"
        if path or default.exists():
            config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=path or str(default), context=context, client_configuration=cfg
            )
        elif os.environ.get("KUBERNETES_SERVICE_HOST"):
            config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
        else:
            raise RuntimeError("no Kubernetes configuration: set KUBECONFIG, or run inside a cluster")
        token = cfg.api_key.get("authorization") or cfg.api_key.get("BearerToken")
        if token and token.lower().startswith("bearer "):
            token = token[7:]
        return cls(
            server=str(cfg.host).rstrip("/"),
            token=token,
            ca_file=cfg.ssl_ca_cert,
            cert_file=cfg.cert_file,
            key_file=cfg.key_file,
            verify=bool(cfg.verify_ssl),
        )

    def ssl_context(self) -> ssl.SSLContext | bool:
        if not self.server.startswith("https"):
            return False
        ctx = ssl.create_default_context(cafile=self.ca_file) if self.ca_file else ssl.create_default_context()
        if not self.verify:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        if self.cert_file:
            ctx.load_cert_chain(self.cert_file, self.key_file)
        return ctx


class Status(msgspec.Struct, kw_only=True):
    reason: str = ""
    message: str = ""


class ListMeta(msgspec.Struct, kw_only=True):
    resourceVersion: str = ""
    continue_: str = msgspec.field(default="", name="continue")


class RawList(msgspec.Struct, kw_only=True):
    metadata: ListMeta = msgspec.field(default_factory=ListMeta)
    items: list[msgspec.Raw] = []


class _RawListWire(msgspec.Struct, kw_only=True):
    metadata: ListMeta = msgspec.field(default_factory=ListMeta)
    items: list[msgspec.Raw] | None = None


class RawWatchEvent(msgspec.Struct, kw_only=True):
    type: str
    object: msgspec.Raw


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes


_status_decoder = msgspec.json.Decoder(Status)
_list_decoder = msgspec.json.Decoder(_RawListWire)

LIST_PAGE_SIZE = 500
"""Objects per list request, as client-go's pager."""
_watch_decoder = msgspec.json.Decoder(RawWatchEvent)


class KubeClient:
    """One connection pool to one API server. Use as an async context manager."""

    def __init__(self, config: KubeConfig, *, max_connections: int = 32, timeout: float = 30.0) -> None:
        self.config = config
        self._max_connections = max_connections
        self._timeout = timeout
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> KubeClient:
        self._ensure_session()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _ensure_session(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=self._max_connections, ssl=self.config.ssl_context())
            headers = {"Accept": "application/json", "User-Agent": "trainjob-pipeline"}
            if self.config.token:
                headers["Authorization"] = f"Bearer {self.config.token}"
            self._session = aiohttp.ClientSession(base_url=self.config.server, connector=connector, headers=headers)
        return self._session

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
        session = self._ensure_session()
        headers = {"Content-Type": content_type} if content_type else {}
        if accept:
            headers["Accept"] = accept
        try:
            async with session.request(
                method,
                path,
                params=params,
                data=body,
                headers=headers or None,
                timeout=aiohttp.ClientTimeout(total=timeout or self._timeout),
            ) as resp:
                data = await resp.read()
                if resp.status >= 400:
                    raise _error_from(resp.status, data, resp.headers.get("Retry-After"))
                return Response(status=resp.status, body=data)
        except (TimeoutError, aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as exc:
            raise KubeApiError(0, "ConnectionError", f"{type(exc).__name__}: {exc}") from exc

    async def reachable(self) -> bool:
        """Whether the API server answers /readyz; used by readiness probes."""
        try:
            await self.request("GET", "/readyz", timeout=3)
        except KubeApiError:
            return False
        return True

    async def apply(
        self,
        resource: Resource,
        *,
        namespace: str,
        name: str,
        body: bytes,
        field_manager: str,
        force: bool = True,
        subresource: str | None = None,
        dry_run: bool = False,
    ) -> Response:
        params = {"fieldManager": field_manager, "force": "true" if force else "false"}
        if dry_run:
            params["dryRun"] = "All"
        path = resource.path(namespace=namespace, name=name, subresource=subresource)
        return await self.request("PATCH", path, params=params, body=body, content_type=APPLY_PATCH)

    async def get(self, resource: Resource, *, namespace: str | None, name: str) -> bytes | None:
        """The object's JSON, or ``None`` when it does not exist."""
        try:
            return (await self.request("GET", resource.path(namespace=namespace, name=name))).body
        except KubeApiError as exc:
            if exc.status == 404:
                return None
            raise

    async def delete(self, resource: Resource, *, namespace: str | None, name: str) -> bool:
        body = json.dumps({"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"})
        try:
            await self.request(
                "DELETE",
                resource.path(namespace=namespace, name=name),
                body=body.encode(),
                content_type="application/json",
            )
        except KubeApiError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    async def create(self, resource: Resource, *, namespace: str | None, body: bytes) -> Response:
        return await self.request(
            "POST", resource.path(namespace=namespace), body=body, content_type="application/json"
        )

    async def list_pages(
        self,
        resource: Resource,
        *,
        namespace: str | None = None,
        limit: int = LIST_PAGE_SIZE,
        label_selector: str | None = None,
        metadata_only: bool = False,
    ) -> AsyncIterator[RawList]:
        """Every object of ``resource``, one page of one consistent snapshot at a time.

        One answer holding every JobSet of a big cluster is tens of megabytes that the process keeps as
        resident memory long after the list, since the allocator cannot return the holes it leaves; pages
        are small and reused. A continue token that expired between two pages surfaces as a 410.
        ``label_selector`` and ``metadata_only`` are applied by the server: what they leave out is never sent.
        """
        token = ""
        while True:
            params = {"limit": str(limit)}
            if label_selector:
                params["labelSelector"] = label_selector
            if token:
                params["continue"] = token
            resp = await self.request(
                "GET",
                resource.path(namespace=namespace),
                params=params,
                timeout=120,
                accept=METADATA_LIST_ACCEPT if metadata_only else None,
            )
            wire = _list_decoder.decode(resp.body)
            # An empty PartialObjectMetadataList says `"items": null` where an empty list says `[]`.
            page = RawList(metadata=wire.metadata, items=wire.items or [])
            yield page
            token = page.metadata.continue_
            if not token:
                return

    async def watch(
        self,
        resource: Resource,
        *,
        namespace: str | None = None,
        resource_version: str,
        timeout_seconds: int = 300,
        label_selector: str | None = None,
        metadata_only: bool = False,
    ) -> AsyncIterator[RawWatchEvent]:
        """Stream watch events, bookmarks included; a 410 surfaces as ``KubeApiError(410)``."""
        session = self._ensure_session()
        params = {
            "watch": "true",
            "allowWatchBookmarks": "true",
            "resourceVersion": resource_version,
            "timeoutSeconds": str(timeout_seconds),
        }
        if label_selector:
            params["labelSelector"] = label_selector
        try:
            async with session.get(
                resource.path(namespace=namespace),
                params=params,
                headers={"Accept": METADATA_ACCEPT} if metadata_only else None,
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=timeout_seconds + 30),
            ) as resp:
                if resp.status >= 400:
                    raise _error_from(resp.status, await resp.read(), resp.headers.get("Retry-After"))
                async for line in _lines(resp.content):
                    event = _watch_decoder.decode(line)
                    if event.type == "ERROR":
                        status = msgspec.json.decode(event.object, type=dict[str, Any])
                        raise KubeApiError(
                            int(status.get("code", 500)),
                            str(status.get("reason", "")),
                            str(status.get("message", "")),
                        )
                    yield event
        except (TimeoutError, aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as exc:
            raise KubeApiError(0, "ConnectionError", f"{type(exc).__name__}: {exc}") from exc


async def _lines(stream: aiohttp.StreamReader) -> AsyncIterator[bytes]:
    """Newline-delimited JSON of any size: a watch event is one line however large the object is."""
    pending = bytearray()
    async for chunk in stream.iter_any():
        pending += chunk
        while (end := pending.find(b"\n")) >= 0:
            line = bytes(pending[:end])
            del pending[: end + 1]
            if line.strip():
                yield line
    if pending.strip():
        yield bytes(pending)


def _error_from(status: int, data: bytes, retry_after: str | None) -> KubeApiError:
    try:
        parsed = _status_decoder.decode(data)
        reason, message = parsed.reason, parsed.message
    except msgspec.DecodeError:
        reason, message = "", data[:500].decode(errors="replace")
    delay: float | None = None
    if retry_after:
        try:
            delay = float(retry_after)
        except ValueError:
            delay = None
    return KubeApiError(status, reason or str(status), message, retry_after=delay)
