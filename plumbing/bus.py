"""JetStream plumbing shared by the services: connecting with credentials, setting the bus up, binding to it.

Every connection is authenticated: a service presents its own NATS identity (an nkey seed file, or a JWT
``.creds`` file) and, where the server asks for it, TLS. Its replies come to an inbox prefix the server lets
only that identity subscribe to: named after the identity for a service, which says which identity it is
(:func:`identity_inbox_prefix`), else after its public key (:func:`inbox_prefix`).

Why a service's inbox is named after its identity and not its key: the credentials file is read again at
every (re)connect, and a connection whose file changed reconnects with the new key by itself
(:func:`connect`), so that a seed rotates without a restart. A connection keeps its inbox prefix for its
whole life, and every subscription is made again on a reconnect; an inbox named after the old key would be
refused once the old key is gone, while the identity's name outlives every key it has.

Streams, durable consumers and KV buckets are made in one place, :func:`setup_bus`, run with the admin
identity at set-up (``tjpipe bus-setup``, ``tjpipe up``, the test fixtures, the deployment's set-up Job).
The services' identities may not create, change or delete any of them: a service only binds to what
exists, and waits with a log line that says what is missing until the set-up has run
(:func:`until_set_up`). ``add_consumer`` is create-or-update on the server; streams need an explicit update
when their settings changed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import logging
import ssl
import time
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js import api as js_api
from nats.js.errors import BadRequestError

from contracts import subjects
from contracts.messages import DeadLetter, encode
from contracts.streams import APPLIED_BUCKET, APPLIER, DLQ, PLANNER, ConsumerSpec, StreamSpec
from contracts.subjects import PARTITIONS
from plumbing import publishing, retrying
from plumbing.observability import PUBLISH_REFUSED

log = logging.getLogger(__name__)

T = TypeVar("T")

MSG_ID = "Nats-Msg-Id"
MAX_DEAD_LETTER_PAYLOAD = 640 * 1024
"""Kept whole up to this size; base64 in the letter then still fits the default 1 MB max payload."""
TRACE_ID = "Tj-Trace-Id"


LEASE_BUCKET = "tj_leases"
"""KV bucket of partition leases, keys ``<role>.p<partition>`` and ``<role>.member.<replica>``."""
LEASE_TTL_SECONDS = 6.0


@dataclass(frozen=True)
class TlsFiles:
    """PEM files for a TLS connection: the CA that signed the server, and a client certificate if required."""

    ca: str | None = None
    cert: str | None = None
    key: str | None = None

    def context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(purpose=ssl.Purpose.SERVER_AUTH, cafile=self.ca)
        if self.cert:
            context.load_cert_chain(self.cert, self.key)
        return context

    @classmethod
    def from_options(cls, ca: str | None, cert: str | None, key: str | None) -> TlsFiles | None:
        if not (ca or cert or key):
            return None
        if bool(cert) != bool(key):
            raise ValueError("a TLS client certificate needs both --nats-tls-cert and --nats-tls-key")
        return cls(ca=ca or None, cert=cert or None, key=key or None)


class CredentialsError(ValueError):
    """The credentials file is missing, unreadable or not a NATS seed or .creds file."""


class NotAuthorized(Exception):
    """The NATS server refused this connection's credentials (or their absence)."""


def _seed_in(text: str) -> str:
    """The user nkey seed in a bare seed file, or in the ``USER NKEY SEED`` part of a ``.creds`` file."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if any("BEGIN USER NKEY SEED" in line for line in lines):
        lines = lines[next(i for i, line in enumerate(lines) if "BEGIN USER NKEY SEED" in line) + 1 :]
    for line in lines:
        if line.startswith("SU"):
            return line
    raise CredentialsError("no user nkey seed (a line starting with SU) found")


def public_key_of_credentials(path: str | Path) -> str:
    """The user's public nkey (``U…``) for a seed file or a ``.creds`` file."""
    import nkeys

    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise CredentialsError(f"cannot read NATS credentials {path}: {exc.strerror}") from exc
    try:
        pair = nkeys.from_seed(bytearray(_seed_in(text).encode()))
    except CredentialsError as exc:
        raise CredentialsError(f"{path}: {exc}") from None
    except Exception as exc:  # nkeys raises its own error types for a bad encoding or checksum
        raise CredentialsError(f"{path}: not a valid nkey seed ({type(exc).__name__})") from None
    try:
        return str(pair.public_key.decode())
    finally:
        pair.wipe()


