"""A thin asynchronous client for the few Kubernetes API calls the services make.

The official client's generated layer turns every response into model objects and retries some calls on
its own. Here every byte that arrives is decoded once, by msgspec, straight into the project's wire types,
one pooled HTTPS connection set is reused for the life of a process, and retrying is left entirely to the
caller, which knows whether an error is transient. The official package still does what it does best:
reading kubeconfig files and in-cluster credentials, and keeping them fresh (``CredentialSource``), for
the kinds it alone knows: exec plugins, auth providers, inline certificate data, merged kubeconfig lists.
The common kinds (a token or ``tokenFile``, certificate files, in-cluster) are read here instead, because
importing the official package's client costs a service about 16 MB of RSS, a third of what it otherwise
holds at rest.

Credentials expire: an exec plugin's token (EKS, GKE) after minutes, a projected service-account token
after an hour, and a kubeconfig ``tokenFile`` is rewritten by whatever rotates it. The client therefore
asks its source for the current credentials every ``REFRESH_CHECK_SECONDS``, and on a 401 loads them again
and sends the request once more; only a second 401 reaches the caller (the applier's "permanent").
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import ssl
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import msgspec

from contracts.resources import Resource

log = logging.getLogger(__name__)

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


REFRESH_CHECK_SECONDS = 10.0
"""How often a client asks its ``CredentialSource`` whether the credentials changed."""


@dataclass(frozen=True)
class KubeConfig:
    """Where the API server is and how to authenticate, as loaded at one moment (``source`` loads it again)."""

    server: str
    token: str | None = field(default=None, repr=False)
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    verify: bool = True
    source: CredentialSource | None = field(default=None, compare=False, repr=False)
    """Where these came from; None for credentials given as they are, which never change."""

    @classmethod
    def load(cls, kubeconfig: str | None = None, *, context: str | None = None) -> KubeConfig:
        """From a kubeconfig file (the argument, then ``~/.kube/config``) or in-cluster.

        ``$KUBECONFIG`` is read by the CLI (``--kubeconfig``'s default), which passes the path down; only
        the in-cluster check looks at the environment Kubernetes gives every pod.
        """
        return CredentialSource(kubeconfig, context=context).load()

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


class CredentialSource:
    """Loads the API server's address and credentials as the kubernetes client does, and again when they
    may have changed.

    The client's ``Configuration`` keeps two kinds fresh through its refresh hook, which runs whenever it
    is asked for the key: an exec plugin's token (the plugin runs again once the expiry it reported is
    near) and a pod's service-account token (the file is read again every minute). A kubeconfig
    ``tokenFile`` it reads only once, so that file is watched here (inode, size, modification time). Every
    method blocks (files, an exec plugin's process): the async client calls them from a worker thread.
    """

    def __init__(self, kubeconfig: str | None = None, *, context: str | None = None) -> None:
        self.kubeconfig = kubeconfig
        self.context = context
        self._configuration: Any = None
        self._plain: KubeConfig | None = None
        """Credentials read without the official package (``_plain_kubeconfig``, ``_plain_in_cluster``)."""
        self._token_file: Path | None = None
        self._token_file_stamp: tuple[int, int, int] | None = None

    def load(self) -> KubeConfig:
        """Everything read afresh: the kubeconfig, its token file, its exec plugin run again."""
        plain = self._load_plain()
        if plain is not None:
            self._plain, self._token_file = plain
            self._configuration = None
            self._token_file_stamp = _stamp(self._token_file)
            return self._plain
        return self.load_with_package()

    def load_with_package(self) -> KubeConfig:
        """``load`` through the official package, whatever the kind of credentials."""
        self._plain = None
        from kubernetes import client, config

        cfg = client.Configuration()
        default = Path.home() / ".kube" / "config"
        if self.kubeconfig or default.exists():
            path = self.kubeconfig or str(default)
            config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=path, context=self.context, client_configuration=cfg
            )
            token_file = _token_file_of(Path(path), self.context)
        # The in-cluster loader itself reads this variable (and the mounted token), so asking it is how to
        # know the loader can work; the CLI cannot know it better.
        elif os.environ.get("KUBERNETES_SERVICE_HOST"):
            config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
            token_file = None
        else:
            raise RuntimeError("no Kubernetes configuration: set KUBECONFIG, or run inside a cluster")
        self._configuration = cfg
        self._token_file = token_file
        self._token_file_stamp = _stamp(token_file)
        return self._current_of(cfg)

    def current(self) -> KubeConfig:
        """The credentials as they are now: loaded again if the token file changed, else as the client's
        refresh hook leaves them (an expiring exec token renewed, an in-cluster token re-read)."""
        if _stamp(self._token_file) != self._token_file_stamp:
            return self.load()
        if self._plain is not None:
            return self._plain
        if self._configuration is None:
            return self.load()
        return self._current_of(self._configuration)

    def _load_plain(self) -> tuple[KubeConfig, Path | None] | None:
        """The credentials if they are of a kind read here; ``None`` leaves them (and any error) to the package."""
        default = Path.home() / ".kube" / "config"
        if self.kubeconfig or default.exists():
            path = self.kubeconfig or str(default)
            if os.pathsep in path:
                return None  # a list of kubeconfigs to merge
            return _plain_kubeconfig(Path(path), self.context, source=self)
        if os.environ.get("KUBERNETES_SERVICE_HOST"):  # as in load(): the in-cluster loader's own test
            return _plain_in_cluster(self)
        return None

    def _current_of(self, cfg: Any) -> KubeConfig:
        token = cfg.get_api_key_with_prefix("BearerToken", alias="authorization")  # runs the refresh hook
        if token and token.lower().startswith("bearer "):
            token = token[7:]
        return KubeConfig(
            server=str(cfg.host).rstrip("/"),
            token=token or None,
            ca_file=cfg.ssl_ca_cert,
            cert_file=cfg.cert_file,
            key_file=cfg.key_file,
            verify=bool(cfg.verify_ssl),
            source=self,
        )


_PLAIN_USER_KEYS = frozenset({"token", "tokenFile", "client-certificate", "client-key"})
_PLAIN_CLUSTER_KEYS = frozenset({"server", "certificate-authority", "insecure-skip-tls-verify", "extensions"})
IN_CLUSTER_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


def _context_entries(kubeconfig: Path, context: str | None) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """The cluster and user entries of ``context`` (else the current context); ``None`` when unreadable."""
    import yaml

    try:
        doc = yaml.safe_load(kubeconfig.read_text())
        name = context or doc["current-context"]
        ctx = next(c["context"] for c in doc["contexts"] if c["name"] == name)
        cluster = next(c["cluster"] for c in doc["clusters"] if c["name"] == ctx["cluster"])
        user_name = ctx.get("user")
        user = next(u["user"] for u in doc.get("users") or [] if u["name"] == user_name) if user_name else {}
    except (OSError, yaml.YAMLError, AttributeError, KeyError, TypeError, StopIteration):
        return None
    if not isinstance(cluster, dict) or not isinstance(user, dict):
        return None
    return cluster, user


def _plain_kubeconfig(
    kubeconfig: Path, context: str | None, *, source: CredentialSource
) -> tuple[KubeConfig, Path | None] | None:
    """A kubeconfig whose context's user is a token, a ``tokenFile`` or certificate files, and whose cluster
    names its CA by file; ``None`` for anything else (and for anything malformed, which the package reports).

    Relative paths are from the kubeconfig's folder and an inline ``token`` wins over ``tokenFile``, as in
    the package.
    """
    entries = _context_entries(kubeconfig, context)
    if entries is None:
        return None
    cluster, user = entries
    if not isinstance(cluster.get("server"), str) or set(cluster) - _PLAIN_CLUSTER_KEYS or set(user) - _PLAIN_USER_KEYS:
        return None

    def path_of(value: object) -> str | None:
        return str(kubeconfig.parent / value) if isinstance(value, str) and value else None

    token: str | None = str(user["token"]).strip() if user.get("token") else None
    token_file = _token_file_in(kubeconfig, user) if "token" not in user else None
    if token_file is not None:
        try:
            token = token_file.read_text().strip() or None
        except (OSError, UnicodeDecodeError):  # left to the package
            return None
    config = KubeConfig(
        server=cluster["server"].rstrip("/"),
        token=token,
        ca_file=path_of(cluster.get("certificate-authority")),
        cert_file=path_of(user.get("client-certificate")),
        key_file=path_of(user.get("client-key")),
        verify=not cluster.get("insecure-skip-tls-verify", False),
        source=source,
    )
    return config, token_file


def _plain_in_cluster(source: CredentialSource) -> tuple[KubeConfig, Path | None] | None:
    """A pod's service account: the address Kubernetes puts in the environment, the mounted token and CA.

    The token file is projected and rotated by the kubelet; ``current`` reads it again when it changes.
    """
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST", ""), os.environ.get("KUBERNETES_SERVICE_PORT", "")
    token_file, ca_file = IN_CLUSTER_DIR / "token", IN_CLUSTER_DIR / "ca.crt"
    try:
        token = token_file.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None
    if not host or not port or not token or not ca_file.is_file():
        return None
    if ":" in host:
        host = f"[{host}]"  # an IPv6 address
    config = KubeConfig(server=f"https://{host}:{port}", token=token, ca_file=str(ca_file), source=source)
    return config, token_file


def _token_file_of(kubeconfig: Path, context: str | None) -> Path | None:
    """The ``tokenFile`` of the context's user, if it has one (relative paths are from the kubeconfig)."""
    entries = _context_entries(kubeconfig, context)
    return _token_file_in(kubeconfig, entries[1]) if entries is not None else None


def _token_file_in(kubeconfig: Path, user: dict[str, Any]) -> Path | None:
    token_file = user.get("tokenFile")
    return kubeconfig.parent / token_file if isinstance(token_file, str) and token_file else None


def _stamp(path: Path | None) -> tuple[int, int, int] | None:
    if path is None:
        return None
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


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
        self._retired: list[aiohttp.ClientSession] = []
        """Sessions whose TLS settings went stale; requests may still be using them, so they close last."""
        self._credentials_checked = time.monotonic()
        self._credentials_lock = asyncio.Lock()
        self.credential_reloads = 0
        """How often the credentials changed under this client (a rotation, an expiry, a 401)."""

    async def __aenter__(self) -> KubeClient:
        self._ensure_session()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        sessions = [*self._retired, *([self._session] if self._session is not None else [])]
        self._session = None
        self._retired.clear()
        for session in sessions:
            await session.close()

    def _ensure_session(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=self._max_connections, ssl=self.config.ssl_context())
            headers = {"Accept": "application/json", "User-Agent": "trainjob-pipeline"}
            self._session = aiohttp.ClientSession(base_url=self.config.server, connector=connector, headers=headers)
        return self._session

    def _authorization(self, config: KubeConfig) -> dict[str, str]:
        return {"Authorization": f"Bearer {config.token}"} if config.token else {}

    async def _keep_credentials_current(self) -> None:
        """Every ``REFRESH_CHECK_SECONDS``, take up what the source says now (cheap unless something changed)."""
        source = self.config.source
        if source is None or time.monotonic() - self._credentials_checked < REFRESH_CHECK_SECONDS:
            return
        async with self._credentials_lock:
            if time.monotonic() - self._credentials_checked < REFRESH_CHECK_SECONDS:
                return
            self._credentials_checked = time.monotonic()
            try:
                current = await asyncio.to_thread(source.current)
            except Exception as exc:  # keep what works until it stops working; a 401 loads again
                log.warning("could not refresh the Kubernetes credentials: %s", exc)
                return
            self._use(current, why="refreshed")

    async def _reload_after_unauthorized(self, used: KubeConfig) -> bool:
        """After a 401 with ``used``: load the credentials again; whether a retry has anything new to send."""
        source = used.source
        if source is None:
            return False
        async with self._credentials_lock:
            if self.config is not used:  # another request reloaded meanwhile
                return True
            try:
                loaded = await asyncio.to_thread(source.load)
            except Exception as exc:
                log.warning("could not load the Kubernetes credentials again after a 401: %s", exc)
                return False
            self._credentials_checked = time.monotonic()
            return self._use(loaded, why="reloaded after a 401")

    def _use(self, config: KubeConfig, *, why: str) -> bool:
        """Switch to ``config`` if it differs; a new server or TLS identity needs a new connection pool."""
        if config == self.config:
            return False
        old = self.config
        tls = (old.server, old.ca_file, old.cert_file, old.key_file, old.verify)
        if tls != (config.server, config.ca_file, config.cert_file, config.key_file, config.verify):
            if self._session is not None:
                self._retired.append(self._session)
            self._session = None
        self.config = config
        self.credential_reloads += 1
        log.info("Kubernetes credentials %s (%d so far)", why, self.credential_reloads)
        return True

    # Every call to the API server goes through here, which is what test doubles and bench override.
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
        headers = {"Content-Type": content_type} if content_type else {}
        if accept:
            headers["Accept"] = accept
        first = True
        while True:
            await self._keep_credentials_current()
            used = self.config
            session = self._ensure_session()
            try:
                async with session.request(
                    method,
                    path,
                    params=params,
                    data=body,
                    headers=headers | self._authorization(used),
                    timeout=aiohttp.ClientTimeout(total=timeout or self._timeout),
                ) as resp:
                    status, data, retry_after = resp.status, await resp.read(), resp.headers.get("Retry-After")
            except (TimeoutError, aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as exc:
                raise KubeApiError(0, "ConnectionError", f"{type(exc).__name__}: {exc}") from exc
            if status == 401 and first and await self._reload_after_unauthorized(used):
                first = False
                continue
            if status >= 400:
                raise _error_from(status, data, retry_after)
            return Response(status=status, body=data)

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

    async def merge_patch(
        self, resource: Resource, *, namespace: str | None, name: str, body: bytes, field_manager: str
    ) -> Response:
        """A JSON merge patch under ``field_manager``: only the fields ``body`` names change, and only they
        are that manager's (an apply would also drop every field its manager stops sending)."""
        path = resource.path(namespace=namespace, name=name)
        return await self.request(
            "PATCH", path, params={"fieldManager": field_manager}, body=body, content_type=MERGE_PATCH
        )

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

    async def create(
        self, resource: Resource, *, namespace: str | None, body: bytes, field_manager: str | None = None
    ) -> Response:
        return await self.request(
            "POST",
            resource.path(namespace=namespace),
            params={"fieldManager": field_manager} if field_manager else None,
            body=body,
            content_type="application/json",
        )

    async def list_revision(self, resource: Resource, *, namespace: str | None = None) -> str:
        """The resourceVersion of a one-item list of ``resource``: the cluster's current etcd revision, read with
        no more than list rights on one kind (in ``namespace``, where that is all a confined role grants)."""
        resp = await self.request("GET", resource.path(namespace=namespace), params={"limit": "1"}, timeout=30)
        return _list_decoder.decode(resp.body).metadata.resourceVersion

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
        params = {
            "watch": "true",
            "allowWatchBookmarks": "true",
            "resourceVersion": resource_version,
            "timeoutSeconds": str(timeout_seconds),
        }
        if label_selector:
            params["labelSelector"] = label_selector
        accept = {"Accept": METADATA_ACCEPT} if metadata_only else {}
        first = True
        try:
            while True:
                await self._keep_credentials_current()
                used = self.config
                async with self._ensure_session().get(
                    resource.path(namespace=namespace),
                    params=params,
                    headers=accept | self._authorization(used),
                    timeout=aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=timeout_seconds + 30),
                ) as resp:
                    if resp.status == 401 and first:
                        await resp.read()
                        if await self._reload_after_unauthorized(used):
                            first = False
                            continue
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
                    return
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
