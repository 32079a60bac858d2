"""The per-target ledger in JetStream KV: the fence that keeps old plans from overwriting newer ones.

Every applier replica shares it. Each key holds the newest plan version an applier has claimed or applied
for one target; claims are compare-and-set on the key's revision, so of two appliers holding different
plans for the same target, the one with the older plan either loses the claim or finds the newer claim
when its conditional write to the API server fails — and stands down either way. The record also keeps
what was applied (a digest) and how the live object looked afterwards, which is what lets a repeated
apply be recognised and skipped with a single read instead of a write.
"""

from __future__ import annotations

import msgspec
from nats.js import JetStreamContext
from nats.js.errors import BadRequestError, KeyNotFoundError, KeyWrongLastSequenceError, NotFoundError
from nats.js.kv import KeyValue

from contracts.messages import AppliedRecord, Target
from contracts.streams import APPLIED_BUCKET

_decoder = msgspec.json.Decoder(AppliedRecord)


def ledger_key(target: Target) -> str:
    key = f"{target.namespace}.{target.kind.lower()}.{target.name}"
    return f"{key}.{target.subresource}" if target.subresource else key


class Ledger:
    def __init__(self, kv: KeyValue) -> None:
        self.kv = kv

    @classmethod
    async def open(cls, js: JetStreamContext, *, replicas: int = 1) -> Ledger:
        try:
            kv = await js.key_value(APPLIED_BUCKET)
        except (NotFoundError, BadRequestError):
            kv = await js.create_key_value(bucket=APPLIED_BUCKET, history=1, replicas=replicas)
        return cls(kv)

    async def read(self, key: str) -> tuple[AppliedRecord | None, int]:
        """The record and the key's revision; ``(None, 0)`` when there is none."""
        try:
            entry = await self.kv.get(key)
        except KeyNotFoundError:
            return None, 0
        if entry.value is None:
            return None, entry.revision or 0
        try:
            return _decoder.decode(entry.value), entry.revision or 0
        except msgspec.DecodeError:
            return None, entry.revision or 0

    async def write(self, key: str, record: AppliedRecord, *, revision: int) -> int | None:
        """Compare-and-set: the new revision, or ``None`` when someone else wrote the key first."""
        payload = msgspec.json.encode(record)
        try:
            if revision == 0:
                return await self.kv.create(key, payload)
            return await self.kv.update(key, payload, last=revision)
        except (KeyWrongLastSequenceError, BadRequestError):
            return None
