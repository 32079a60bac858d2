"""What a stage does with a message before it does its work: verify, decode, or dead-letter and terminate.

The planner and the applier take their input from a stream anyone on the bus might have written to, so
both read a message the same way: first the signature (nothing unsigned is decoded, let alone acted on),
then the one decoder for the wire shape the stage consumes. A message that fails either check can never
succeed, however often it is delivered, so it is kept on the dead-letter stream, with why, and terminated
there and then; the stage sees only messages that passed both.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import msgspec

from contracts.messages import UnsupportedVersion
from plumbing import signing
from plumbing.delivery import Delivery

T = TypeVar("T")


async def admit(delivery: Delivery[Any], *, keyring: signing.Keyring, decode: Callable[[bytes], T]) -> T | None:
    """The decoded message (also kept as ``delivery.decoded``), or ``None`` once a message that fails a check
    is dead-lettered and terminated.

    The dead letter's reason is the signature check's own (``unsigned``, ``bad-signature``, ...),
    ``unsupported-version`` for a newer wire version than this reader's, or ``undecodable``.
    """
    msg = delivery.msg
    try:
        keyring.verify(msg.subject, msg.data, msg.headers)
    except signing.SignatureError as exc:
        await delivery.dead_letter(reason=exc.reason, error=str(exc))
        return None
    try:
        decoded = decode(msg.data)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        reason = exc.reason if isinstance(exc, UnsupportedVersion) else "undecodable"
        await delivery.dead_letter(reason=reason, error=str(exc))
        return None
    delivery.decoded = decoded
    return decoded
