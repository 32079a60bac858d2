"""Who may do what on the bus: one NATS nkey identity per stage, and the server's authorization block.

Why nkeys and not decentralized JWT accounts: the set of identities is fixed (eight, one per stage and role),
so JWT's one advantage, adding or changing users without touching the server's configuration, buys nothing
here, while it costs an operator key, an account key, a resolver and signed JWTs to run and rotate. With
nkeys the server configuration holds only public keys, the seeds never leave the process that uses them,
and the whole trust set is one readable ``authorization`` block. Every identity lives in the one account,
and there is no ``no_auth_user``, so a connection without a valid signature is refused.

Why a permission per JetStream API subject: JetStream's API is NATS subjects (``$JS.API.<verb>.<stream>``),
so publish permissions are what decide which streams, consumers and buckets an identity may touch. A
service may only bind to what the ``admin`` identity created at set-up (``plumbing.bus_setup.setup_bus``); none
may create, change or delete a stream, a consumer or a bucket. That includes ephemeral consumers: the
server accepts a consumer *name* in the body of an ephemeral create request and then updates the existing
consumer of that name, so the right to create an ephemeral consumer is the right to re-point a service's
durable (tested). Reading history and listing lease holders therefore use batched direct gets
(``$JS.API.DIRECT.GET.<stream>``), which can only read. Each identity's replies come to its own inbox prefix,
named after the identity (a service, which says which it is) or after its public key (a one-off command),
and only its keys may subscribe there, so no identity can read another's replies or pulled messages.

Why rotation has an overlap window of two keys per identity: the server's ``users`` list may hold several
nkeys with the same permissions, and a reload (SIGHUP) adds and removes users without touching the
connections of the keys that stay; it closes only those of a removed key. So a rotation is three steps, each
safe on its own: trust a new key next to the old one (``begin``), put the new seed where the services read
it (``swap``; they reconnect with it, ``plumbing.bus.connect``), and drop the old key (``finish``). The
folder holds the state in between: ``<identity>.nk.next``, the new seed not yet in use, and
``<identity>.nk.retiring``, the public key (only) of the seed the swap replaced.

The seeds are written with mode 0600 in a 0700 folder and never logged.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import nkeys

from contracts import streams, subjects
from contracts.subjects import PARTITIONS
from plumbing.bus import identity_inbox_prefix, inbox_prefix
from plumbing.bus_setup import LEASE_BUCKET
from tjpipe.private_files import write_private_file

ADMIN = "admin"
WATCHER = "watcher"
PLANNER = "planner"
APPLIER = "applier"
READER = "reader"
DLQ_OPERATOR = "dlq-operator"
STATUS_SERVER = "status-server"
HISTORY_KEEPER = "history-keeper"
LOG_KEEPER = "log-keeper"
IDENTITIES = (ADMIN, WATCHER, PLANNER, APPLIER, READER, DLQ_OPERATOR, STATUS_SERVER, HISTORY_KEEPER, LOG_KEEPER)
SERVICE_IDENTITY = {"watcher": WATCHER, "planner": PLANNER, "applier": APPLIER, "status-server": STATUS_SERVER}
"""``tjpipe`` service command → the identity it runs as."""

SEED_SUFFIX = ".nk"
NEXT_SUFFIX = ".nk.next"
"""A rotation's new seed, trusted by the server but not used yet."""
RETIRING_SUFFIX = ".nk.retiring"
"""The public key of the seed a rotation replaced, trusted until the rotation is finished."""

_API = "$JS.API"
_RECORD_STREAMS = tuple(spec.name for spec in streams.RECORD_STREAMS)


@dataclass(frozen=True)
class Permissions:
    publish: tuple[str, ...]
    subscribe: tuple[str, ...] = ()
    publish_deny: tuple[str, ...] = ()
    subscribe_deny: tuple[str, ...] = ()


def _durables(spec: streams.ConsumerSpec) -> list[str]:
    return [f"{spec.durable}-p{p}" for p in range(PARTITIONS)]


