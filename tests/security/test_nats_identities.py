"""Every NATS identity against a real nats-server: anonymous clients are refused, and each identity may do its
stage's work and nothing else.

The server runs with the authorization block ``tjpipe.credentials`` generates and the bus set up by the admin
identity, exactly as ``tjpipe up`` runs it. A refusal is observed twice: the server's own ``Permissions
Violation`` answer for that subject, and the state afterwards (the stream, its messages, the durables'
configuration and the buckets are all still as they were).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import ssl
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import nats
import nats.errors
import pytest
from nats.aio.client import Client as NATS

from applier.ledger import Ledger
from contracts import streams, subjects
from contracts.messages import DeadLetter, encode
from plumbing import bus, bus_history, bus_setup, object_store
from plumbing.partitions import PartitionLeases, open_lease_bucket
from plumbing.pull import StreamingPull
from tjpipe import history_tools
from tjpipe.credentials import (
    IDENTITIES,
    Credentials,
    generate_credentials,
    new_user_seed,
    server_authorization,
    write_self_signed_tls,
)
from tjpipe.local.natsd import LocalNats, start_nats

pytestmark = pytest.mark.nats

API = "$JS.API"
EVENTS, APPLY, RESULTS, DLQ = (s.name for s in (streams.EVENTS, streams.APPLY, streams.RESULTS, streams.DLQ))
LOGS = streams.LOGS.stream


@pytest.fixture(scope="module")
def creds(tmp_path_factory: pytest.TempPathFactory) -> Credentials:
    return generate_credentials(tmp_path_factory.mktemp("creds") / "creds")


@pytest.fixture(scope="module")
def server(creds: Credentials, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalNats]:
    from tjpipe.local.stack import setup_bus_as_admin

    root = tmp_path_factory.mktemp("nats-auth")
    local = start_nats(store_dir=root / "store", log_dir=root / "logs", authorization=server_authorization(creds))
    try:
        setup_bus_as_admin(local.url, creds)
        yield local
    finally:
        local.stop()


class Client:
    """A connection as one identity that records the server's permission refusals."""

    def __init__(self, nc: NATS, errors: list[str]) -> None:
        self.nc = nc
        self.errors = errors

    async def refused_publish(self, subject: str, payload: bytes = b"{}") -> bool:
        """Publish (with a reply inbox, as an API request would) and report whether the server refused it."""
        self.errors.clear()
        await self.nc.publish(subject, payload, reply=self.nc.new_inbox())
        return await self._violation(f'Publish to "{subject}"')

    async def refused_subscribe(self, subject: str) -> bool:
        self.errors.clear()
        sub = await self.nc.subscribe(subject)
        try:
            return await self._violation(f'Subscription to "{subject}"')
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

    async def _violation(self, what: str) -> bool:
        await self.nc.flush()
        for _ in range(40):
            if any("permissions violation" in e.lower() and what.lower() in e.lower() for e in self.errors):
                return True
            await asyncio.sleep(0.025)
        return False


async def connect_as(server: LocalNats, creds: Credentials, identity: str) -> Client:
    errors: list[str] = []

    async def on_error(exc: Exception) -> None:
        errors.append(str(exc))

    seed = creds.seed_file(identity)
    nc = await nats.connect(
        server.url,
        name=f"sec-{identity}",
        nkeys_seed=str(seed),
        inbox_prefix=bus.inbox_prefix(bus.public_key_of_credentials(seed)),
        error_cb=on_error,
        allow_reconnect=False,
    )
    return Client(nc, errors)


@pytest.fixture
async def clients(server: LocalNats, creds: Credentials) -> AsyncIterator[dict[str, Client]]:
    made = {identity: await connect_as(server, creds, identity) for identity in IDENTITIES}
    try:
        yield made
    finally:
        for client in made.values():
            await client.nc.close()


async def bus_state(admin: NATS) -> dict[str, Any]:
    """What a refused call must leave unchanged: streams and their counts, durables' filters, buckets."""
    js = admin.jetstream()
    state: dict[str, Any] = {}
    for name in (EVENTS, APPLY, RESULTS, DLQ, "KV_tj_leases", "KV_tj_applied"):
        info = await js.stream_info(name)
        state[name] = (info.state.messages, info.config.subjects, info.config.max_bytes)
    for spec in (streams.PLANNER, streams.APPLIER):
        for partition in range(16):
            durable = bus_setup.partition_consumer(spec, partition).durable
            info = await js.consumer_info(spec.stream, durable)
            state[durable] = (info.config.filter_subject, info.config.durable_name, info.config.ack_wait)
    return state


