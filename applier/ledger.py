"""The per-target ledger in JetStream KV: the fence that keeps old plans from overwriting newer ones.

Every applier replica shares it. Each key holds the newest plan version an applier has claimed or applied
for one target; claims are compare-and-set on the key's revision, so of two appliers holding different
plans for the same target, the one with the older plan either loses the claim or finds the newer claim
when its conditional write to the API server fails — and stands down either way. The record also keeps
what was applied (a digest) and how the live object looked afterwards, which is what lets a repeated
apply be recognised and skipped with a single read instead of a write.

Each applier also remembers the records it last read or wrote, and assumes a target it has never seen
has no record. Neither needs to be true: every write is a compare-and-set on the remembered revision,
so a wrong memory only makes the write fail, which forgets the key and sends the caller back for a fresh
read. Partitions give each target one applier at a time, so the memory is nearly always right, and a
message then costs one KV round trip fewer. Whatever is decided without a write (a skip) only ever
leaves the target as it is.
"""

from __future__ import annotations

from collections import OrderedDict

import msgspec
from nats.js import JetStreamContext
from nats.js.errors import BadRequestError, KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from contracts.messages import AppliedRecord, Target
from contracts.streams import APPLIED_BUCKET
from plumbing.bus_setup import until_set_up

_decoder = msgspec.json.Decoder(AppliedRecord)


def seen_key(namespace: str, name: str) -> str:
    """The key naming the TrainJob of this name the appliers have counted as created: its uid."""
    return f"{namespace}.trainjob.{name}.seen"


def ledger_key(target: Target) -> str:
    key = f"{target.namespace}.{target.kind.lower()}.{target.name}"
    return f"{key}.{target.subresource}" if target.subresource else key


class Ledger:
    def __init__(self, kv: KeyValue, *, remember: int = 8192) -> None:
        self.kv = kv
        self._remember = remember
        self._known: OrderedDict[str, tuple[AppliedRecord | None, int]] = OrderedDict()
        self._seen: OrderedDict[str, str] = OrderedDict()

    @classmethod
    async def open(cls, js: JetStreamContext) -> Ledger:
        """Bind to the ledger bucket the admin set-up made (``plumbing.bus_setup.setup_bus``); wait until it exists."""
        kv = await until_set_up(lambda: js.key_value(APPLIED_BUCKET), what=f"KV bucket {APPLIED_BUCKET}")
        return cls(kv)

    async def read(self, key: str, *, assume_absent: bool = False) -> tuple[AppliedRecord | None, int]:
        """The record and the key's revision; ``(None, 0)`` when there is none.

        A remembered record is returned without asking the server. ``assume_absent`` also answers
        ``(None, 0)`` for a key never seen, for callers whose next step is a compare-and-set write anyway.
        """
        known = self._known.get(key)
        if known is not None:
            self._known.move_to_end(key)
            return known
        if assume_absent:
            return None, 0
        return await self.read_fresh(key)

    async def read_fresh(self, key: str) -> tuple[AppliedRecord | None, int]:
        try:
            entry = await self.kv.get(key)
        except KeyNotFoundError:
            self.forget(key)
            return None, 0
        record: AppliedRecord | None = None
        if entry.value is not None:
            try:
                record = _decoder.decode(entry.value)
            except msgspec.DecodeError:
                record = None
        revision = entry.revision or 0
        self._note(key, record, revision)
        return record, revision

    async def write(self, key: str, record: AppliedRecord, *, revision: int) -> int | None:
        """Compare-and-set: the new revision, or ``None`` when someone else wrote the key first."""
        payload = msgspec.json.encode(record)
        try:
            if revision == 0:
                written = await self.kv.create(key, payload)
            else:
                written = await self.kv.update(key, payload, last=revision)
        except (KeyWrongLastSequenceError, BadRequestError):
            self.forget(key)
            return None
        self._note(key, record, written)
        return written

    async def record_written(self, key: str, record: AppliedRecord, *, revision: int, claimed: bool = True) -> None:
        """Record what a write to the API server left, on the revision of the claim it was made under.

        A claimed target's record that loses its compare-and-set is left as it is: whoever wrote the key
        meanwhile holds a newer claim. A status is written without a claim (``claimed=False``), so the revision
        its round read may be out of date (a record this applier never read, after a restart): it is recorded
        on the fresh one instead, unless a newer plan's record is there by now.
        """
        if await self.write(key, record, revision=revision) is not None or claimed:
            return
        fresh, fresh_revision = await self.read_fresh(key)
        if fresh is None or fresh.source_version <= record.source_version:
            await self.write(key, record, revision=fresh_revision)

    async def first_sight(self, key: str, uid: str) -> bool:
        """Record that the TrainJob ``uid`` was seen under ``key``; whether this call was the first to.

        Compare-and-set, like every write here: of any number of appliers, restarts and redeliveries, exactly
        one call returns True per uid (a TrainJob made again under the same name has a new uid).
        """
        if self._seen.get(key) == uid:
            self._seen.move_to_end(key)
            return False
        try:
            await self.kv.create(key, uid.encode())
            first = True
        except (KeyWrongLastSequenceError, BadRequestError):
            try:
                entry = await self.kv.get(key)
            except KeyNotFoundError:
                return False  # deleted meanwhile: the next message asks again
            first = False
            if entry.value != uid.encode():
                try:
                    await self.kv.update(key, uid.encode(), last=entry.revision)
                    first = True
                except (KeyWrongLastSequenceError, BadRequestError):
                    return False  # another applier recorded it first; it counts
        self._seen[key] = uid
        while len(self._seen) > self._remember:
            self._seen.popitem(last=False)
        return first

    def forget(self, key: str) -> None:
        self._known.pop(key, None)

    def _note(self, key: str, record: AppliedRecord | None, revision: int) -> None:
        if record is None:
            # A tombstone or an unreadable value: nothing worth remembering; the next read asks again.
            self.forget(key)
            return
        self._known[key] = (record, revision)
        self._known.move_to_end(key)
        while len(self._known) > self._remember:
            self._known.popitem(last=False)