def _consume_durables(spec: streams.ConsumerSpec) -> list[str]:
    """Bind to, pull from and acknowledge the per-partition durables of ``spec``, and nothing else."""
    out = [f"{_API}.STREAM.INFO.{spec.stream}"]
    for durable in _durables(spec):
        out += [
            f"{_API}.CONSUMER.INFO.{spec.stream}.{durable}",
            f"{_API}.CONSUMER.MSG.NEXT.{spec.stream}.{durable}",
            f"$JS.ACK.{spec.stream}.{durable}.>",
            # The same acknowledgement in the server's second form, which names the JetStream domain and
            # account first (a fleet member's server uses it, ``tjpipe.fleet_nats.member_config``). The stream
            # and durable tokens sit where the first form has its counters, so neither form matches the
            # other's subjects.
            f"$JS.ACK.*.*.{spec.stream}.{durable}.>",
        ]
    return out


def _trim_work(spec: streams.ConsumerSpec) -> list[str]:
    """Remove what is finished and recorded from the stage's own input stream (``plumbing.work_trim``: every round
    where a work stream has limits retention, a JetStream cluster; what a lone server kept, under interest
    retention): purge it, and read the newest message of its history to learn how far that is recorded.
    Messages the stage already received are all it can read there."""
    return [f"{_API}.STREAM.PURGE.{spec.stream}", f"{_API}.DIRECT.GET.{streams.HISTORY_OF[spec.stream]}"]


def _leases(role: str) -> list[str]:
    """Write and read this role's own lease keys; list the bucket's keys with a batched direct get.

    A ``create`` that finds the key taken reads it (nats.py checks for a delete marker), hence the direct
    get of one key; the batch request (no key in the subject) lists members.
    """
    stream = f"KV_{LEASE_BUCKET}"
    return [
        f"$KV.{LEASE_BUCKET}.{role}.>",
        f"{_API}.STREAM.INFO.{stream}",
        f"{_API}.DIRECT.GET.{stream}",
        f"{_API}.DIRECT.GET.{stream}.$KV.{LEASE_BUCKET}.{role}.>",
    ]


def _read_streams() -> list[str]:
    """Read the records (history, results, dead letters) with direct gets: no consumer is created, so none
    can be re-pointed. The work streams are not readable: what is there is only what waits to be done, and
    every message of it is in a history stream too."""
    allow: list[str] = []
    for stream in _RECORD_STREAMS:
        allow += [f"{_API}.STREAM.INFO.{stream}", f"{_API}.DIRECT.GET.{stream}", f"{_API}.DIRECT.GET.{stream}.>"]
    return allow


def _read_logs() -> list[str]:
    """Read the kept logs (``contracts.streams.LOGS``) by name with direct gets, as the records are read."""
    stream = streams.LOGS.stream
    return [f"{_API}.STREAM.INFO.{stream}", f"{_API}.DIRECT.GET.{stream}", f"{_API}.DIRECT.GET.{stream}.>"]


def _consumer_info() -> list[str]:
    """Read the stages' durables' state (pending and unacknowledged counts) and the work streams' sizes (the
    backlog) for pipeline health; an info request changes nothing and shows no message."""
    return [
        *(f"{_API}.STREAM.INFO.{spec.name}" for spec in (streams.EVENTS, streams.APPLY)),
        *(
            f"{_API}.CONSUMER.INFO.{spec.stream}.{durable}"
            for spec in (streams.PLANNER, streams.APPLIER)
            for durable in _durables(spec)
        ),
    ]