# ------------------------------------------------------------------------------------------- connecting


async def test_anonymous_and_unknown_clients_are_refused(server: LocalNats, tmp_path: Path) -> None:
    with pytest.raises(nats.errors.Error, match="Authorization Violation"):
        await nats.connect(server.url, allow_reconnect=False, max_reconnect_attempts=0, connect_timeout=2)
    stranger = tmp_path / "stranger.nk"
    stranger.write_bytes(new_user_seed())
    with pytest.raises(bus.NotAuthorized):
        await bus.connect(server.url, name="stranger", creds=stranger)  # a valid nkey the server does not list
    with pytest.raises(bus.NotAuthorized):
        await bus.connect(server.url, name="anonymous")


async def test_bus_connect_refuses_a_file_that_is_no_seed(tmp_path: Path) -> None:
    junk = tmp_path / "junk.nk"
    junk.write_text("not a seed\n")
    with pytest.raises(bus.CredentialsError):
        bus.public_key_of_credentials(junk)


# ------------------------------------------------------------------------------------ what each may not do

MANAGEMENT = [
    f"{API}.STREAM.CREATE.EVIL",
    f"{API}.STREAM.UPDATE.{EVENTS}",
    f"{API}.STREAM.DELETE.{EVENTS}",
    f"{API}.STREAM.PURGE.{EVENTS}",
    f"{API}.STREAM.DELETE.{APPLY}",
    f"{API}.STREAM.PURGE.{APPLY}",
    f"{API}.STREAM.MSG.DELETE.{EVENTS}",
    f"{API}.STREAM.DELETE.KV_tj_applied",
    f"{API}.STREAM.PURGE.KV_tj_applied",
    f"{API}.STREAM.DELETE.KV_tj_leases",
    f"{API}.CONSUMER.DELETE.{EVENTS}.planner-p0",
    f"{API}.CONSUMER.DELETE.{APPLY}.applier-p0",
    f"{API}.CONSUMER.CREATE.{EVENTS}",  # ephemeral, whose body can name and re-point a durable
    f"{API}.CONSUMER.CREATE.{EVENTS}.planner-p0",
    f"{API}.CONSUMER.CREATE.{EVENTS}.planner-p0.tj.ev.>",
    f"{API}.CONSUMER.DURABLE.CREATE.{APPLY}.applier-p0",
    f"{API}.CONSUMER.CREATE.KV_tj_leases",
    f"{API}.CONSUMER.PAUSE.{APPLY}.applier-p0",
]


def management_but(allowed: str) -> list[str]:
    """MANAGEMENT without the one request a stage is given: trimming its own input stream (plumbing.work_trim)."""
    return [subject for subject in MANAGEMENT if subject != allowed]


