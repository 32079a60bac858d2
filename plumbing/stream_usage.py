"""How full each stream is, as gauges and a log line, so that a full record is seen, not only felt.

Records (the history streams, results, dead letters) drop their oldest messages at their byte limit, which
costs nothing but history, and nothing would say so: the gauges ``tjpipe_stream_bytes{stream}`` and
``tjpipe_stream_max_bytes{stream}`` let an alert fire as one nears its limit, and a line is logged when one
reaches it (and when it has room again). Work streams are included too: a full one means work waits.

Stream info is read with the identity's ``$JS.API.STREAM.INFO`` right only; the applier runs this, since it
runs wherever the pipeline does and its identity may read stream info and nothing more of these streams.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable

from nats.js import JetStreamContext

from plumbing.observability import STREAM_BYTES, STREAM_MAX_BYTES

log = logging.getLogger(__name__)

FULL_AT = 0.98
"""A stream holding this share of its byte limit is full: the next messages push the oldest out."""
MESSAGE_ROOM = 1024 * 1024
"""A stream at its limit drops old messages until the new one fits, so it may sit up to one message below
the limit: a gap smaller than a large message (at most a quarter of the limit) is full too."""
INTERVAL_SECONDS = 15.0


def is_full(held: int, limit: int) -> bool:
    if limit <= 0:
        return False
    return limit - held <= max((1 - FULL_AT) * limit, min(MESSAGE_ROOM, limit / 4))


class StreamUsage:
    """Reads each stream's size and limit into the gauges; logs a stream becoming full or having room again."""

    def __init__(self, js: JetStreamContext, streams: Iterable[str], *, records: Iterable[str] = ()) -> None:
        self.js = js
        self.streams = tuple(streams)
        self.records = frozenset(records)
        self._full: set[str] = set()

    async def check(self) -> None:
        for stream in self.streams:
            try:
                info = await self.js.stream_info(stream)
            except Exception as exc:  # the bus is away, or the stream not made yet: the next round tries again
                log.debug("stream info of %s failed: %s", stream, exc)
                continue
            held, limit = info.state.bytes, info.config.max_bytes if info.config.max_bytes is not None else -1
            STREAM_BYTES.labels(stream=stream).set(held)
            STREAM_MAX_BYTES.labels(stream=stream).set(limit)
            self._note(stream, held, limit)

    def _note(self, stream: str, held: int, limit: int) -> None:
        full = is_full(held, limit)
        if full and stream not in self._full:
            self._full.add(stream)
            if stream in self.records:
                log.warning(
                    "stream %s is full (%d of %d bytes): it now drops its oldest records to keep new ones; "
                    "raise its _MAX_BYTES or shorten its _MAX_AGE to keep the history you need",
                    stream,
                    held,
                    limit,
                )
            else:
                log.warning(
                    "stream %s is full (%d of %d bytes): publishers wait until its consumers catch up",
                    stream,
                    held,
                    limit,
                )
        elif not full and stream in self._full:
            self._full.discard(stream)
            log.info("stream %s has room again (%d of %d bytes)", stream, held, limit)

    async def run(self, stop: asyncio.Event, *, interval: float = INTERVAL_SECONDS) -> None:
        while not stop.is_set():
            await self.check()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=interval)