def permissions() -> dict[str, Permissions | None]:
    """Identity → what it may publish and subscribe to, beyond its own inbox; ``None`` means everything.

    ``admin`` is the account's administrator: stream, consumer and bucket set-up, and break-glass
    operations. Its seed belongs to the set-up step only and is mounted into no service.
    """
    read_allow = _read_streams()
    applied = f"KV_{streams.APPLIED_BUCKET}"
    return {
        ADMIN: None,
        WATCHER: Permissions(
            publish=(f"{subjects.EVENTS_PREFIX}.>", f"{_API}.STREAM.INFO.{streams.EVENTS.name}"),
        ),
        PLANNER: Permissions(
            publish=(
                *_consume_durables(streams.PLANNER),
                *_trim_work(streams.PLANNER),
                f"{subjects.APPLY_PREFIX}.>",
                f"{subjects.DLQ_PREFIX}.planner.>",
                *_leases("planner"),
            ),
        ),
        APPLIER: Permissions(
            publish=(
                *_consume_durables(streams.APPLIER),
                *_trim_work(streams.APPLIER),
                f"{subjects.RESULTS_PREFIX}.>",
                f"{subjects.DLQ_PREFIX}.applier.>",
                f"$KV.{streams.APPLIED_BUCKET}.>",
                f"{_API}.STREAM.INFO.{applied}",
                f"{_API}.DIRECT.GET.{applied}.>",
                f"{_API}.STREAM.MSG.GET.{applied}",
                *_leases("applier"),
                # How full every stream is, for tjpipe_stream_bytes (plumbing.stream_usage); info only.
                *(f"{_API}.STREAM.INFO.{spec.name}" for spec in streams.ALL_STREAMS if spec.name != streams.APPLY.name),
            ),
        ),
        READER: Permissions(publish=(*read_allow, *_consumer_info(), *_read_logs())),
        # The history server's capture of pods' logs writes new objects into the logs bucket: chunks and their
        # descriptions, nothing else. It cannot read the bucket (the reader does), purge it, or touch a stream.
        LOG_KEEPER: Permissions(publish=(f"{streams.LOGS.chunks}.>", f"{streams.LOGS.meta}.>")),
        # The status server records the progress pods report, and reads those records back (direct gets only,
        # no consumer) to write what a crashed replica accepted but had not written yet. No other stream.
        STATUS_SERVER: Permissions(
            publish=(
                f"{subjects.PROGRESS_PREFIX}.>",
                f"{_API}.STREAM.INFO.{streams.PROGRESS.name}",
                f"{_API}.DIRECT.GET.{streams.PROGRESS.name}",
            ),
        ),
        # The history server's retention (history_server.retention): purge what a namespace's policy
        # expired from the record streams, by subject, and read how far each stream reaches. It reads no record:
        # the decision is made on what the server read as ``reader``. A purge request's subject filter is in its
        # body, which a permission cannot narrow, so this identity could purge any record; it is mounted
        # into the history server only, and never into a stage that does the work.
        # It removes what the retention policy expired: purges of the record streams by subject, and the kept
        # logs of those TrainJobs (their descriptions marked deleted, their chunks purged; the server finds them
        # as reader). It reads no record and no log.
        HISTORY_KEEPER: Permissions(
            publish=(
                *(f"{_API}.STREAM.{verb}.{stream}" for stream in _RECORD_STREAMS for verb in ("INFO", "PURGE")),
                f"{_API}.STREAM.PURGE.{streams.LOGS.stream}",
                f"{streams.LOGS.meta}.>",
            ),
        ),
        DLQ_OPERATOR: Permissions(
            publish=(
                *read_allow,
                f"{_API}.STREAM.MSG.GET.{streams.DLQ.name}",
                f"{_API}.STREAM.MSG.DELETE.{streams.DLQ.name}",
                f"{subjects.EVENTS_PREFIX}.>",
                f"{subjects.APPLY_PREFIX}.>",
            ),
        ),
    }