def inbox_prefix(public_key: str) -> str:
    """The inbox prefix of one key; the server lets only that key subscribe below it."""
    return f"_INBOX_{public_key}"


def identity_inbox_prefix(identity: str) -> str:
    """The inbox prefix of one identity whatever its key; the server lets only its keys subscribe below it."""
    return f"_INBOX_{identity}"


CREDENTIALS_CHECK_SECONDS = 5.0
"""How often a connection looks whether its credentials file now holds another key."""


def _seed_signer(nc: NATS, path: str) -> Callable[[str], bytes]:
    """Sign the server's nonce with the seed the file holds now, and present that seed's public key.

    nats.py reads a seed file again for every signature but keeps the public key it read at the first
    connect, so after a rotation it would present the old key with a signature of the new one and be
    refused. This reads the file once per CONNECT and sets both; the client computes the signature before
    it reads the key it presents (``Client._connect_command``), so the two always come from one read.
    """
    import base64

    import nkeys

    def sign(nonce: str) -> bytes:
        try:
            pair = nkeys.from_seed(bytearray(_seed_in(Path(path).read_text()).encode()))
        except Exception as exc:  # unreadable, half written, not a seed: the client's reconnect loop retries
            raise nats.errors.Error(f"cannot read the NATS seed in {path} ({type(exc).__name__})") from None
        try:
            nc._public_nkey = pair.public_key.decode()
            return base64.b64encode(pair.sign(nonce.encode()))
        finally:
            pair.wipe()

    return sign


async def _follow_credentials(nc: NATS, path: str, *, interval: float) -> None:
    """Reconnect as soon as the credentials file holds another key than the one this connection presented.

    A rotation swaps the file (``tjpipe nats-credentials rotate swap``, or a Kubernetes Secret update) while
    the server trusts both keys; the reconnect makes the connection present the new one before the old key
    is removed, so nothing is refused. Publishes wait in the client's buffer meanwhile, and the streams keep
    every message a consumer has not acknowledged, as across any reconnect. A file that cannot be read or
    holds no valid seed (half written) is looked at again next time.
    """
    presented = public_key_of_credentials(path)
    while not nc.is_closed:
        await asyncio.sleep(interval)
        try:
            now = public_key_of_credentials(path)
        except CredentialsError as exc:
            log.warning("nats: %s; keeping the current connection", exc)
            continue
        if nc._public_nkey is not None:
            presented = nc._public_nkey
        if now != presented and nc.is_connected:
            log.info("nats: the credentials in %s now hold key %s; reconnecting with it", path, now)
            presented = now
            await nc.force_reconnect()


