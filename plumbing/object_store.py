"""JetStream object store objects, written and read with plain publishes and direct gets.

Why not the client library's object store: its ``put`` first reads the object's description and, when the
name exists, purges the old chunks, and its ``get`` creates an ordered consumer. Either right is more than a
writer or a reader should hold: a purge right empties the whole stream (the API subject cannot say which
subject is purged), and a consumer-create right re-points consumers (``tjpipe.credentials``). Written here,
a writer needs to publish on the bucket's chunk and description subjects and nothing else (it never replaces:
every name it writes is new), and a reader only direct gets. The layout is the object store's own (chunks on
``$O.<bucket>.C.<nuid>``, a JSON description rolled up on ``$O.<bucket>.M.<base64 name>``, a SHA-256 digest),
so ``nats object`` and the client library read what is written here.

A bucket at its byte limit drops its oldest messages, chunks included: ``read`` then returns what is left and
says it is incomplete instead of failing.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
import secrets
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from contracts.streams import BucketSpec
from plumbing.bus_history import read_stream

if TYPE_CHECKING:
    from nats.js import JetStreamContext

CHUNK_BYTES = 128 * 1024
ROLLUP = {"Nats-Rollup": "sub"}


def meta_subject(spec: BucketSpec, name: str) -> str:
    return f"{spec.meta}.{base64.urlsafe_b64encode(name.encode()).decode()}"


def _digest(data: bytes) -> str:
    return "SHA-256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).decode()


async def put(js: JetStreamContext, spec: BucketSpec, name: str, data: bytes, *, description: str = "") -> int:
    """Store ``data`` as the object ``name``; the number of chunks. Each publish waits for the stream's ack."""
    nuid = secrets.token_urlsafe(16)
    chunks = 0
    for start in range(0, len(data), CHUNK_BYTES):
        await js.publish(f"{spec.chunks}.{nuid}", data[start : start + CHUNK_BYTES])
        chunks += 1
    info = {
        "name": name,
        "description": description or None,
        "headers": None,
        "options": {"max_chunk_size": CHUNK_BYTES},
        "bucket": spec.name,
        "nuid": nuid,
        "size": len(data),
        "mtime": dt.datetime.now(dt.UTC).isoformat(),
        "chunks": chunks,
        "digest": _digest(data),
        "deleted": False,
    }
    await js.publish(meta_subject(spec, name), json.dumps(info).encode(), headers=ROLLUP)
    return chunks


async def info(js: JetStreamContext, spec: BucketSpec, name: str) -> dict[str, Any] | None:
    """The object's description, or ``None`` when there is none (never written, deleted, or dropped)."""
    import nats.js.errors

    try:
        found = await read_stream(js, spec.stream, meta_subject(spec, name), last_per_subject=True)
    except nats.js.errors.NotFoundError:  # no bucket: a bus set up before there was one
        return None
    if not found:
        return None
    described: dict[str, Any] = json.loads(found[-1].data)
    return None if described.get("deleted") else described


@dataclass(frozen=True)
class Read:
    data: bytes
    complete: bool
    """Every chunk is there and the digest matches; ``False`` when the bucket's limits dropped some."""


async def get(js: JetStreamContext, spec: BucketSpec, name: str) -> Read | None:
    described = await info(js, spec, name)
    if described is None:
        return None
    if not described.get("chunks"):
        return Read(b"", True)
    stored = await read_stream(js, spec.stream, f"{spec.chunks}.{described['nuid']}")
    data = b"".join(m.data for m in stored)
    return Read(data, len(stored) == described["chunks"] and _digest(data) == described.get("digest"))


async def delete_prefix(js: JetStreamContext, spec: BucketSpec, prefix: str) -> list[str]:
    """Delete every object whose name starts with ``prefix`` (an admin's right: a purge per object); the names.

    Each object gets the deleted description the object store writes, and its chunks are purged."""
    return await delete_found(js, spec, await find_prefix(js, spec, prefix))


async def find_prefix(js: JetStreamContext, spec: BucketSpec, prefix: str) -> list[tuple[str, dict[str, Any]]]:
    """The description (and its subject) of every object not deleted whose name starts with ``prefix``: a read,
    which an identity that may read the bucket does, for another that may only delete (``delete_found``)."""
    found = await read_stream(js, spec.stream, f"{spec.meta}.>", last_per_subject=True)
    described = ((stored.subject, json.loads(stored.data)) for stored in found)
    return [
        (subject, d) for subject, d in described if not d.get("deleted") and str(d.get("name", "")).startswith(prefix)
    ]


async def delete_found(js: JetStreamContext, spec: BucketSpec, found: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """Mark each found object deleted (a rolled-up description) and purge its chunks; their names."""
    deleted = []
    for subject, described in found:
        gone = described | {"deleted": True, "size": 0, "chunks": 0, "digest": "", "mtime": ""}
        await js.publish(subject, json.dumps(gone).encode(), headers=ROLLUP)
        await js.purge_stream(spec.stream, subject=f"{spec.chunks}.{described['nuid']}")
        deleted.append(str(described["name"]))
    return deleted