@dataclass(frozen=True)
class Credentials:
    """A folder of nkey seeds, one file per identity: ``<root>/<identity>.nk``."""

    root: Path

    def seed_file(self, identity: str) -> Path:
        if identity not in IDENTITIES:
            raise ValueError(f"unknown NATS identity {identity!r}; one of {', '.join(IDENTITIES)}")
        return self.root / f"{identity}{SEED_SUFFIX}"

    def public_key(self, identity: str) -> str:
        return public_key_of(self.seed_file(identity).read_bytes())

    def public_keys(self) -> dict[str, str]:
        return {identity: self.public_key(identity) for identity in IDENTITIES}

    def exists(self) -> bool:
        return all(self.seed_file(identity).is_file() for identity in IDENTITIES)

    def next_seed_file(self, identity: str) -> Path:
        return self.seed_file(identity).with_name(f"{identity}{NEXT_SUFFIX}")

    def retiring_file(self, identity: str) -> Path:
        return self.seed_file(identity).with_name(f"{identity}{RETIRING_SUFFIX}")

    def rotation_phase(self, identity: str) -> str:
        """``begun`` (a new seed waits to be swapped in), ``swapped`` (the old key is still trusted) or ``""``."""
        if self.next_seed_file(identity).is_file():
            return "begun"
        return "swapped" if self.retiring_file(identity).is_file() else ""

    def trusted_keys(self, identity: str) -> tuple[str, ...]:
        """Every public key the server is to accept for ``identity``: the seed in use, and during a rotation
        the new seed or the replaced one."""
        keys = [self.public_key(identity)]
        if self.next_seed_file(identity).is_file():
            keys.append(public_key_of(self.next_seed_file(identity).read_bytes()))
        if self.retiring_file(identity).is_file():
            keys.append(self.retiring_file(identity).read_text().strip())
        return tuple(dict.fromkeys(keys))


def new_user_seed() -> bytes:
    """A fresh user nkey seed (``SU…``): 32 random bytes, nkey-encoded."""
    return bytes(nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER))


def public_key_of(seed: bytes) -> str:
    pair = nkeys.from_seed(bytearray(seed.strip()))
    try:
        return str(pair.public_key.decode())
    finally:
        pair.wipe()


def generate_credentials(root: Path, *, identities: Iterable[str] = IDENTITIES, replace: bool = False) -> Credentials:
    """Create a seed for every identity that has none (all of them with ``replace``) in ``root`` (mode 0700)."""
    root.mkdir(parents=True, exist_ok=True)
    os.chmod(root, 0o700)
    creds = Credentials(root)
    for identity in identities:
        path = creds.seed_file(identity)
        if replace or not path.is_file():
            write_private_file(path, new_user_seed() + b"\n")
        else:
            os.chmod(path, 0o600)
    return creds


def _quoted(values: Iterable[str]) -> str:
    return "[" + ", ".join(json.dumps(v) for v in values) + "]"


def authorization_block(public_keys: Mapping[str, str | Sequence[str]], *, indent: str = "") -> str:
    """The server's ``authorization`` block: every identity's public keys and permissions, nothing else.

    An identity with several keys (a rotation under way) gets one user per key, with the same permissions.
    Every user may subscribe to its identity's inbox prefix and its own key's only; ``admin`` may do anything.
    """
    table = permissions()
    lines = [f"{indent}authorization {{", f"{indent}  users = ["]
    for identity in IDENTITIES:
        given = public_keys[identity]
        keys = (given,) if isinstance(given, str) else tuple(given)
        rules = table[identity]
        lines.append(f"{indent}    # {identity}" + (f" ({len(keys)} keys: a rotation)" if len(keys) > 1 else ""))
        for key in keys:
            if rules is None:
                lines.append(f"{indent}    {{nkey: {json.dumps(key)}}}")
                continue
            inboxes = (f"{identity_inbox_prefix(identity)}.>", f"{inbox_prefix(key)}.>")
            publish = f"{{allow: {_quoted(rules.publish)}"
            publish += f", deny: {_quoted(rules.publish_deny)}}}" if rules.publish_deny else "}"
            subscribe = f"{{allow: {_quoted((*inboxes, *rules.subscribe))}"
            subscribe += f", deny: {_quoted(rules.subscribe_deny)}}}" if rules.subscribe_deny else "}"
            lines.append(
                f"{indent}    {{nkey: {json.dumps(key)}, permissions: {{publish: {publish}, subscribe: {subscribe}}}}}"
            )
    lines += [f"{indent}  ]", f"{indent}}}"]
    return "\n".join(lines) + "\n"


def server_authorization(creds: Credentials) -> str:
    """The block for the seeds in ``creds``, with both keys of an identity whose rotation is under way."""
    return authorization_block({identity: creds.trusted_keys(identity) for identity in IDENTITIES})


