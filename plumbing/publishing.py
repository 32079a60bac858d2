"""Publishing to a stream that may be full: wait for room, never drop, never spin.

Work streams (events, apply messages) discard *new* messages at their byte or message limit: JetStream
refuses the publish (503, error code 10077, "maximum bytes exceeded") and stores nothing, instead of
silently deleting the oldest unread message to make room. A refused message is still only in the
publisher's hands, so the publisher keeps it and tries again with a growing delay, counting each refusal
in ``tjpipe_publish_refused_total{stream}`` and logging a warning, until the consumers make room: a work
stream holds only unfinished work (``contracts.streams``), so room comes back as they catch up. Records
(history, results, dead letters) drop their oldest messages instead and never refuse for room.

A refusal is safe to retry with the same ``Nats-Msg-Id``: the server registers an id only for a message it
stored (checked on a real server in ``tests/security/test_stalls.py``), so the retried copy, or
a later resync of the same observation, is not taken for a duplicate.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Sequence
from typing import Any

import nats.js.errors
from nats.js import JetStreamContext
from nats.js import api as js_api

from plumbing.observability import PUBLISH_REFUSED
from plumbing.retrying import FULL_STREAM

log = logging.getLogger(__name__)

STREAM_FULL_CODE = 10077
"""JetStream's error code for a publish refused at a stream's limit (bytes, messages, per subject)."""


def is_refused(exc: BaseException) -> bool:
    """Whether the stream refused the message because it is full (and stored nothing)."""
    if not isinstance(exc, nats.js.errors.APIError):
        return False
    description = (exc.description or "").lower()
    return (
        exc.err_code == STREAM_FULL_CODE
        or "maximum bytes exceeded" in description
        or ("maximum messages" in description and "exceeded" in description)
    )


def note_refused(exc: BaseException, *, stream: str, subject: str, delay: float) -> bool:
    """Count and log a refusal; ``False`` (nothing noted) when ``exc`` is another failure."""
    if not is_refused(exc):
        return False
    PUBLISH_REFUSED.labels(stream=stream).inc()
    log.warning(
        "stream %s is full (%s); keeping %s and trying again in %.1fs",
        stream,
        getattr(exc, "description", exc),
        subject,
        delay,
    )
    return True


async def publish_stored(
    js: JetStreamContext,
    subject: str,
    payload: bytes,
    *,
    stream: str,
    headers: dict[str, str] | None = None,
    timeout: float = 5.0,
) -> js_api.PubAck:
    """Publish and wait for the PubAck, waiting out a full stream with backoff; other errors propagate."""
    policy = dataclasses.replace(FULL_STREAM, retry_if=is_refused)
    async for attempt in policy.retrying(
        on_retry=lambda exc, wait: note_refused(exc, stream=stream, subject=subject, delay=wait),
    ):
        with attempt:
            return await js.publish(subject, payload, headers=headers, timeout=timeout)
    raise AssertionError("unreachable: the policy retries until the stream takes the message")


async def await_acks(acks: Sequence[asyncio.Future[Any]], *, timeout: float) -> None:
    """Until every PubAck of ``acks`` (``publish_async``'s futures) is in; raises the first error, or
    ``TimeoutError`` once ``timeout`` passes with some still out.

    ``asyncio.wait_for(asyncio.gather(...))`` did this until a NATS node was killed under load: the planner's
    task, cancelled there, left the gather holding its cancellation, which asyncio then reported as an
    exception never retrieved. Here every ack is settled whichever way the wait ends: one still out is
    cancelled (its message is planned again, and the message id makes the repeat free), and one that failed
    has its error retrieved."""
    try:
        done, pending = await asyncio.wait(acks, timeout=timeout, return_when=asyncio.FIRST_EXCEPTION)
    finally:
        for ack in acks:
            if not ack.done():
                ack.cancel()
            elif not ack.cancelled():
                ack.exception()
    for ack in done:
        if not ack.cancelled() and (error := ack.exception()) is not None:
            raise error
    if any(ack.cancelled() for ack in done):
        # The client gave the ack up (its connection closed): whether the stream stored the message is unknown.
        raise ConnectionError("a PubAck was given up before it came")
    if pending:
        raise TimeoutError(f"{len(pending)} of {len(acks)} PubAcks did not come within {timeout:g}s")