REFUSED_PUBLISH: dict[str, list[str]] = {
    "watcher": [
        *MANAGEMENT,
        "tj.apply.0.ns.name.jobset",
        "tj.result.0.ns.name.jobset",
        "tj.dlq.planner.ns.name",
        "$KV.tj_applied.ns.jobset.name",
        "$KV.tj_leases.planner.p0",
        "$KV.tj_leases.applier.p0",
        f"{API}.CONSUMER.MSG.NEXT.{EVENTS}.planner-p0",
        f"{API}.DIRECT.GET.{EVENTS}",
        f"{API}.STREAM.MSG.GET.{DLQ}",
        "$JS.ACK.TJ_EVENTS.planner-p0.1.1.1.1.0",
        "$JS.ACK.c1.AbCdEfGh.TJ_EVENTS.planner-p0.1.1.1.1.0",  # the second form (a fleet member's server)
    ],
    "planner": [
        *management_but(f"{API}.STREAM.PURGE.{EVENTS}"),
        f"{API}.DIRECT.GET.TJ_APPLY_HISTORY",
        "tj.ev.0.ns.name",
        "tj.result.0.ns.name.jobset",
        "tj.dlq.applier.ns.name",
        "$KV.tj_applied.ns.jobset.name",
        "$KV.tj_leases.applier.p0",
        "$KV.tj_leases.applier.member.x",
        f"{API}.CONSUMER.MSG.NEXT.{APPLY}.applier-p0",
        f"{API}.DIRECT.GET.KV_tj_applied.$KV.tj_applied.ns.jobset.name",
        f"{API}.DIRECT.GET.{EVENTS}",
        "$JS.ACK.TJ_APPLY.applier-p0.1.1.1.1.0",
        "$JS.ACK.c1.AbCdEfGh.TJ_APPLY.applier-p0.1.1.1.1.0",  # the second form (a fleet member's server)
    ],
    "applier": [
        *management_but(f"{API}.STREAM.PURGE.{APPLY}"),
        f"{API}.DIRECT.GET.TJ_EVENTS_HISTORY",
        "tj.ev.0.ns.name",
        "tj.apply.0.ns.name.jobset",
        "tj.dlq.planner.ns.name",
        "$KV.tj_leases.planner.p0",
        "$KV.tj_leases.planner.member.x",
        f"{API}.DIRECT.GET.KV_tj_leases.$KV.tj_leases.planner.p0",
        f"{API}.CONSUMER.MSG.NEXT.{EVENTS}.planner-p0",
        f"{API}.DIRECT.GET.{APPLY}",
        "$JS.ACK.TJ_EVENTS.planner-p0.1.1.1.1.0",
        "$JS.ACK.c1.AbCdEfGh.TJ_EVENTS.planner-p0.1.1.1.1.0",  # the second form (a fleet member's server)
    ],
    "reader": [
        *MANAGEMENT,
        "tj.ev.0.ns.name",
        "tj.apply.0.ns.name.jobset",
        "tj.result.0.ns.name.jobset",
        "tj.dlq.applier.ns.name",
        "$KV.tj_applied.ns.jobset.name",
        "$KV.tj_leases.planner.p0",
        f"{API}.CONSUMER.MSG.NEXT.{EVENTS}.planner-p0",
        f"{API}.CONSUMER.MSG.NEXT.{APPLY}.applier-p0",
        f"{API}.STREAM.MSG.DELETE.{DLQ}",
        f"{API}.DIRECT.GET.KV_tj_applied.$KV.tj_applied.ns.jobset.name",
        "$JS.ACK.TJ_APPLY.applier-p0.1.1.1.1.0",
        "$JS.ACK.c1.AbCdEfGh.TJ_APPLY.applier-p0.1.1.1.1.0",  # the second form (a fleet member's server)
        # The work streams hold only what waits to be done; the record is in the history streams.
        f"{API}.DIRECT.GET.{EVENTS}",
        f"{API}.DIRECT.GET.{APPLY}",
    ],
    "dlq-operator": [
        *MANAGEMENT,
        "tj.result.0.ns.name.jobset",
        "tj.dlq.applier.ns.name",
        "$KV.tj_applied.ns.jobset.name",
        "$KV.tj_leases.applier.p0",
        f"{API}.CONSUMER.MSG.NEXT.{APPLY}.applier-p0",
        f"{API}.STREAM.MSG.DELETE.{EVENTS}",
        f"{API}.STREAM.MSG.DELETE.{APPLY}",
        "$JS.ACK.TJ_APPLY.applier-p0.1.1.1.1.0",
        "$JS.ACK.c1.AbCdEfGh.TJ_APPLY.applier-p0.1.1.1.1.0",  # the second form (a fleet member's server)
    ],
    # It records progress and reads back only the progress history it writes (to write what a crashed replica
    # left pending): no other stream, and nothing it could change there.
    "status-server": [
        *MANAGEMENT,
        "tj.ev.0.ns.name",
        "tj.apply.0.ns.name.jobset",
        "tj.result.0.ns.name.jobset",
        "tj.dlq.applier.ns.name",
        "$KV.tj_applied.ns.jobset.name",
        f"{API}.DIRECT.GET.{EVENTS}",
        f"{API}.DIRECT.GET.TJ_EVENTS_HISTORY",
        f"{API}.STREAM.PURGE.TJ_PROGRESS",
        f"{API}.STREAM.MSG.DELETE.TJ_PROGRESS",
    ],
    # It removes what a retention policy expired from the record streams: purges there and nothing else, no
    # work stream, no read of any record, no publish.
    "history-keeper": [
        *MANAGEMENT,
        "tj.ev.0.ns.name",
        "tj.apply.0.ns.name.jobset",
        "tj.result.0.ns.name.jobset",
        "tj.progress.0.ns.name",
        "tj.dlq.applier.ns.name",
        "$KV.tj_applied.ns.jobset.name",
        f"{API}.DIRECT.GET.TJ_EVENTS_HISTORY",
        f"{API}.DIRECT.GET.TJ_PROGRESS",
        f"{API}.STREAM.MSG.DELETE.TJ_EVENTS_HISTORY",
        f"{API}.STREAM.UPDATE.TJ_EVENTS_HISTORY",
        f"{API}.STREAM.DELETE.TJ_PROGRESS",
    ],
    # It adds objects to the logs bucket: it cannot read them back, remove or purge any, or touch a stream.
    "log-keeper": [
        *MANAGEMENT,
        "tj.ev.0.ns.name",
        "tj.apply.0.ns.name.jobset",
        "tj.progress.ns.name",
        "$KV.tj_applied.ns.jobset.name",
        f"{API}.DIRECT.GET.{LOGS}",
        f"{API}.DIRECT.GET.{LOGS}.$O.tj_logs.M.eA==",
        f"{API}.STREAM.MSG.GET.{LOGS}",
        f"{API}.STREAM.INFO.{LOGS}",
        f"{API}.STREAM.PURGE.{LOGS}",
        f"{API}.STREAM.DELETE.{LOGS}",
        f"{API}.STREAM.MSG.DELETE.{LOGS}",
        f"{API}.CONSUMER.CREATE.{LOGS}",
        f"{API}.DIRECT.GET.TJ_EVENTS_HISTORY",
    ],
}


