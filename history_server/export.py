"""One TrainJob's whole record as one file: JSON lines, one record a line, in the order they were stored.

Why JSON lines: every record on the bus is already a JSON document, so a line is the record as the pipeline
kept it (no second format to learn or to break), tools such as ``jq`` and pandas read it a line at a time, and
a long record never has to be held by the reader as one document. Each line says what it is (``record``):
``trainjob`` first (what the list shows of it, and when the file was made), then every ``event``, ``plan``,
``result``, ``dead-letter`` and ``progress`` record the streams hold for it with its stream, sequence number,
time and subject, then the kept ``logs`` (the capture's manifest) and one ``log`` line per kept container log.
The messages' headers (signatures, trace ids) are left out: they say how a record travelled, not what it is.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

from contracts.messages import ObjectKey
from history_server import logs as core

if TYPE_CHECKING:
    from nats.js import JetStreamContext

    from history_server.capture import LogKeeper
    from plumbing.bus_history import StoredMessage
    from tjpipe.history_tools import Records


def _line(value: dict[str, Any]) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str).encode() + b"\n"


def _stored(kind: str, stored: StoredMessage) -> dict[str, Any]:
    try:
        body: Any = json.loads(stored.data)
    except ValueError:
        return {"record": kind, "stream": stored.stream, "seq": stored.seq, "time": stored.time, "undecodable": True}
    return {
        "record": kind,
        "stream": stored.stream,
        "seq": stored.seq,
        "time": stored.time,
        "subject": stored.subject,
        "message": body,
    }


async def record_lines(
    js: JetStreamContext,
    key: ObjectKey,
    *,
    about: dict[str, Any],
    since: float | None,
    where: Records,
    keeper: LogKeeper | None,
    uid: str,
) -> tuple[list[bytes], int]:
    """The file's lines, and how many records of the streams it holds (0: the streams hold none)."""
    from tjpipe.history_tools import read_records

    reads = await read_records(js, key, since=since, where=where)
    records = sorted(
        (
            (stored.time, i, stored.seq, _stored(kind, stored))
            for i, (kind, found) in enumerate(
                zip(("event", "plan", "result", "dead-letter", "progress"), reads, strict=True)
            )
            for stored in found
        ),
        key=lambda r: r[:3],
    )
    lines = [_line({"record": "trainjob", "exportedAt": time.time(), **about})]
    lines += [_line(r[3]) for r in records]
    if keeper is not None and uid:
        manifest = await keeper.manifest(key.namespace, uid)
        if manifest is not None:
            lines.append(_line({"record": "logs", **(core.manifest_json(manifest) or {})}))
            for piece in manifest.pieces:
                read = await keeper.text(piece)
                entry: dict[str, Any] = {"record": "log", "pod": piece.pod, "container": piece.container}
                if read is None:
                    entry |= {"kept": False}
                else:
                    entry |= {"kept": True, "complete": read.complete, "text": read.data.decode("utf-8", "replace")}
                lines.append(_line(entry))
    return lines, len(records)
