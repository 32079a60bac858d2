"""List-then-watch with a local cache, the way client-go's informers and kopf's watcher keep state.

A watch alone misses whatever happened before it started and breaks on every compaction, so each informer
lists first, then watches from the list's resourceVersion with bookmarks on, and lists again when the
server answers 410 Gone. Objects that disappeared between two lists are reported as deletions, so a
consumer of the callback never has to reconcile the cache itself.

An informer may be told to keep a subset of objects (e.g. only those a TrainJob controls) and to keep
only part of each (what its consumer reads). The cache is the watcher's whole memory footprint: with ten
thousand TrainJobs it holds tens of thousands of objects, and a decoded object costs several times its
JSON, because every field of every nested struct is a Python object. So each cached object is held as
zlib-compressed JSON (a few hundred bytes) and decoded when it is read; reads are few per watch event and
take microseconds, while the compressed form takes a fraction of the memory even of the raw JSON.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import zlib
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

import msgspec

from contracts.resources import Resource
from plumbing.kube import LIST_PAGE_SIZE, KubeApiError, KubeClient
from plumbing.retrying import WATCH_RELIST

log = logging.getLogger(__name__)

T = TypeVar("T")


class _Meta(msgspec.Struct, kw_only=True):
    name: str = ""
    namespace: str = ""
    resourceVersion: str = ""
    uid: str = ""


class _Head(msgspec.Struct, kw_only=True):
    metadata: _Meta = msgspec.field(default_factory=_Meta)


_head_decoder = msgspec.json.Decoder(_Head)


def _without_managed_fields(obj: T) -> T:
    """managedFields say who owns what on the server; nothing downstream reads them, and they are often
    the largest part of an object, so they are dropped before caching or publishing."""
    meta = getattr(obj, "metadata", None)
    owned = getattr(meta, "managed_fields", msgspec.UNSET)
    if isinstance(obj, msgspec.Struct) and isinstance(meta, msgspec.Struct) and owned is not msgspec.UNSET:
        stripped = msgspec.structs.replace(meta, managed_fields=msgspec.UNSET)
        return msgspec.structs.replace(obj, metadata=stripped)
    return obj


_encoder = msgspec.json.Encoder()
_decoders: dict[type[Any], msgspec.json.Decoder[Any]] = {}


def _decoder_for(kind: type[T]) -> msgspec.json.Decoder[T]:
    decoder = _decoders.get(kind)
    if decoder is None:
        decoder = _decoders[kind] = msgspec.json.Decoder(kind)
    return decoder


class Cached(Generic[T]):
    """One cached object, compressed; ``obj`` decodes a fresh copy on every read."""

    __slots__ = ("_blob", "_decoder", "own_write", "resource_version", "uid")

    def __init__(self, obj: T, resource_version: str, uid: str, *, own_write: bool = False) -> None:
        self._blob = zlib.compress(_encoder.encode(obj))
        self._decoder = _decoder_for(type(obj))
        self.resource_version = resource_version
        self.uid = uid
        self.own_write = own_write
        """The change to this version was only the consumer's own write (the informer's ``own_writes``)."""

    @property
    def obj(self) -> T:
        return self._decoder.decode(zlib.decompress(self._blob))

    @property
    def size(self) -> int:
        """Bytes held for the object itself (the compressed JSON)."""
        return len(self._blob)

    def __repr__(self) -> str:
        return f"Cached({self._decoder.type!r}, rv={self.resource_version!r}, uid={self.uid!r}, {self.size} bytes)"


Key = tuple[str, str]
Handler = Callable[[str, Key, "Cached[T] | None"], Awaitable[None]]


class Informer(Generic[T]):
    """Keeps ``cache`` in step with the API server and calls ``handler(type, key, cached)`` per change.

    ``type`` is ``ADDED``, ``MODIFIED``, ``DELETED`` or ``RESYNC``; for ``DELETED`` the last known object
    is passed. Undecodable objects are logged and skipped; the informer keeps going.

    ``keep`` chooses the objects worth caching (and reporting); ``trim`` cuts each kept one down to what the
    consumer reads, so what is cached and what the handler is given are the same trimmed object.

    ``label_selector`` and ``metadata_only`` are filters the API server applies, so what they leave out
    never reaches this process: ``metadata_only`` lists ``PartialObjectMetadataList`` and watches
    ``PartialObjectMetadata`` (decode those as a type with only ``metadata``). With a selector, an object
    whose label is removed is reported as deleted: the server's watch says so, as client-go's informers do.

    ``own_writes(previous, new)`` judges a modification before ``managedFields`` are dropped: given the cached
    object and the new one as the server sent it, whether the change is only the consumer's own write. Its
    answer is the new entry's ``own_write``, for the handler to act on; the informer reports the change
    either way, so the cache and whatever the handler keeps beside it stay in step.

    ``current`` says whether the cache follows the server: true from a list on, while the watch after it
    runs (a watch that ends and resumes from its version misses nothing), false from a failure until the
    next list or the next event of a resumed watch. A consumer that answers questions from the cache
    instead of asking the server checks it first.
    """

    def __init__(
        self,
        client: KubeClient,
        resource: Resource,
        decode_as: type[T],
        handler: Handler[T],
        *,
        namespace: str | None = None,
        watch_timeout: int = 300,
        page_size: int = LIST_PAGE_SIZE,
        keep: Callable[[T], bool] | None = None,
        trim: Callable[[T], T] | None = None,
        label_selector: str | None = None,
        metadata_only: bool = False,
        own_writes: Callable[[T, T], bool] | None = None,
    ) -> None:
        self.client = client
        self.resource = resource
        self.namespace = namespace
        self.handler = handler
        self.cache: dict[Key, Cached[T]] = {}
        self.synced = asyncio.Event()
        self.current = False
        self.relists = 0
        self._decoder = _decoder_for(decode_as)
        self._watch_timeout = watch_timeout
        self._page_size = page_size
        self._keep = keep
        self._trim = trim
        self._label_selector = label_selector
        self._metadata_only = metadata_only
        self._own_writes = own_writes

    def _decode(self, raw: bytes | msgspec.Raw) -> tuple[Key, Cached[T]] | None:
        head = _head_decoder.decode(raw).metadata
        try:
            obj = self._decoder.decode(raw)
        except msgspec.ValidationError as exc:
            log.error("skipping undecodable %s %s/%s: %s", self.resource.kind, head.namespace, head.name, exc)
            return None
        if self._keep is not None and not self._keep(obj):
            return None
        # Interned: the same namespace (and often the same name) keys entries in several caches.
        key = (sys.intern(head.namespace), sys.intern(head.name))
        own_write = False
        if self._own_writes is not None and (previous := self.cache.get(key)) is not None:
            own_write = previous.uid == head.uid and self._own_writes(previous.obj, obj)
        obj = _without_managed_fields(obj)
        if self._trim is not None:
            obj = self._trim(obj)
        return key, Cached(obj, head.resourceVersion, head.uid, own_write=own_write)

    async def _list(self) -> str:
        """Replace the cache by a fresh list, in pages of one consistent snapshot; returns its version.

        A continue token that expired between two pages is a 410, which ``run`` answers by listing again.
        """
        fresh: dict[Key, Cached[T]] = {}
        rv = ""
        async for page in self.client.list_pages(
            self.resource,
            namespace=self.namespace,
            limit=self._page_size,
            label_selector=self._label_selector,
            metadata_only=self._metadata_only,
        ):
            for item in page.items:
                decoded = self._decode(item)
                if decoded is not None:
                    fresh[decoded[0]] = decoded[1]
            rv = page.metadata.resourceVersion
        gone = [key for key in self.cache if key not in fresh]
        previous = self.cache
        self.cache = fresh
        for key in gone:
            await self.handler("DELETED", key, previous[key])
        for key, cached in fresh.items():
            old = previous.get(key)
            if old is None or old.resource_version != cached.resource_version:
                await self.handler("ADDED" if old is None else "MODIFIED", key, cached)
        self.synced.set()
        self.current = True
        return rv

    async def resync(self) -> None:
        """Report every cached object again, e.g. on a periodic timer."""
        for key, cached in list(self.cache.items()):
            await self.handler("RESYNC", key, cached)

    async def run(self) -> None:
        rv = ""
        # Failures in a row, reset by every event the watch delivers: the loop outlives one call, so it asks
        # the policy for each wait (WATCH_RELIST.delay) instead of handing the loop to tenacity.
        failures = 0
        while True:
            try:
                if not rv:
                    rv = await self._list()
                async for event in self.client.watch(
                    self.resource,
                    namespace=self.namespace,
                    resource_version=rv,
                    timeout_seconds=self._watch_timeout,
                    label_selector=self._label_selector,
                    metadata_only=self._metadata_only,
                ):
                    failures = 0
                    self.current = True
                    raw = bytes(event.object)
                    if event.type == "BOOKMARK":
                        rv = _head_decoder.decode(raw).metadata.resourceVersion or rv
                        continue
                    decoded = self._decode(raw)
                    if decoded is None:
                        continue
                    key, cached = decoded
                    rv = cached.resource_version or rv
                    if event.type == "DELETED":
                        self.cache.pop(key, None)
                    else:
                        self.cache[key] = cached
                    await self.handler(event.type, key, cached)
            except KubeApiError as exc:
                self.current = False
                if exc.status == 410:
                    log.info("%s watch expired (410 Gone): listing again", self.resource.kind)
                    self.relists += 1
                    rv = ""
                    continue
                failures += 1
                delay = WATCH_RELIST.delay(failures)
                log.warning("%s watch failed (%s); retrying in %.1fs", self.resource.kind, exc, delay)
                # Resume from the last version after a blip; relist after a hard error or many blips.
                resumable = exc.status in (0, 429, 500, 503, 504) and failures < 5
                rv = rv if resumable else ""
                await asyncio.sleep(delay)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # anything else must not end the informer silently
                self.current = False
                failures += 1
                delay = WATCH_RELIST.delay(failures)
                log.exception("%s informer failed (%s); listing again in %.1fs", self.resource.kind, exc, delay)
                rv = ""
                await asyncio.sleep(delay)