async def connect(
    url: str,
    *,
    name: str,
    creds: str | Path | None = None,
    tls: TlsFiles | None = None,
    identity: str | None = None,
    credentials_check_seconds: float = CREDENTIALS_CHECK_SECONDS,
) -> NATS:
    """Connect as the identity in ``creds`` (an nkey seed file or a JWT ``.creds`` file), over TLS if given.

    ``identity`` names it (a service's stage, ``reader``); its replies then come to the identity's inbox,
    which survives a key rotation. Without, they come to the key's inbox: enough for a command that ends.

    The file is read again at every reconnect, and looked at every ``credentials_check_seconds``: when it
    holds another key, the connection reconnects with it (see :func:`_follow_credentials`).

    Without ``creds`` the connection is anonymous, which a server configured by this project refuses.
    A refusal of the credentials on the first connection raises :class:`NotAuthorized` at once instead of
    retrying forever: wrong credentials do not fix themselves. Later (after a server restart, or a new key
    the server does not trust yet) the client keeps trying.
    """
    connected = False
    refused: list[str] = []

    async def on_error(exc: Exception) -> None:
        text = str(exc).lower()
        if not connected and "authorization violation" in text:
            raise NotAuthorized(f"the NATS server at {url} refused the credentials of {name} ({creds or 'none'})")
        if "permissions violation" in text:
            refused.append(str(exc))
            del refused[:-16]
        log.warning("nats: %s", exc)

    async def on_disconnect() -> None:
        log.warning("nats: disconnected")

    async def on_reconnect() -> None:
        log.info("nats: reconnected")

    following: list[asyncio.Task[None]] = []

    async def on_closed() -> None:
        for task in following:
            task.cancel()

    options: dict[str, object] = {}
    path = str(creds) if creds else None
    jwt = False
    if path is not None:
        key = public_key_of_credentials(path)
        options["inbox_prefix"] = identity_inbox_prefix(identity) if identity else inbox_prefix(key)
        jwt = "BEGIN NATS USER JWT" in Path(path).read_text()
        # nats.py reads a .creds file whole at every connect; a bare seed gets _seed_signer below.
        options["user_credentials" if jwt else "nkeys_seed"] = path
    if tls is not None:
        options["tls"] = tls.context()
    nc = await nats.connect(
        servers=[u.strip() for u in url.split(",")],
        name=name,
        max_reconnect_attempts=-1,
        reconnect_time_wait=0.5,
        error_cb=on_error,
        disconnected_cb=on_disconnect,
        reconnected_cb=on_reconnect,
        closed_cb=on_closed,
        **options,
    )
    connected = True
    _REFUSALS[nc] = refused
    if path is not None:
        if not jwt:
            nc._signature_cb = _seed_signer(nc, path)
        following.append(asyncio.create_task(_follow_credentials(nc, path, interval=credentials_check_seconds)))
    return nc


_REFUSALS: weakref.WeakKeyDictionary[NATS, list[str]] = weakref.WeakKeyDictionary()


def refusals(nc: NATS) -> list[str]:
    """The server's latest permission refusals on this connection (a refused request only times out)."""
    return _REFUSALS.get(nc, [])


async def require_admin(nc: NATS, *, timeout: float = 10.0) -> None:
    """Fail fast when this connection may not manage the bus: ``$JS.API.INFO`` is allowed to the admin only.

    A request the server refuses is never answered, so without this a wrong identity would only show as
    set-up steps timing out and being retried for minutes.
    """
    request = asyncio.ensure_future(nc.request("$JS.API.INFO", b"", timeout=timeout))
    try:
        deadline = time.monotonic() + timeout
        while not request.done() and time.monotonic() < deadline:
            if any("$js.api.info" in r.lower() for r in refusals(nc)):
                raise NotAuthorized(
                    "this NATS identity may not manage streams, consumers or buckets; use the admin identity"
                )
            await asyncio.sleep(0.05)
    finally:
        if not request.done():
            request.cancel()
        await asyncio.gather(request, return_exceptions=True)


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
        duplicate_window=spec.duplicate_window_seconds,
        num_replicas=spec.replicas,
        discard=js_api.DiscardPolicy.NEW if spec.discard == "new" else js_api.DiscardPolicy.OLD,
        allow_direct=True,
    )


async def ensure_streams(js: JetStreamContext, specs: tuple[StreamSpec, ...]) -> None:
    """Create or update every stream; retried while a JetStream cluster is still electing leaders."""
    await until_done(lambda: _ensure_streams(js, specs), what="setting up the streams")