@pytest.mark.parametrize("identity", sorted(REFUSED_PUBLISH))
async def test_each_identity_is_refused_every_publish_outside_its_permissions(
    identity: str, clients: dict[str, Client]
) -> None:
    before = await bus_state(clients["admin"].nc)
    client = clients[identity]
    allowed = [subject for subject in REFUSED_PUBLISH[identity] if not await client.refused_publish(subject)]
    assert allowed == [], f"{identity} may publish to {allowed}"
    # The attempts the server might have acted on had it let them through: a re-pointed durable, a purge.
    repoint = {"stream_name": EVENTS, "config": {"name": "planner-p0", "filter_subject": "tj.ev.>"}}
    assert await client.refused_publish(f"{API}.CONSUMER.CREATE.{EVENTS}", json.dumps(repoint).encode())
    assert await bus_state(clients["admin"].nc) == before


@pytest.mark.parametrize("identity", [i for i in IDENTITIES if i != "admin"])
async def test_no_identity_but_admin_may_subscribe_outside_its_own_inbox(
    identity: str, clients: dict[str, Client], creds: Credentials
) -> None:
    client = clients[identity]
    others = [
        prefix + ".>"
        for other in IDENTITIES
        if other != identity
        for prefix in (bus.inbox_prefix(creds.public_key(other)), bus.identity_inbox_prefix(other))
    ]  # another identity's replies, by its key's inbox or its name's: pulled messages, API answers, KV values
    for subject in [">", "tj.>", "tj.ev.>", "tj.apply.>", "$KV.>", "$JS.>", "$JS.ACK.>", "_INBOX.>", *others]:
        assert await client.refused_subscribe(subject), f"{identity} may subscribe to {subject}"
    assert not await client.refused_subscribe(bus.inbox_prefix(creds.public_key(identity)) + ".x")
    assert not await client.refused_subscribe(bus.identity_inbox_prefix(identity) + ".x")


