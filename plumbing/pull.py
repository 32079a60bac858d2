"""A pull consumer that hands each message over the moment it arrives.

nats.py's ``fetch(n)`` returns once it holds ``n`` messages or its pull request expires. When a partition
is quiet, the message that wakes a waiting request is then held until that request expires: up to the
whole fetch timeout, for about one message in fifty at the paced benchmark rate. That hold was the whole
of the planner's p99 latency.

This consumer keeps a pull request open on the server instead and takes messages as they come, the way
the newer NATS clients' ``consume`` does: it asks for ``batch`` messages, counts what arrives and what
the server reports as unfilled when a request ends, and asks again when half of the window is used. A
batch handed to the caller is whatever has arrived so far, so a burst is still handled in batches and a
lone message is not kept waiting. A request dies with the connection it was sent on: after the client
reconnects, the window is requested afresh at once. Idle heartbeats tell a live request from one lost
otherwise (a leader change on the server's side); after a silence of three heartbeats the window is
requested afresh. Asking too much is harmless (the consumer's ``max_ack_pending`` still bounds what is
delivered); asking too little would stall, so every doubt resolves towards asking again.

A heartbeat is a message from the server and a wake-up of the waiting loop, for each held partition: at one
a second, sixteen partitions cost a quiet planner or applier more CPU than anything else it did, and the
server as much again. Every ``HEARTBEAT_SECONDS`` keeps that to a fifth; since a lost connection is told
by the client's own reconnect count, only a request lost on the server's side waits the longer silence.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import deque

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import api as js_api

JS_API_PREFIX = "$JS.API"

_STATUS = js_api.Header.STATUS
_PENDING_MESSAGES = "Nats-Pending-Messages"
_HEARTBEAT = js_api.StatusCode.CONTROL_MESSAGE  # "100"
_REQUEST_ENDED = frozenset({js_api.StatusCode.REQUEST_TIMEOUT, js_api.StatusCode.NO_MESSAGES})  # 408, 404


EXPIRES_SECONDS = 30.0
"""How long a standing pull request waits for work before it is sent again."""

HEARTBEAT_SECONDS = 5.0
"""How often the server tells a waiting request is alive; three missed ones and it is asked again."""


class StreamingPull:
    """One durable pull consumer read through a standing request window of ``batch`` messages."""

    def __init__(
        self,
        nc: NATS,
        *,
        stream: str,
        durable: str,
        batch: int,
        expires: float = EXPIRES_SECONDS,
        heartbeat: float = HEARTBEAT_SECONDS,
    ) -> None:
        self._nc = nc
        self._next_subject = f"{JS_API_PREFIX}.CONSUMER.MSG.NEXT.{stream}.{durable}"
        self.batch = max(1, batch)
        self.expires = expires
        self.heartbeat = min(heartbeat, expires / 3)  # the server refuses a heartbeat near the expiry
        self._buffer: deque[Msg] = deque()
        self._arrival = asyncio.Event()
        self._inbox = ""
        self._sub: Subscription | None = None
        self._outstanding = 0
        """Messages asked for and neither delivered nor reported unfilled."""
        self._last_heard = time.monotonic()
        self._asked_on = 0
        """The client's reconnect count when the window was last asked for."""

    async def start(self) -> None:
        self._inbox = self._nc.new_inbox()
        self._sub = await self._nc.subscribe(self._inbox, cb=self._arrived)

    async def stop(self) -> None:
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()
            self._sub = None

    async def _arrived(self, msg: Msg) -> None:
        self._last_heard = time.monotonic()
        status = msg.headers.get(_STATUS) if msg.headers else None
        if not status:
            self._outstanding = max(0, self._outstanding - 1)
            self._buffer.append(msg)
            self._arrival.set()
            return
        if status == _HEARTBEAT:
            return
        unfilled = msg.headers.get(_PENDING_MESSAGES) if msg.headers else None
        if status in _REQUEST_ENDED and unfilled is not None and unfilled.isdigit():
            self._outstanding = max(0, self._outstanding - int(unfilled))
        else:
            # 409 (leadership change, consumer deleted, too many waiting requests) or an unknown status:
            # which request it ended is not known, so start the window over.
            self._outstanding = 0
        self._arrival.set()  # a request ended: the waiting loop asks again now, not at its next heartbeat

    async def _top_up(self) -> None:
        silent = time.monotonic() - self._last_heard > 3 * self.heartbeat
        if self._outstanding and (silent or self._nc.stats["reconnects"] != self._asked_on):
            self._outstanding = 0  # the request died with its connection, or (no heartbeat) with a leader
        if self._outstanding > self.batch // 2 or not self._nc.is_connected:
            return
        wanted = self.batch - self._outstanding
        request = {
            "batch": wanted,
            "expires": int(self.expires * 1e9),
            "idle_heartbeat": int(self.heartbeat * 1e9),
        }
        await self._nc.publish(self._next_subject, json.dumps(request).encode(), reply=self._inbox)
        self._outstanding += wanted
        self._asked_on = self._nc.stats["reconnects"]
        self._last_heard = time.monotonic()

    async def next_batch(self, timeout: float) -> list[Msg]:
        """Every message that has arrived, waiting up to ``timeout`` for the first; empty when none came."""
        await self._top_up()
        deadline = time.monotonic() + timeout
        while not self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return []
            self._arrival.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._arrival.wait(), timeout=min(remaining, self.heartbeat))
            if not self._buffer:
                await self._top_up()
        count = min(len(self._buffer), self.batch)
        return [self._buffer.popleft() for _ in range(count)]