_SETUP_RETRYABLE = (
    TimeoutError,
    nats.errors.TimeoutError,
    nats.errors.NoRespondersError,
    nats.js.errors.ServiceUnavailableError,
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
        await _put_stream(js, _stream_config(spec, retention=current))
    for spec in recorded:
        await _put_stream(js, _stream_config(spec))
    for spec in recorded:
        if switching & set(spec.sources):
            await _until_sourcing(js, spec.name)
    for spec in specs:
        if spec.name in switching:
            log.info("stream %s now has %s retention", spec.name, effective_retention(spec))
            await _put_stream(js, _stream_config(spec))


async def _put_stream(js: JetStreamContext, config: js_api.StreamConfig) -> None:
    try:
        await js.add_stream(config)
    except BadRequestError:
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
) -> None:
    """Create or update everything the services bind to: streams, per-partition durables, KV buckets.

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


async def dead_letter(
    js: JetStreamContext, msg: Msg, *, stage: str, reason: str, error: str, namespace: str, name: str
) -> None:
    """Keep a message that can never succeed, with why and its original bytes, on the DLQ stream."""
    payload = msg.data
    if len(payload) > MAX_DEAD_LETTER_PAYLOAD:
        # The letter must fit the server's max payload even base64-encoded; the original stays in its
        # stream at stream_seq, and the digest identifies it.
        digest = hashlib.sha256(payload).hexdigest()
        error = f"{error} (payload of {len(payload)} bytes cut to {MAX_DEAD_LETTER_PAYLOAD}; sha256 {digest})"
        payload = payload[:MAX_DEAD_LETTER_PAYLOAD]
    letter = DeadLetter(
        stage=stage,
        reason=reason,
        error=error,
        subject=msg.subject,
        payload=payload,
        headers=dict(msg.headers or {}),
        stream_seq=msg.metadata.sequence.stream,
        deliveries=msg.metadata.num_delivered or 1,
        dead_at=time.time(),
    )
    log.error("dead-lettered %s (%s): %s", msg.subject, reason, error)
    # The dead-letter stream is a record that drops its oldest letters at its limit, so it takes every
    # letter at once; should the server refuse one anyway (its file store full), the letter is given up
    # with a log line rather than hold the caller's partition: the original stays in its history stream,
    # and the result stream and the TrainJob's condition say what happened.
    subject = subjects.dlq_subject(stage, namespace, name)
    try:
        await js.publish(subject, encode(letter), timeout=5.0)
    except nats.js.errors.APIError as exc:
        if not publishing.is_refused(exc):
            raise
        PUBLISH_REFUSED.labels(stream=DLQ.name).inc()
        log.error("stream %s refused the dead letter for %s (%s); it is not kept", DLQ.name, msg.subject, exc)


@dataclass(frozen=True, kw_only=True, slots=True)
class StoredMessage:
    """One message as the stream keeps it: where it sits, when it arrived, and its bytes."""

    stream: str
    seq: int
    subject: str
    data: bytes
    headers: dict[str, str]
    time: float
    origin_seq: int = 0
    """Its sequence in the work stream it was recorded from (a history stream's copy); else ``seq``."""


async def read_stream(
    js: JetStreamContext,
    stream: str,
    subject: str,
    *,
    start_seq: int | None = None,
    start_time: float | None = None,
    last_per_subject: bool = False,
    batch: int = 256,
    limit: int | None = None,
) -> list[StoredMessage]:
    """Every stored message on ``subject`` (wildcards allowed), oldest first, without touching any consumer.

    The messages are read with batched direct gets (``$JS.API.DIRECT.GET.<stream>``), which only read: no
    consumer is created, so the production consumers and the stream stay exactly as they were, which is what
    makes history and replay safe on a live system, and a read-only identity needs no right to create
    consumers (with which it could re-point a service's durable). ``last_per_subject`` has the server pick
    only the newest message of each subject instead. ``limit`` stops the read once that many messages
    have arrived, for a reader that pages through a large stream from ``start_seq``.
    """
    import datetime as dt

    request: dict[str, object] = {"next_by_subj": subject, "batch": batch}
    if last_per_subject:
        found = await _direct_get_batch(js, stream, {"multi_last": [subject], "batch": 1 << 20})
        if found is not None:
            return found
        # The server would not answer that many subjects at once: read everything, keep the newest of each.
        newest: dict[str, StoredMessage] = {}
        for message in await read_stream(js, stream, subject):
            newest[message.subject] = message
        return sorted(newest.values(), key=lambda m: m.seq)
    if start_seq is not None:
        request["seq"] = start_seq
    elif start_time is not None:
        request["start_time"] = dt.datetime.fromtimestamp(start_time, tz=dt.UTC).isoformat()
    else:
        request["seq"] = 1
    out: list[StoredMessage] = []
    while True:
        page = await _direct_get_batch(js, stream, request)
        if not page:
            return out
        out += page
        if limit is not None and len(out) >= limit:
            return out
        request.pop("start_time", None)
        request["seq"] = page[-1].seq + 1


SOURCE_HEADER = "Nats-Stream-Source"

_DIRECT_GET_HEADERS = frozenset(
    {
        "Nats-Stream",
        "Nats-Subject",
        "Nats-Sequence",
        "Nats-Time-Stamp",
        "Nats-Num-Pending",
        "Nats-Last-Sequence",
        "Nats-UpTo-Sequence",
        SOURCE_HEADER,
    }
)


def _origin_seq(headers: dict[str, str], seq: int) -> int:
    """``<stream> <seq> ...`` in the header the server adds to a sourced copy: the original's sequence."""
    parts = headers.get(SOURCE_HEADER, "").split()
    return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else seq


def _timestamp(text: str) -> float:
    """RFC 3339 with up to nanoseconds, as the server writes ``Nats-Time-Stamp``."""
    import datetime as dt

    head, _, rest = text.rstrip("Z").partition(".")
    fraction = "".join(ch for ch in rest if ch.isdigit())
    when = dt.datetime.fromisoformat(head).replace(tzinfo=dt.UTC)
    return when.timestamp() + (int(fraction[:9].ljust(9, "0")) / 1e9 if fraction else 0.0)


async def _direct_get_batch(
    js: JetStreamContext, stream: str, request: dict[str, object], *, timeout: float = 5.0
) -> list[StoredMessage] | None:
    """One batched direct get: the messages it returns, until the server's end-of-batch marker.

    ``[]`` when nothing matches; ``None`` when the server refuses the request (too large, not supported).
    """
    import json

    nc: NATS = js._nc
    inbox = nc.new_inbox()
    arrived: asyncio.Queue[Msg] = asyncio.Queue()

    async def on_message(msg: Msg) -> None:
        await arrived.put(msg)

    sub = await nc.subscribe(inbox, cb=on_message)
    out: list[StoredMessage] = []
    try:
        await nc.publish(f"$JS.API.DIRECT.GET.{stream}", json.dumps(request).encode(), reply=inbox)
        while True:
            msg = await asyncio.wait_for(arrived.get(), timeout=timeout)
            headers = dict(msg.headers or {})
            status = headers.get("Status")
            if status == "204":  # end of batch
                return out
            if status == "404":  # nothing (more) matches
                return out
            if status:
                if out:
                    return out
                log.debug("direct get on %s refused: %s %s", stream, status, headers.get("Description"))
                return None
            seq = int(headers["Nats-Sequence"])
            out.append(
                StoredMessage(
                    stream=stream,
                    seq=seq,
                    subject=headers["Nats-Subject"],
                    data=msg.data,
                    headers={k: v for k, v in headers.items() if k not in _DIRECT_GET_HEADERS},
                    time=_timestamp(headers["Nats-Time-Stamp"]),
                    origin_seq=_origin_seq(headers, seq),
                )
            )
    finally:
        await sub.unsubscribe()
