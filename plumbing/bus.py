"""Connecting to the bus with a stage's own credentials, the message headers, and dead letters.

Every connection is authenticated: a service presents its own NATS identity (an nkey seed file, or a JWT
``.creds`` file) and, where the server asks for it, TLS. Its replies come to an inbox prefix the server lets
only that identity subscribe to: named after the identity for a service, which says which identity it is
(:func:`identity_inbox_prefix`), else after its public key (:func:`inbox_prefix`).

Why a service's inbox is named after its identity and not its key: the credentials file is read again at
every (re)connect, and a connection whose file changed reconnects with the new key by itself
(:func:`connect`), so that a seed rotates without a restart. A connection keeps its inbox prefix for its
whole life, and every subscription is made again on a reconnect; an inbox named after the old key would be
refused once the old key is gone, while the identity's name outlives every key it has.

Setting the bus up and binding to it is ``plumbing.bus_setup``; reading what the streams keep is
``plumbing.bus_history``. Here stay the connection, the header names every message carries, and dead letters.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import ssl
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from contracts import subjects
from contracts.messages import DeadLetter, encode
from contracts.streams import DLQ
from plumbing import publishing
from plumbing.observability import PUBLISH_REFUSED

log = logging.getLogger(__name__)

MSG_ID = "Nats-Msg-Id"
MAX_DEAD_LETTER_PAYLOAD = 640 * 1024
"""Kept whole up to this size; base64 in the letter then still fits the default 1 MB max payload."""
TRACE_ID = "Tj-Trace-Id"


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