def write_authorization(creds: Credentials, path: Path) -> Path:
    """Write the ``authorization`` block to ``path`` (public keys only), for an ``include`` in nats.conf."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(server_authorization(creds))
    with contextlib.suppress(OSError):
        os.chmod(path, 0o644)
    return path


# ---------------------------------------------------------------------------------------------- rotation


class RotationError(ValueError):
    """A rotation step asked for out of order (begun twice, swapped before begun, finished before swapped)."""


def begin_rotation(creds: Credentials, identities: Iterable[str] = IDENTITIES) -> dict[str, str]:
    """Make a new seed for each of ``identities`` next to the one in use; return identity → its public key.

    The server must trust the new keys (write the authorization block, reload) before :func:`swap_seeds`.
    """
    chosen = list(dict.fromkeys(identities))
    busy = [f"{identity} ({creds.rotation_phase(identity)})" for identity in chosen if creds.rotation_phase(identity)]
    if busy:
        raise RotationError(f"a rotation is under way for {', '.join(busy)}; finish it first")
    new: dict[str, str] = {}
    for identity in chosen:
        seed = new_user_seed()
        write_private_file(creds.next_seed_file(identity), seed + b"\n")
        new[identity] = public_key_of(seed)
    return new


def swap_seeds(creds: Credentials) -> dict[str, tuple[str, str]]:
    """Put every begun rotation's new seed in place of the one in use; return identity → (old key, new key).

    The old public key is kept (``<identity>.nk.retiring``) so that the server trusts it until
    :func:`finish_rotation`. The rename is atomic: a service reading the file sees one seed or the other.
    """
    begun = _not_swapped(creds)
    if not begun:
        raise RotationError("no new seed to swap in; run 'rotate begin' first")
    swapped: dict[str, tuple[str, str]] = {}
    for identity in begun:
        old = creds.public_key(identity)
        retiring = creds.retiring_file(identity)
        retiring.write_text(old + "\n")
        os.chmod(retiring, 0o644)
        os.replace(creds.next_seed_file(identity), creds.seed_file(identity))
        swapped[identity] = (old, creds.public_key(identity))
    return swapped


def finish_rotation(creds: Credentials) -> dict[str, str]:
    """Stop trusting every swapped-out key; return identity → the key retired.

    Refused while a new seed has not been swapped in: its identity's services still use the old key.
    """
    begun = _not_swapped(creds)
    if begun:
        raise RotationError(f"the new seeds of {', '.join(begun)} are not in use yet; run 'rotate swap' first")
    retired: dict[str, str] = {}
    for identity in IDENTITIES:
        if creds.rotation_phase(identity) == "swapped":
            retired[identity] = creds.retiring_file(identity).read_text().strip()
            creds.retiring_file(identity).unlink()
    if not retired:
        raise RotationError("no rotation to finish")
    return retired


ROTATION_STEPS = ("begin", "swap", "finish", "status")


def rotation_step(
    step: str,
    creds: Credentials,
    *,
    authorization: Path | None,
    reload: str | None = None,
    monitor: str | None = None,
    identities: Iterable[str] = IDENTITIES,
    wait: float = 120.0,
    say: Callable[[str], None] = print,
) -> None:
    """One step of ``tjpipe nats-credentials rotate``; what it did goes to ``say`` (public keys, paths).

    ``begin`` and ``finish`` change what the server trusts, so they write the ``authorization`` block and,
    with ``reload`` (the server's pid or pid file), have the server read it (waiting for ``/varz`` to show it
    with ``monitor``). ``finish`` with ``monitor`` first waits up to ``wait`` seconds until no connection
    logs in with a key it retires, and refuses if one still does.
    """
    from tjpipe import nats_server

    def publish_authorization() -> None:
        if authorization is None:
            say("no --authorization given: write the block and reload the server before the next step")
            return
        write_authorization(creds, authorization)
        say(f"authorization block (public keys only): {authorization}")
        if reload is not None:
            nats_server.reload_config(reload, monitor_url=monitor)
            say(f"nats-server {reload} reloaded its configuration" + ("" if monitor else " (signalled)"))

    if step == "status":
        for identity in IDENTITIES:
            phase = creds.rotation_phase(identity) or "no rotation"
            say(f"{identity}: {phase}; trusted keys {', '.join(creds.trusted_keys(identity))}")
        return
    if step == "begin":
        for identity, key in begin_rotation(creds, identities).items():
            say(f"{identity}: new key {key} in {creds.next_seed_file(identity)}, trusted next to the old one")
        publish_authorization()
        say("next, once the server trusts the new keys: rotate swap")
        return
    if step == "swap":
        for identity, (old, new) in swap_seeds(creds).items():
            say(f"{identity}: {creds.seed_file(identity)} now holds {new} (was {old})")
        say("services reconnect with the new seeds within seconds of seeing them; then: rotate finish")
        return
    if step != "finish":
        raise RotationError(f"unknown rotation step {step!r}; one of {', '.join(ROTATION_STEPS)}")
    if monitor is not None and not _not_swapped(creds):
        _until_no_connection_uses(creds, monitor, wait=wait, say=say)
    for identity, key in finish_rotation(creds).items():
        say(f"{identity}: key {key} no longer trusted")
    publish_authorization()


def retiring_keys(creds: Credentials) -> dict[str, str]:
    """Public key → identity, for every swapped-out key the server still trusts."""
    return {
        creds.retiring_file(identity).read_text().strip(): identity
        for identity in IDENTITIES
        if creds.rotation_phase(identity) == "swapped"
    }


def _not_swapped(creds: Credentials) -> list[str]:
    return [identity for identity in IDENTITIES if creds.rotation_phase(identity) == "begun"]


def _until_no_connection_uses(creds: Credentials, monitor: str, *, wait: float, say: Callable[[str], None]) -> None:
    import time

    from tjpipe.nats_server import connections_by_key

    old = retiring_keys(creds)
    deadline = time.monotonic() + wait
    while True:
        still = {key: names for key, names in connections_by_key(monitor).items() if key in old}
        if not still:
            return
        if time.monotonic() > deadline:
            users = "; ".join(f"{old[key]} ({len(names)}: {', '.join(names[:5])})" for key, names in still.items())
            raise RotationError(
                f"connections still log in with keys this step would drop after {wait:.0f}s: {users}. "
                "Do their processes read the new seed file? Run again once they do."
            )
        time.sleep(0.5)


# --------------------------------------------------------------------------------------------------- TLS

TLS_FILES = ("ca.crt", "tls.crt", "tls.key")
"""The names cert-manager gives a Certificate's Secret keys; the self-signed path writes the same."""


