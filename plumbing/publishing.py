"""Publishing to a stream that may be full: wait for room, never drop, never spin.

Work streams (events, apply messages) discard *new* messages at their byte or message limit: JetStream
refuses the publish (503, error code 10077, "maximum bytes exceeded") and stores nothing, instead of
silently deleting the oldest unread message to make room. A refused message is still only in the
publisher's hands, so the publisher keeps it and tries again with a growing delay, counting each refusal
in ``tjpipe_publish_refused_total{stream}`` and logging a warning, until the consumers make room: a work
stream holds only unfinished work (``contracts.streams``), so room comes back as they catch up. Records
(history, results, dead letters) drop their oldest messages instead and never refuse for room.

A refusal is safe to retry with the same ``Nats-Msg-Id``: the server registers an id only for a message it
stored (checked on a real server in ``tests/progress_under_load/test_stalls.py``), so the retried copy, or
a later resync of the same observation, is not taken for a duplicate.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import nats.js.errors
from nats.js import JetStreamContext
from nats.js import api as js_api

from plumbing.observability import PUBLISH_REFUSED
from plumbing.retrying import FULL_STREAM, Policy
from plumbing.signing import SIGNATURE_HEADER, Signer

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


WAIT_FOR_ROOM = dataclasses.replace(FULL_STREAM, retry_if=is_refused)
"""The default: only a full stream's refusal is waited out; any other failure is the caller's."""


@dataclass(frozen=True)
class Outgoing:
    """One message to publish: its subject, its bytes and its headers (message id, trace id)."""

    subject: str
    payload: bytes
    headers: dict[str, str] = field(default_factory=dict)


async def publish(
    js: JetStreamContext,
    messages: Sequence[Outgoing],
    *,
    stream: str,
    signer: Signer | None = None,
    timeout: float = 5.0,
    pipelined: bool = False,
    retry: Policy | None = WAIT_FOR_ROOM,
    on_retry: Callable[[BaseException, float], object] | None = None,
) -> list[js_api.PubAck]:
    """Publish ``messages`` to ``stream`` and wait until it has stored each (its PubAck); their PubAcks.

    Every stage publishes through here; what differs between them is an argument:

    - ``signer`` signs each message for its subject (the watcher's events, the planner's apply messages);
    - ``retry`` is what is tried again in the process and how long to wait: by default a full stream's
      refusal, waited out until there is room (the applier's results); the watcher keeps an event through
      any bus failure (``retrying.BUS_REQUEST``); ``None`` tries once, for a stage that hands its input back
      to the stream instead (the planner naks its event). A refusal is counted and logged whichever it is,
      and ``on_retry(error, wait)`` is told of every failure retried;
    - ``pipelined`` sends every message before waiting for the first PubAck (the planner's plan of several
      components), with ``await_acks``; it is never retried in the process. nats-py loses a PubAck that is
      an error, so a full stream's refusal looks like a lost PubAck there: on a timeout the first message is
      published once more, synchronously, which tells them apart (a stored message answers as a duplicate,
      a refused one raises); either way the timeout, or the refusal, is raised.
    """
    outgoing = [_signed(message, signer) for message in messages]
    if pipelined:
        futures = [await js.publish_async(m.subject, m.payload, headers=m.headers) for m in outgoing]
        try:
            await await_acks(futures, timeout=timeout)
        except TimeoutError:
            first = outgoing[0]
            await js.publish(first.subject, first.payload, headers=first.headers, timeout=timeout)
            raise
        return [future.result() for future in futures]
    return [await _publish_one(js, m, stream=stream, timeout=timeout, retry=retry, on_retry=on_retry) for m in outgoing]


def _signed(message: Outgoing, signer: Signer | None) -> Outgoing:
    if signer is None:
        return message
    headers = {**message.headers, SIGNATURE_HEADER: signer.sign(message.subject, message.payload)}
    return Outgoing(message.subject, message.payload, headers)


async def _publish_one(
    js: JetStreamContext,
    message: Outgoing,
    *,
    stream: str,
    timeout: float,
    retry: Policy | None,
    on_retry: Callable[[BaseException, float], object] | None,
) -> js_api.PubAck:
    headers = message.headers or None
    if retry is None:
        return await js.publish(message.subject, message.payload, headers=headers, timeout=timeout)

    def retried(exc: BaseException, wait: float) -> None:
        note_refused(exc, stream=stream, subject=message.subject, delay=wait)
        if on_retry is not None:
            on_retry(exc, wait)

    return await retry.call(
        lambda: js.publish(message.subject, message.payload, headers=headers, timeout=timeout), on_retry=retried
    )


async def publish_stored(
    js: JetStreamContext,
    subject: str,
    payload: bytes,
    *,
    stream: str,
    headers: dict[str, str] | None = None,
    timeout: float = 5.0,
) -> js_api.PubAck:
    """One message through ``publish``, waiting out a full stream; other errors propagate."""
    (ack,) = await publish(js, [Outgoing(subject, payload, dict(headers or {}))], stream=stream, timeout=timeout)
    return ack


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
