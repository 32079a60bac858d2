"""Sharing a fixed set of partitions among the live replicas of a service, through JetStream KV leases.

Subjects carry a partition number (``contracts.subjects``) and every partition has its own durable pull
consumer, so whoever holds a partition sees its TrainJobs in order and alone. Replicas announce themselves
with a membership key and claim partitions with ``create`` (which fails if the key exists); every key
lives in a bucket with a TTL, so a replica that dies simply stops renewing and its membership and
partitions expire within seconds. Each replica aims for its fair share, ``ceil(partitions / members)``:
it claims free partitions up to that number and lets go of extras when new replicas join, so load spreads
without any coordinator.

A replica that loses a lease (a long pause, a partition of the network) stops its consumer for that
partition at the next renewal; until then two replicas may briefly both work on it. The applier's ledger
fence makes that harmless: the older plan loses.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import socket
from collections.abc import Awaitable, Callable

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.errors import BadRequestError, KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from contracts.streams import ConsumerSpec
from contracts.subjects import PARTITIONS
from plumbing.bus_history import read_stream
from plumbing.bus_setup import LEASE_BUCKET, bind_consumers, partition_consumer, until_set_up
from plumbing.observability import CONSUMER_LAG, PARTITIONS_OWNED
from plumbing.pull import StreamingPull
from plumbing.tasks import cancel_and_wait
from plumbing.work_trim import SWEEP_SECONDS, WorkTrim

log = logging.getLogger(__name__)

_DELETED = frozenset({"DEL", "PURGE"})
_MARKER = "Nats-Marker-Reason"


def default_replica_id() -> str:
    """Host and process: unique per replica. ``--replica-id`` / ``TJPIPE_REPLICA_ID`` (read by the CLI) replaces it."""
    return f"{socket.gethostname()}-{os.getpid()}"


async def open_lease_bucket(js: JetStreamContext) -> KeyValue:
    """Bind to the lease bucket the admin set-up made (``plumbing.bus_setup.setup_bus``); wait until it exists."""
    return await until_set_up(lambda: js.key_value(LEASE_BUCKET), what=f"KV bucket {LEASE_BUCKET}")


class PartitionLeases:
    """Keeps this replica's fair share of partitions and starts or stops a worker for each."""

    def __init__(
        self,
        kv: KeyValue,
        *,
        role: str,
        replica: str,
        on_acquire: Callable[[int], Awaitable[None]],
        on_release: Callable[[int], Awaitable[None]],
        partitions: int = PARTITIONS,
        ttl: float = 6.0,
    ) -> None:
        self.kv = kv
        self.role = role
        self.replica = replica.replace(".", "_")
        self.partitions = partitions
        self.ttl = ttl
        self.on_acquire = on_acquire
        self.on_release = on_release
        self.owned: dict[int, int] = {}
        """partition → revision of our lease key."""

    def _key(self, partition: int) -> str:
        return f"{self.role}.p{partition}"

    async def _members(self) -> int:
        """Live members of this role: the newest entry of each member key that is not a delete marker.

        Read with one batched direct get, which needs no consumer (the services may not create one).
        """
        found = await read_stream(
            self.kv._js, self.kv._stream, f"{self.kv._pre}{self.role}.member.>", last_per_subject=True
        )
        live = [m for m in found if m.headers.get("KV-Operation") not in _DELETED and not m.headers.get(_MARKER)]
        return max(1, len(live))

    async def tick(self) -> None:
        """One round: announce, renew, rebalance. Public so tests can drive it step by step."""
        held = list(self.owned.items())
        me = self.replica.encode()
        # Sent together, answered together: one write to the bus per round, not a round trip per key.
        announced, *renewed = await asyncio.gather(
            self.kv.put(f"{self.role}.member.{self.replica}", me),
            *(self.kv.update(self._key(partition), me, last=revision) for partition, revision in held),
            return_exceptions=True,
        )
        failed: BaseException | None = announced if isinstance(announced, BaseException) else None
        for (partition, _), answer in zip(held, renewed, strict=True):
            if isinstance(answer, (KeyWrongLastSequenceError, BadRequestError, KeyNotFoundError)):
                log.warning("%s lost partition %d", self.role, partition)
                del self.owned[partition]
                await self.on_release(partition)
            elif isinstance(answer, BaseException):
                failed = failed or answer  # kept until the next round, which renews it on the same revision
            else:
                self.owned[partition] = answer
        if failed is not None:
            raise failed
        share = math.ceil(self.partitions / await self._members())
        while len(self.owned) > share:
            partition = max(self.owned)
            revision = self.owned.pop(partition)
            await self.on_release(partition)
            with contextlib.suppress(Exception):
                await self.kv.delete(self._key(partition), last=revision)
            log.info("%s released partition %d (share is %d)", self.role, partition, share)
        if len(self.owned) < share:
            for partition in self._claim_order():
                if len(self.owned) >= share:
                    break
                if partition in self.owned:
                    continue
                try:
                    revision = await self.kv.create(self._key(partition), self.replica.encode())
                except (KeyWrongLastSequenceError, BadRequestError):
                    continue
                self.owned[partition] = revision
                log.info("%s acquired partition %d", self.role, partition)
                await self.on_acquire(partition)

    def _claim_order(self) -> list[int]:
        # Start at a replica-specific offset so replicas starting together do not race for the same keys.
        offset = sum(self.replica.encode()) % self.partitions
        return [(offset + i) % self.partitions for i in range(self.partitions)]

    async def run(self, stop: asyncio.Event) -> None:
        try:
            while not stop.is_set():
                try:
                    await self.tick()
                except Exception as exc:  # the bus is away: keep what we have, try again
                    log.warning("%s lease round failed: %s", self.role, exc)
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=self.ttl / 3)
        finally:
            for partition, revision in list(self.owned.items()):
                await self.on_release(partition)
                with contextlib.suppress(Exception):
                    await self.kv.delete(self._key(partition), last=revision)
            self.owned.clear()
            with contextlib.suppress(Exception):
                await self.kv.delete(f"{self.role}.member.{self.replica}")


