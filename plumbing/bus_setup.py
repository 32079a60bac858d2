"""Setting the bus up and binding to it: streams, durable consumers and KV buckets.

Kept apart from the connection (``plumbing.bus``) because two kinds of caller use it differently: the admin
set-up (``tjpipe bus-setup``, ``tjpipe up``, the test fixtures, the deployment's set-up Job) makes every
stream, consumer and bucket in one place, :func:`setup_bus`, in an order that lets a bus made by an older
version be upgraded without loss; a service may not create, change or delete any of them, so it only binds to
what exists and waits, with a log line saying what is missing, until the set-up has run (:func:`until_set_up`).
``add_consumer`` is create-or-update on the server; streams need an explicit update when their settings
changed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import nats
import nats.errors
import nats.js.errors
from nats.js import JetStreamContext
from nats.js import api as js_api
from nats.js.errors import BadRequestError

from contracts.streams import APPLIED_BUCKET, APPLIER, BUCKETS, PLANNER, BucketSpec, ConsumerSpec, StreamSpec
from contracts.subjects import PARTITIONS
from plumbing import retrying
from plumbing.bus import require_admin

log = logging.getLogger(__name__)

T = TypeVar("T")

LEASE_BUCKET = "tj_leases"
"""KV bucket of partition leases, keys ``<role>.p<partition>`` and ``<role>.member.<replica>``."""
LEASE_TTL_SECONDS = 6.0


def effective_retention(spec: StreamSpec) -> str:
    """The retention a stream gets: a work stream's interest retention only on a single server.

    On a JetStream cluster (replicas > 1) interest retention lost work in tests/scale: apply messages
    published while the stream's leader was frozen and then killed were gone from the stream although no
    applier had acknowledged them. Until that is understood, replicated work streams keep limits retention,
    and their consumers remove what is acknowledged and recorded themselves (``plumbing.work_trim``).
    """
    return "limits" if spec.replicas > 1 else spec.retention


def _stream_config(spec: StreamSpec, *, retention: str | None = None) -> js_api.StreamConfig:
    """The server's config for ``spec``; ``retention`` overrides the spec's (the upgrade's first step)."""
    chosen = retention or effective_retention(spec)
    return js_api.StreamConfig(
        name=spec.name,
        description=spec.description,
        subjects=list(spec.subjects),
        sources=[js_api.StreamSource(name=source) for source in spec.sources] or None,
        retention=js_api.RetentionPolicy.INTEREST if chosen == "interest" else js_api.RetentionPolicy.LIMITS,
        storage=js_api.StorageType.FILE,
        max_age=spec.max_age_seconds,
        max_bytes=spec.max_bytes,
        max_msgs_per_subject=spec.max_msgs_per_subject,
        duplicate_window=spec.duplicate_window_seconds,
        num_replicas=spec.replicas,
        discard=js_api.DiscardPolicy.NEW if spec.discard == "new" else js_api.DiscardPolicy.OLD,
        allow_direct=True,
    )


async def ensure_streams(js: JetStreamContext, specs: tuple[StreamSpec, ...]) -> None:
    """Create or update every stream; retried while a JetStream cluster is still electing leaders."""
    await until_done(lambda: _ensure_streams(js, specs), what="setting up the streams")


class NotPlacedYet(Exception):
    """A JetStream cluster cannot place a replicated stream yet (a peer not up or not known yet): set-up waits."""


STREAM_NAME_IN_USE = 10058
"""JetStream's error code for a stream that exists with another configuration (the stream is then updated)."""
NO_PEERS_FOR_PLACEMENT = 10005
"""JetStream's error code for "no suitable peers for placement": a cluster still forming or missing a peer."""

_SETUP_RETRYABLE = (
    TimeoutError,
    nats.errors.TimeoutError,
    nats.errors.NoRespondersError,
    nats.js.errors.ServiceUnavailableError,
    NotPlacedYet,
)


async def until_done(step: Callable[[], Awaitable[T]], *, what: str, attempts: int = 30) -> T:
    """Run a bus set-up step again after a timeout or a transient refusal, with backoff, a bounded number
    of times: a cluster that is busy creating replicated streams must not make a service exit."""
    policy = dataclasses.replace(retrying.BUS_SET_UP, retry_on=_SETUP_RETRYABLE, attempts=attempts)
    async for attempt in policy.retrying(
        on_retry=lambda exc, wait: log.warning("%s failed (%s); trying again in %.1fs", what, exc, wait)
    ):
        with attempt:
            return await step()
    raise AssertionError("unreachable: the policy raises the last failure when it stops")


async def _ensure_streams(js: JetStreamContext, specs: tuple[StreamSpec, ...]) -> None:
    """Create or update the streams; switch the work streams to their retention only once they are recorded.

    The order is what makes an upgrade of a bus made by an older version (every stream limits retention,
    no history streams) lose nothing: a work stream is first written with the retention it already has
    (limits when new), then every history stream is made and starts copying from the first message its
    work stream holds, and only once each source is running does a work stream get interest retention,
    which lets the server drop what is acknowledged and recorded. The source's own consumer keeps any
    message it has not copied yet. Run again, every step finds its work done.
    """
    recorded = [spec for spec in specs if spec.sources]
    switching: set[str] = set()
    for spec in specs:
        if spec.sources:
            continue
        current = await _current_retention(js, spec.name) or "limits"
        if current != effective_retention(spec):
            switching.add(spec.name)
        await put_stream(js, _stream_config(spec, retention=current))
    for spec in recorded:
        await put_stream(js, _stream_config(spec))
    for spec in recorded:
        if switching & set(spec.sources):
            await _until_sourcing(js, spec.name)
    for spec in specs:
        if spec.name in switching:
            log.info("stream %s now has %s retention", spec.name, effective_retention(spec))
            await put_stream(js, _stream_config(spec))


async def put_stream(js: JetStreamContext, config: js_api.StreamConfig) -> None:
    """Create the stream, or update it where it exists with another configuration.

    Only that refusal means "it exists": a cluster still forming refuses a replicated stream with "no suitable
    peers for placement" (also a 400), and reading that as "exists" made the update that followed fail with
    "stream not found" instead of waiting for the peers (``NotPlacedYet``, retried by ``until_done``)."""
    try:
        await js.add_stream(config)
    except BadRequestError as exc:
        if exc.err_code == NO_PEERS_FOR_PLACEMENT:
            raise NotPlacedYet(exc.description or "no suitable peers for placement") from exc
        if exc.err_code != STREAM_NAME_IN_USE:
            raise
        await js.update_stream(config)


async def _current_retention(js: JetStreamContext, stream: str) -> str | None:
    try:
        info = await js.stream_info(stream)
    except nats.js.errors.NotFoundError:
        return None
    return "interest" if info.config.retention == js_api.RetentionPolicy.INTEREST else "limits"


SOURCE_START_SECONDS = 120.0


async def _until_sourcing(js: JetStreamContext, stream: str, *, timeout: float = SOURCE_START_SECONDS) -> None:
    """Wait until every source of ``stream`` runs and has caught up once (an upgrade copies the old history).

    Once a source runs, its consumer on the work stream keeps whatever it has not copied, so after that a
    work stream may drop what its own consumers acknowledged. A source that has not started within the
    timeout fails the set-up (it is run again), rather than risk a record with a hole in it.
    """
    deadline = time.monotonic() + timeout
    said = 0.0
    while True:
        info = await js.stream_info(stream)
        sources = info.sources or []
        running = bool(sources) and all(s.error is None and s.active is not None and s.active >= 0 for s in sources)
        if running and all((s.lag or 0) == 0 for s in sources):
            return
        now = time.monotonic()
        if now > deadline:
            if running:
                return  # caught up or not, the running source keeps what it still has to copy
            # Not a timeout of the retried kind: waiting longer here would not start the source.
            raise RuntimeError(f"the sources of stream {stream} did not start within {timeout:.0f}s: {sources}")
        if now - said > 10:
            lag = sum(s.lag or 0 for s in sources)
            log.info("stream %s is copying from %s (%d messages to go)", stream, [s.name for s in sources], lag)
            said = now
        await asyncio.sleep(0.2)


async def setup_bus(
    js: JetStreamContext,
    specs: tuple[StreamSpec, ...],
    *,
    replicas: int = 1,
    lease_ttl: float = LEASE_TTL_SECONDS,
    consumers: tuple[ConsumerSpec, ...] = (PLANNER, APPLIER),
    buckets: tuple[BucketSpec, ...] = BUCKETS,
) -> None:
    """Create or update everything the services bind to: streams, per-partition durables, KV buckets, and the
    object store buckets (``buckets``, with their configured limits: ``contracts.streams.configured_buckets``).

    Needs the admin identity; idempotent, so it runs at every start of the stack and in every deployment.
    """
    await require_admin(js._nc)
    await ensure_streams(js, specs)
    for durable in [partition_consumer(spec, p) for spec in consumers for p in range(PARTITIONS)]:
        await until_done(_bound(ensure_consumer, js, durable), what=f"creating consumer {durable.durable}")
    await until_done(
        lambda: _ensure_bucket(js, LEASE_BUCKET, ttl=lease_ttl, replicas=replicas), what="creating the lease bucket"
    )
    await until_done(
        lambda: _ensure_bucket(js, APPLIED_BUCKET, ttl=None, replicas=replicas), what="creating the ledger bucket"
    )
    for bucket in buckets:
        await until_done(_bound_bucket(js, bucket), what=f"creating the object store bucket {bucket.name}")


def object_bucket_config(spec: BucketSpec) -> js_api.StreamConfig:
    """The object store's own stream layout (what the client library makes), with a record stream's limits and
    direct gets allowed, which is how the history server reads it."""
    return js_api.StreamConfig(
        name=spec.stream,
        description=spec.description,
        subjects=[f"{spec.chunks}.>", f"{spec.meta}.>"],
        retention=js_api.RetentionPolicy.LIMITS,
        storage=js_api.StorageType.FILE,
        max_age=spec.max_age_seconds,
        max_bytes=spec.max_bytes,
        num_replicas=spec.replicas,
        discard=js_api.DiscardPolicy.NEW if spec.discard == "new" else js_api.DiscardPolicy.OLD,
        allow_rollup_hdrs=True,
        allow_direct=True,
    )


def _bound_bucket(js: JetStreamContext, spec: BucketSpec) -> Callable[[], Awaitable[None]]:
    return lambda: put_stream(js, object_bucket_config(spec))


async def _ensure_bucket(js: JetStreamContext, bucket: str, *, ttl: float | None, replicas: int) -> None:
    """The bucket, with direct gets allowed: the services read keys and list lease holders with them."""
    try:
        info = await js.stream_info(f"KV_{bucket}")
    except (nats.js.errors.NotFoundError, BadRequestError):
        options: dict[str, object] = {"ttl": ttl} if ttl else {}
        await js.create_key_value(
            bucket=bucket,
            history=1,
            replicas=replicas,
            direct=True,
            **options,  # type: ignore[arg-type]
        )
        return
    if not info.config.allow_direct:  # made by an older version, which did not ask for it
        await js.update_stream(info.config.evolve(allow_direct=True))


def _bound(
    step: Callable[[JetStreamContext, ConsumerSpec], Awaitable[T]], js: JetStreamContext, spec: ConsumerSpec
) -> Callable[[], Awaitable[T]]:
    return lambda: step(js, spec)


def partition_consumer(spec: ConsumerSpec, partition: int) -> ConsumerSpec:
    """The durable of one partition: ``<durable>-p<partition>``, filtered to that partition's subjects."""
    import msgspec

    prefix = spec.filter_subject.split(".*.", 1)[0]
    return msgspec.structs.replace(
        spec, durable=f"{spec.durable}-p{partition}", filter_subject=f"{prefix}.{partition}.>"
    )


async def until_set_up(step: Callable[[], Awaitable[T]], *, what: str, max_delay: float = 5.0) -> T:
    """Run a binding step until what it binds to exists: the admin set-up may not have run yet.

    A service may not create streams, consumers or buckets itself, so it waits, saying what it waits for,
    and goes on once ``tjpipe bus-setup`` (or the deployment's set-up Job) has made them.
    """
    waited = 0.0

    def note(exc: BaseException, wait: float) -> None:
        nonlocal waited
        log.warning(
            "%s is not there yet (%s); waiting for the bus set-up (tjpipe bus-setup, admin identity); "
            "waited %.0fs so far",
            what,
            type(exc).__name__,
            waited,
        )
        waited += wait

    policy = dataclasses.replace(
        retrying.BUS_SET_UP, retry_on=(nats.js.errors.NotFoundError, *_SETUP_RETRYABLE), maximum=max_delay
    )
    async for attempt in policy.retrying(on_retry=note):
        with attempt:
            return await step()
    raise AssertionError("unreachable: the policy retries until the step succeeds")


async def bind_stream(js: JetStreamContext, stream: str) -> None:
    await until_set_up(lambda: js.stream_info(stream), what=f"stream {stream}")


async def bind_consumers(js: JetStreamContext, spec: ConsumerSpec) -> None:
    """Wait until every partition durable of ``spec`` exists."""
    for partition in range(PARTITIONS):
        durable = partition_consumer(spec, partition)
        await until_set_up(_bound(_consumer_info, js, durable), what=f"consumer {spec.stream}/{durable.durable}")


async def _consumer_info(js: JetStreamContext, spec: ConsumerSpec) -> object:
    return await js.consumer_info(spec.stream, spec.durable)


async def ensure_consumer(js: JetStreamContext, spec: ConsumerSpec) -> None:
    await js.add_consumer(
        spec.stream,
        js_api.ConsumerConfig(
            durable_name=spec.durable,
            filter_subject=spec.filter_subject,
            ack_policy=js_api.AckPolicy.EXPLICIT,
            deliver_policy=js_api.DeliverPolicy.ALL,
            ack_wait=spec.ack_wait_seconds,
            max_deliver=spec.max_deliver,
            max_ack_pending=spec.max_ack_pending,
        ),
    )