def write_self_signed_tls(root: Path, hosts: Iterable[str], *, days: int = 825) -> dict[str, Path]:
    """A private CA and a server certificate signed by it, for ``hosts`` (DNS names or IP addresses).

    The documented path where cert-manager is not available. The certificate serves clients and, with
    ``verify: true`` on the cluster port, authenticates the servers' routes to each other, so it carries
    both usages. The CA's key is not kept: a new server certificate means a new CA (run it again and roll
    the servers and services). Keys are written with mode 0600.
    """
    import datetime as dt
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    from tjpipe.keys.pki import private_key_pem, self_signed_ca, serving_certificate

    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    now = dt.datetime.now(dt.UTC)
    ca_key, ca = self_signed_ca(
        "trainjob-pipeline NATS CA", not_before=now - dt.timedelta(minutes=5), not_after=now + dt.timedelta(days=days)
    )
    key, cert = serving_certificate(
        ca_key,
        ca,
        common_name="nats",
        names=names,
        not_before=now - dt.timedelta(minutes=5),
        not_after=now + dt.timedelta(days=days),
        client_auth=True,
    )
    root.mkdir(parents=True, exist_ok=True)
    os.chmod(root, 0o700)
    paths = {name: root / name for name in TLS_FILES}
    paths["ca.crt"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths["tls.crt"].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    write_private_file(paths["tls.key"], private_key_pem(key))
    return paths