class PartitionedConsumer:
    """A pull loop per held partition, on that partition's durable consumer."""

    def __init__(
        self,
        nc: NATS,
        js: JetStreamContext,
        spec: ConsumerSpec,
        handle_batch: Callable[[list[Msg]], Awaitable[None]],
        *,
        batch: int,
        trim: WorkTrim | None = None,
    ) -> None:
        self.nc = nc
        self.js = js
        self.spec = spec
        self.handle_batch = handle_batch
        self.batch = batch
        self.trim = trim
        self._tasks: dict[int, asyncio.Task[None]] = {}

    async def acquire(self, partition: int) -> None:
        spec = partition_consumer(self.spec, partition)  # made by the admin set-up; bound, never created here
        pull = StreamingPull(self.nc, stream=spec.stream, durable=spec.durable, batch=self.batch)
        await pull.start()
        self._tasks[partition] = asyncio.create_task(self._loop(pull, spec.durable, partition))
        if self.trim is not None:
            self.trim.acquired(partition)
        PARTITIONS_OWNED.labels(role=self.spec.durable).set(len(self._tasks))

    async def release(self, partition: int) -> None:
        task = self._tasks.pop(partition, None)
        if task is not None:
            await cancel_and_wait(task)
        if self.trim is not None:
            self.trim.forget(partition)
        # The replica that takes the partition reports its lag from now on; a last value left here would
        # stay on the dashboard for ever, as if the backlog had stopped moving.
        with contextlib.suppress(KeyError):
            CONSUMER_LAG.remove(partition_consumer(self.spec, partition).durable)
        PARTITIONS_OWNED.labels(role=self.spec.durable).set(len(self._tasks))

    async def _loop(self, pull: StreamingPull, durable: str, partition: int) -> None:
        try:
            while True:
                try:
                    msgs = await pull.next_batch(timeout=5.0)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # the bus is away; the client reconnects by itself
                    log.warning("pulling from %s failed: %s", durable, exc)
                    await asyncio.sleep(0.5)
                    continue
                if msgs:
                    CONSUMER_LAG.labels(consumer=durable).set(msgs[-1].metadata.num_pending or 0)
                    await self.handle_batch(msgs)
                    if self.trim is not None:
                        self.trim.touched(partition)
        finally:
            await pull.stop()


async def consume_partitioned(
    nc: NATS,
    js: JetStreamContext,
    spec: ConsumerSpec,
    handle_batch: Callable[[list[Msg]], Awaitable[None]],
    *,
    role: str,
    replica: str,
    batch: int,
    lease_ttl: float,
    work_sweep_seconds: float = SWEEP_SECONDS,
    stop: asyncio.Event,
) -> None:
    """Hold a fair share of the partitions of ``spec`` until ``stop``, feeding each one's batches in order."""
    trim = WorkTrim(nc, js, spec, sweep_interval=work_sweep_seconds)
    consumer = PartitionedConsumer(nc, js, spec, handle_batch, batch=batch, trim=trim)
    await bind_consumers(js, spec)
    bucket = await open_lease_bucket(js)
    leases = PartitionLeases(
        bucket,
        role=role,
        replica=replica,
        on_acquire=consumer.acquire,
        on_release=consumer.release,
        ttl=lease_ttl,
    )
    log.info("%s %s running", role, replica)
    trimming = asyncio.create_task(trim.run(stop))
    try:
        await leases.run(stop)
    finally:
        await cancel_and_wait(trimming)