async def test_only_the_admin_may_set_the_bus_up(server: LocalNats, creds: Credentials) -> None:
    """Every other identity is told at once (not after minutes of retried timeouts) and changes nothing.

    "At once" is the server's own refusal of ``$JS.API.INFO`` turned into ``NotAuthorized``, before any
    step is tried: a set-up that went on to its retried steps would run into the 60 s bound instead."""
    for identity in [i for i in IDENTITIES if i != "admin"]:
        nc = await bus.connect(server.url, name=identity, creds=creds.seed_file(identity))
        try:
            with pytest.raises(bus.NotAuthorized, match="may not manage streams"):
                await asyncio.wait_for(bus_setup.setup_bus(nc.jetstream(), streams.configured_streams()), timeout=60)
            assert any("$js.api.info" in refusal.lower() for refusal in bus.refusals(nc)), identity
        finally:
            await nc.close()


async def test_a_stolen_reply_inbox_is_useless(server: LocalNats, creds: Credentials) -> None:
    """A reader's API answers go to its own inbox prefix; the planner cannot listen there, so its direct
    gets' answers (the message bodies) do not reach anyone else."""
    reader = await connect_as(server, creds, "reader")
    planner = await connect_as(server, creds, "planner")
    try:
        assert reader.nc._inbox_prefix.decode().startswith("_INBOX_U")
        assert await planner.refused_subscribe(reader.nc._inbox_prefix.decode() + ".>")
    finally:
        await reader.nc.close()
        await planner.nc.close()


# ------------------------------------------------------------------------------------- what each may do


async def test_the_watcher_publishes_events(server: LocalNats, creds: Credentials) -> None:
    nc = await bus.connect(server.url, name="watcher", creds=creds.seed_file("watcher"))
    try:
        js = nc.jetstream()
        await bus_setup.bind_stream(js, EVENTS)
        ack = await js.publish(subjects.event_subject("sec", "w"), b"{}", headers={bus.MSG_ID: os.urandom(4).hex()})
        assert ack.stream == EVENTS
    finally:
        await nc.close()


@pytest.mark.parametrize(("role", "spec", "inbound", "outbound"), [
    ("planner", streams.PLANNER, subjects.event_subject, lambda ns, n: subjects.apply_subject(ns, n, "jobset")),
    ("applier", streams.APPLIER, lambda ns, n: subjects.apply_subject(ns, n, "jobset"),
     lambda ns, n: subjects.result_subject(ns, n, "jobset")),
])  # fmt: skip
async def test_a_stage_consumes_its_partitions_publishes_its_output_and_holds_its_leases(
    server: LocalNats, creds: Credentials, role: str, spec: streams.ConsumerSpec, inbound: Any, outbound: Any
) -> None:
    admin = await bus.connect(server.url, name="admin", creds=creds.seed_file("admin"))
    nc = await bus.connect(server.url, name=role, creds=creds.seed_file(role))
    name = f"s{os.urandom(3).hex()}"
    partition = subjects.partition_of("sec", name)
    try:
        await admin.jetstream().publish(inbound("sec", name), b"work")
        js = nc.jetstream()
        await bus_setup.bind_consumers(js, spec)
        durable = bus_setup.partition_consumer(spec, partition)
        pull = StreamingPull(nc, stream=spec.stream, durable=durable.durable, batch=8)
        await pull.start()
        try:
            got: list[Any] = []
            for _ in range(20):
                got += [m for m in await pull.next_batch(timeout=0.5) if m.subject == inbound("sec", name)]
                if got:
                    break
            assert [m.data for m in got] == [b"work"]
            await got[0].in_progress()
            await got[0].ack_sync()
        finally:
            await pull.stop()
        assert (await js.publish(outbound("sec", name), b"{}")).seq > 0
        letter = DeadLetter(
            stage=role, reason="test", error="", subject=inbound("sec", name), payload=b"", headers={},
            stream_seq=1, deliveries=1, dead_at=0.0,
        )  # fmt: skip
        assert (await js.publish(subjects.dlq_subject(role, "sec", name), encode(letter))).stream == DLQ

        acquired: list[int] = []

        async def on_acquire(p: int) -> None:
            acquired.append(p)

        async def on_release(p: int) -> None:
            acquired.remove(p)

        leases = PartitionLeases(
            await open_lease_bucket(js), role=role, replica="r1", on_acquire=on_acquire, on_release=on_release
        )
        await leases.tick()
        assert sorted(acquired) == list(range(16))
        # A second replica of the role: its claims collide with r1's keys (read back), then it gets a share.
        second: list[int] = []

        async def on_acquire_2(p: int) -> None:
            second.append(p)

        async def on_release_2(p: int) -> None:
            second.remove(p)

        other = PartitionLeases(leases.kv, role=role, replica="r2", on_acquire=on_acquire_2, on_release=on_release_2)
        await other.tick()  # every create collides: no error, nothing held
        await leases.tick()  # r1 sees two members and lets go of half
        await other.tick()
        assert len(second) == 8 and sorted(acquired + second) == list(range(16))
        await leases.run(_stopped())
        await other.run(_stopped())
    finally:
        await nc.close()
        await admin.close()


