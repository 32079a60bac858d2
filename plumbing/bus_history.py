"""Reading what a stream keeps: the history the operator commands, the history server and replay read.

Apart from the connection and the set-up because it is the only read path that goes backwards in time: it
fetches stored messages by sequence with batched direct gets (no consumer, so a reader needs no permission
to create one and leaves nothing behind on the server), and tells a history stream's copy from its origin
by the source header the server adds.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True, slots=True)
class StoredMessage:
    """One message as the stream keeps it: where it sits, when it arrived, and its bytes."""

    stream: str
    seq: int
    subject: str
    data: bytes
    headers: dict[str, str]
    time: float
    origin_seq: int = 0
    """Its sequence in the work stream it was recorded from (a history stream's copy); else ``seq``."""


async def read_stream(
    js: JetStreamContext,
    stream: str,
    subject: str,
    *,
    start_seq: int | None = None,
    start_time: float | None = None,
    last_per_subject: bool = False,
    batch: int = 256,
    limit: int | None = None,
) -> list[StoredMessage]:
    """Every stored message on ``subject`` (wildcards allowed), oldest first, without touching any consumer.

    The messages are read with batched direct gets (``$JS.API.DIRECT.GET.<stream>``), which only read: no
    consumer is created, so the production consumers and the stream stay exactly as they were, which is what
    makes history and replay safe on a live system, and a read-only identity needs no right to create
    consumers (with which it could re-point a service's durable). ``last_per_subject`` has the server pick
    only the newest message of each subject instead. ``limit`` stops the read once that many messages
    have arrived, for a reader that pages through a large stream from ``start_seq``.
    """
    import datetime as dt

    request: dict[str, object] = {"next_by_subj": subject, "batch": batch}
    if last_per_subject:
        found = await _direct_get_batch(js, stream, {"multi_last": [subject], "batch": 1 << 20})
        if found is not None:
            return found
        # The server would not answer that many subjects at once: read everything, keep the newest of each.
        newest: dict[str, StoredMessage] = {}
        for message in await read_stream(js, stream, subject):
            newest[message.subject] = message
        return sorted(newest.values(), key=lambda m: m.seq)
    if start_seq is not None:
        request["seq"] = start_seq
    elif start_time is not None:
        request["start_time"] = dt.datetime.fromtimestamp(start_time, tz=dt.UTC).isoformat()
    else:
        request["seq"] = 1
    out: list[StoredMessage] = []
    while True:
        page = await _direct_get_batch(js, stream, request)
        if not page:
            return out
        out += page
        if limit is not None and len(out) >= limit:
            return out
        request.pop("start_time", None)
        request["seq"] = page[-1].seq + 1


SOURCE_HEADER = "Nats-Stream-Source"

_DIRECT_GET_HEADERS = frozenset(
    {
        "Nats-Stream",
        "Nats-Subject",
        "Nats-Sequence",
        "Nats-Time-Stamp",
        "Nats-Num-Pending",
        "Nats-Last-Sequence",
        "Nats-UpTo-Sequence",
        SOURCE_HEADER,
    }
)


def _origin_seq(headers: dict[str, str], seq: int) -> int:
    """``<stream> <seq> ...`` in the header the server adds to a sourced copy: the original's sequence."""
    parts = headers.get(SOURCE_HEADER, "").split()
    return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else seq


def _timestamp(text: str) -> float:
    """RFC 3339 with up to nanoseconds, as the server writes ``Nats-Time-Stamp``."""
    import datetime as dt

    head, _, rest = text.rstrip("Z").partition(".")
    fraction = "".join(ch for ch in rest if ch.isdigit())
    when = dt.datetime.fromisoformat(head).replace(tzinfo=dt.UTC)
    return when.timestamp() + (int(fraction[:9].ljust(9, "0")) / 1e9 if fraction else 0.0)


async def _direct_get_batch(
    js: JetStreamContext, stream: str, request: dict[str, object], *, timeout: float = 5.0
) -> list[StoredMessage] | None:
    """One batched direct get: the messages it returns, until the server's end-of-batch marker.

    ``[]`` when nothing matches; ``None`` when the server refuses the request (too large, not supported).
    """
    import json

    nc: NATS = js._nc
    inbox = nc.new_inbox()
    arrived: asyncio.Queue[Msg] = asyncio.Queue()

    async def on_message(msg: Msg) -> None:
        await arrived.put(msg)

    sub = await nc.subscribe(inbox, cb=on_message)
    out: list[StoredMessage] = []
    try:
        await nc.publish(f"$JS.API.DIRECT.GET.{stream}", json.dumps(request).encode(), reply=inbox)
        while True:
            msg = await asyncio.wait_for(arrived.get(), timeout=timeout)
            headers = dict(msg.headers or {})
            status = headers.get("Status")
            if status == "204":  # end of batch
                return out
            if status == "404":  # nothing (more) matches
                return out
            if status:
                if out:
                    return out
                log.debug("direct get on %s refused: %s %s", stream, status, headers.get("Description"))
                return None
            seq = int(headers["Nats-Sequence"])
            out.append(
                StoredMessage(
                    stream=stream,
                    seq=seq,
                    subject=headers["Nats-Subject"],
                    data=msg.data,
                    headers={k: v for k, v in headers.items() if k not in _DIRECT_GET_HEADERS},
                    time=_timestamp(headers["Nats-Time-Stamp"]),
                    origin_seq=_origin_seq(headers, seq),
                )
            )
    finally:
        await sub.unsubscribe()
