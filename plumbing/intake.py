"""What a stage does with a message before it does its work: verify, decode, or dead-letter and terminate.

The planner and the applier take their input from a stream anyone on the bus might have written to, so
both read a message the same way: first the signature (nothing unsigned is decoded, let alone acted on),
then the one decoder for the wire shape the stage consumes. A message that fails either check can never
succeed, however often it is delivered, so it is kept on the dead-letter stream, with why, and terminated
there and then; the stage sees only messages that passed both.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

import msgspec
from nats.aio.msg import Msg

from tjpipe.contracts.messages import UnsupportedVersion
from tjpipe.plumbing import signing

T = TypeVar("T")

Reject = Callable[[str, str], Awaitable[None]]
"""The stage's own dead letter for a message it refuses, called with ``(reason, error)``."""


async def admit(msg: Msg, *, keyring: signing.Keyring, decode: Callable[[bytes], T], reject: Reject) -> T | None:
    """The decoded message, or ``None`` once a message that fails a check is dead-lettered and terminated.

    The dead letter's reason is the signature check's own (``unsigned``, ``bad-signature``, ...),
    ``unsupported-version`` for a newer wire version than this reader's, or ``undecodable``.
    """
    try:
        keyring.verify(msg.subject, msg.data, msg.headers)
    except signing.SignatureError as exc:
        await _refuse(msg, reject, exc.reason, str(exc))
        return None
    try:
        return decode(msg.data)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        reason = exc.reason if isinstance(exc, UnsupportedVersion) else "undecodable"
        await _refuse(msg, reject, reason, str(exc))
        return None


async def _refuse(msg: Msg, reject: Reject, reason: str, error: str) -> None:
    await reject(reason, error)
    await msg.term()