def _stopped() -> asyncio.Event:
    stop = asyncio.Event()
    stop.set()
    return stop


async def test_the_applier_uses_its_ledger_and_no_one_else_may(server: LocalNats, creds: Credentials) -> None:
    nc = await bus.connect(server.url, name="applier", creds=creds.seed_file("applier"))
    try:
        ledger = await Ledger.open(nc.jetstream())
        key = f"sec.jobset.{os.urandom(3).hex()}"
        revision = await ledger.kv.create(key, b"{}")
        assert (await ledger.kv.get(key)).revision == revision
    finally:
        await nc.close()
    for identity in ("planner", "watcher", "reader", "dlq-operator"):
        client = await connect_as(server, creds, identity)
        try:
            assert await client.refused_publish(f"$KV.{streams.APPLIED_BUCKET}.{key}")
            assert await client.refused_publish(f"{API}.DIRECT.GET.KV_{streams.APPLIED_BUCKET}.$KV.tj_applied.{key}")
        finally:
            await client.nc.close()


async def until_recorded(
    js: Any, stream: str, subject: str, *, timeout: float = 10.0
) -> list[bus_history.StoredMessage]:
    """What ``stream`` (a history stream, which copies its work stream's messages as they come) holds on ``subject``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        stored = await bus_history.read_stream(js, stream, subject)
        if stored or loop.time() > deadline:
            return stored
        await asyncio.sleep(0.1)


async def test_the_reader_reads_every_stream_and_the_dlq_operator_retries(
    server: LocalNats, creds: Credentials
) -> None:
    admin = await bus.connect(server.url, name="admin", creds=creds.seed_file("admin"))
    name = f"d{os.urandom(3).hex()}"
    original = subjects.apply_subject("sec", name, "jobset")
    letter = DeadLetter(
        stage="applier", reason="permanent", error="404", subject=original, payload=b"the plan", headers={},
        stream_seq=1, deliveries=1, dead_at=0.0,
    )  # fmt: skip
    ack = await admin.jetstream().publish(subjects.dlq_subject("applier", "sec", name), encode(letter))
    await admin.close()

    reader = await bus.connect(server.url, name="reader", creds=creds.seed_file("reader"))
    try:
        js = reader.jetstream()
        for spec in streams.RECORD_STREAMS:
            await js.stream_info(spec.name)
            await bus_history.read_stream(js, spec.name, spec.subjects[0] if spec.subjects else ">")
        assert any(d.seq == ack.seq for d in await history_tools.dead_letters(js))
        with pytest.raises(Exception):  # noqa: B017 - refused by the server; surfaces as a timeout
            await history_tools.retry_dead_letter(js, ack.seq)
    finally:
        await reader.close()

    operator = await bus.connect(server.url, name="dlq-operator", creds=creds.seed_file("dlq-operator"))
    try:
        js = operator.jetstream()
        assert await history_tools.retry_dead_letter(js, ack.seq) == original
        stored = await until_recorded(js, streams.APPLY_HISTORY.name, original)
        assert [m.data for m in stored] == [b"the plan"]
        assert all(d.seq != ack.seq for d in await history_tools.dead_letters(js))
    finally:
        await operator.close()


async def test_the_log_keeper_adds_logs_the_reader_reads_them_and_the_admin_deletes_one_trainjobs(
    clients: dict[str, Client],
) -> None:

    keeper, reader, admin = clients["log-keeper"], clients["reader"], clients["admin"]
    mine, other = "local/team-a/uid-1/", "local/team-a/uid-2/"
    for prefix in (mine, other):
        await object_store.put(keeper.nc.jetstream(), streams.LOGS, prefix + "manifest", b"x" * 300_000)
    found = await object_store.get(reader.nc.jetstream(), streams.LOGS, mine + "manifest")
    assert found is not None and found.complete and found.data == b"x" * 300_000
    # The reader may not write there, nor the status server (or anyone but the log-keeper).
    for identity in ("reader", "status-server", "watcher"):
        assert await clients[identity].refused_publish("$O.tj_logs.M.eA=="), identity
        assert await clients[identity].refused_publish("$O.tj_logs.C.x"), identity
    assert await keeper.refused_subscribe("$O.tj_logs.>")
    # One TrainJob's logs go, by its prefix; another's stay.
    assert await object_store.delete_prefix(admin.nc.jetstream(), streams.LOGS, mine) == [mine + "manifest"]
    assert await object_store.get(reader.nc.jetstream(), streams.LOGS, mine + "manifest") is None
    assert await object_store.get(reader.nc.jetstream(), streams.LOGS, other + "manifest") is not None


async def test_the_history_keeper_removes_an_expired_trainjobs_logs_without_reading_any(
    clients: dict[str, Client],
) -> None:
    from history_server.index import Summary
    from history_server.retention import KeptLogs

    keeper, reader = clients["history-keeper"], clients["reader"]
    mine, other = "local/team-k/uid-9/", "local/team-k/uid-8/"
    for prefix in (mine, other):
        await object_store.put(clients["log-keeper"].nc.jetstream(), streams.LOGS, prefix + "manifest", b"y" * 1000)
    logs = KeptLogs(keeper.nc, reader.nc.jetstream())
    expired = Summary(namespace="team-k", name="old", uid="uid-9")
    assert await logs.purge(expired, await logs.bounds()) == 1
    assert await object_store.get(reader.nc.jetstream(), streams.LOGS, mine + "manifest") is None
    assert await object_store.get(reader.nc.jetstream(), streams.LOGS, other + "manifest") is not None
    assert await keeper.refused_publish(f"{API}.DIRECT.GET.{LOGS}"), "the keeper may not read a log"


# --------------------------------------------------------------------------------------- the config itself


def test_the_server_config_holds_public_keys_only(creds: Credentials) -> None:
    config = server_authorization(creds)
    for identity in IDENTITIES:
        seed = creds.seed_file(identity).read_text().strip()
        assert seed.startswith("SU") and seed not in config
        assert creds.public_key(identity) in config
        assert creds.seed_file(identity).stat().st_mode & 0o777 == 0o600
    assert creds.root.stat().st_mode & 0o777 == 0o700
    assert "no_auth_user" not in config


# ---------------------------------------------------------------------------------------------------- TLS


async def test_tls_with_the_ca_connects_and_without_it_does_not(creds: Credentials, tmp_path: Path) -> None:
    """The self-signed path (``tjpipe nats-tls``): a server certificate for 127.0.0.1 from a private CA. A
    ``nats://`` URL is upgraded to TLS because the server requires it; only a client that trusts the CA
    gets through, and it still needs its nkey."""
    tls = write_self_signed_tls(tmp_path / "tls", ["127.0.0.1", "localhost"])
    tls_block = (
        f"tls {{\n  cert_file: {json.dumps(str(tls['tls.crt']))}\n  key_file: {json.dumps(str(tls['tls.key']))}\n}}\n"
    )
    local = start_nats(
        store_dir=tmp_path / "store",
        log_dir=tmp_path / "logs",
        name="nats-tls",
        authorization=server_authorization(creds) + tls_block,
    )
    try:
        trusted = bus.TlsFiles(ca=str(tls["ca.crt"]))
        nc = await bus.connect(local.url, name="tls", creds=creds.seed_file("reader"), tls=trusted)
        await nc.flush()
        assert nc.is_connected and nc._server_info.get("tls_required") is True
        await nc.close()
        with pytest.raises((ssl.SSLError, nats.errors.Error, OSError)):
            await nats.connect(local.url, allow_reconnect=False, max_reconnect_attempts=0, connect_timeout=2)
        with pytest.raises(bus.NotAuthorized):
            await bus.connect(local.url, name="no-nkey", tls=trusted)
    finally:
        local.stop()
