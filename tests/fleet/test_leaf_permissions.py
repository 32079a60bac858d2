"""What a member's leaf credentials may do at the hub: export that member's records when asked, nothing else.

A member's own server enforces the permissions the hub sends it, but a member is not trusted to: whoever holds
its leaf seed may run a server that ignores them, or speak the leaf protocol directly. So the checks here speak
the leaf protocol to the hub themselves (TLS, CONNECT signed with the member's seed, LMSG frames), as such a
rogue would, and observe the hub's own answer (``-ERR 'Permissions Violation ...'``) and the state afterwards:
another member's records unchanged, no request reaching another member's or the hub's JetStream.
"""

from __future__ import annotations

import asyncio
import base64
import json
import ssl
from pathlib import Path

import nats
import nats.errors
import nkeys
import pytest

from contracts import fleet as fleet_contract
from contracts import streams, subjects
from fleet.support import (
    EVENTS_FLEET,
    RESULTS_FLEET,
    Fleet,
    hub_records,
    publish_large_results,
    publish_records,
    until_hub_holds,
)
from tjpipe import fleet_nats

pytestmark = [pytest.mark.nats, pytest.mark.timeout(120)]


class RogueLeaf:
    """A leaf connection to the hub made by hand with a member's leaf seed, obeying none of its permissions."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.lines: list[str] = []
        self._pump = asyncio.create_task(self._read())

    @classmethod
    async def open(cls, servers: Fleet, cluster: str, *, with_certificate: bool = True) -> RogueLeaf:
        """A leaf connection to the hub's first server with ``cluster``'s seed (and client certificate)."""
        reader, writer = await asyncio.open_connection("127.0.0.1", servers.leaf_ports[0])
        info = json.loads((await reader.readline()).decode().split(" ", 1)[1])
        context = ssl.create_default_context(cafile=str(servers.tls["ca.crt"]))
        if with_certificate:
            context.load_cert_chain(servers.tls[f"{cluster}.crt"], servers.tls[f"{cluster}.key"])
        seed_file = servers.creds.leaf_seed(cluster)
        await writer.start_tls(context, server_hostname="127.0.0.1")
        pair = nkeys.from_seed(bytearray(seed_file.read_bytes().strip()))
        try:
            signature = base64.urlsafe_b64encode(pair.sign(info["nonce"].encode())).rstrip(b"=").decode()
            public = pair.public_key.decode()
        finally:
            pair.wipe()
        connect = {"nkey": public, "sig": signature, "name": "rogue", "headers": True, "compression": "off"}
        writer.write(f"CONNECT {json.dumps(connect)}\r\nPING\r\n".encode())
        await writer.drain()
        leaf = cls(reader, writer)
        await leaf.wait_for("PONG")
        return leaf

    async def _read(self) -> None:
        while line := await self.reader.readline():
            text = line.decode(errors="replace").strip()
            if text == "PING":
                self.writer.write(b"PONG\r\n")
                await self.writer.drain()
            self.lines.append(text)

    async def wait_for(self, fragment: str, *, timeout: float = 3.0) -> bool:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while loop.time() < deadline:
            if any(fragment.lower() in line.lower() for line in self.lines):
                return True
            if self._pump.done():  # the hub closed the connection
                return False
            await asyncio.sleep(0.05)
        return False

    async def publish(self, subject: str, payload: bytes, reply: str = "") -> bool:
        """Send ``payload`` to ``subject`` at the hub; whether the hub refused it.

        The hub answers a leaf's publish outside its permissions by closing the leaf connection (a protocol
        violation, logged as ``Publish Violation on "<subject>"``); an allowed one is followed by our PONG.
        """
        self.lines.clear()
        head = f"LMSG {subject} {reply + ' ' if reply else ''}{len(payload)}\r\n".encode()
        self.writer.write(head + payload + b"\r\nPING\r\n")
        try:
            await self.writer.drain()
        except ConnectionError:
            return True
        pong = await self.wait_for("PONG")
        await asyncio.sleep(0.1)
        return not pong or self._pump.done()

    async def subscribe(self, subject: str) -> None:
        """Ask the hub for ``subject``'s messages (leaf interest, ``LS+``)."""
        self.writer.write(f"LS+ {subject}\r\nPING\r\n".encode())
        await self.writer.drain()
        await self.wait_for("PONG")

    def received(self) -> list[str]:
        """Every message the hub sent it: ``LMSG``, or ``HMSG`` for one with headers (records, flow control)."""
        return [line for line in self.lines if line.startswith(("LMSG ", "HMSG "))]

    async def close(self) -> None:
        self._pump.cancel()
        self.writer.close()


async def test_a_members_leaf_seed_is_refused_as_a_client(fleet_servers: Fleet) -> None:
    """The seed only ever logs in as a leaf node: on the hub's client port it is not accepted at all."""
    with pytest.raises(nats.errors.Error, match=r"(?i)authorization"):
        await nats.connect(
            servers=fleet_servers.hub.url.split(","),
            nkeys_seed=str(fleet_servers.creds.leaf_seed("c1")),
            allow_reconnect=False,
            max_reconnect_attempts=0,
            connect_timeout=3,
        )


async def test_a_members_leaf_seed_cannot_reach_another_member_or_the_hubs_streams(fleet_servers: Fleet) -> None:
    c2 = fleet_servers.members["c2"]
    before = await hub_records(fleet_servers, EVENTS_FLEET)
    c2_info = await _stream_state(c2.server.url, c2.creds.seed_file("admin"), streams.RESULTS.name)

    admin = await fleet_servers.hub_connect()
    seen: list[tuple[str, bytes]] = []

    async def watch(msg: nats.aio.msg.Msg) -> None:
        seen.append((msg.subject, msg.data))

    await admin.subscribe(">", cb=watch)
    await admin.flush()
    try:
        forged = json.dumps({"cluster": "c2", "n": 999}).encode()
        refused = {
            # Records under the other member's name, by its delivery subject or straight onto the fleet subjects.
            f"{fleet_contract.DELIVER_PREFIX}.c2.{streams.EVENTS_HISTORY.name}.x": forged,
            fleet_contract.fleet_subject("c2", subjects.event_subject("team-a", "job-0")): forged,
            # Into the other member's domain: its JetStream API.
            f"$JS.c2.API.STREAM.PURGE.{streams.RESULTS.name}": b"",
            f"$JS.c2.API.CONSUMER.CREATE.{streams.RESULTS.name}": b"{}",
            # The hub's own JetStream, under its domain and plainly: its fleet and work streams.
            f"$JS.{fleet_contract.HUB_DOMAIN}.API.STREAM.PURGE.{EVENTS_FLEET}": b"",
            f"$JS.API.STREAM.DELETE.{EVENTS_FLEET}": b"",
            f"$JS.API.STREAM.PURGE.{streams.EVENTS.name}": b"",
            # The hub's work subjects, were the hub to run a pipeline of its own.
            subjects.event_subject("team-a", "job-0"): forged,
            subjects.apply_subject("team-a", "job-0", "jobset"): forged,
        }
        for subject, payload in refused.items():
            leaf = await RogueLeaf.open(fleet_servers, "c1")
            try:
                assert await leaf.publish(subject, payload, reply="_INBOX_rogue.1"), f"the hub let {subject} through"
            finally:
                await leaf.close()
            # The hub logs the subject as its own JetStream sees it: its domain's API is its plain API.
            logged = subject.replace(f"$JS.{fleet_contract.HUB_DOMAIN}.API.", "$JS.API.")
            assert f'Publish Violation on "{logged}"' in fleet_servers.hub.servers[0].process.log_path.read_text()
        # What the hub does let it send: its own delivery subject (no source of the hub listens on this one).
        leaf = await RogueLeaf.open(fleet_servers, "c1")
        try:
            assert not await leaf.publish(f"{fleet_contract.DELIVER_PREFIX}.c1.nothing", b"{}")
        finally:
            await leaf.close()
    finally:
        await admin.close()
    await asyncio.sleep(0.5)
    # Nothing the rogue sent reached anyone at the hub (the members' own deliveries and heartbeats go on).
    assert not [(subject, data) for subject, data in seen if subject in refused or data == forged]
    after = await hub_records(fleet_servers, EVENTS_FLEET)
    assert [(r.subject, r.data) for r in after] == [(r.subject, r.data) for r in before]
    assert await _stream_state(c2.server.url, c2.creds.seed_file("admin"), streams.RESULTS.name) == c2_info


async def test_the_hub_cannot_send_a_member_its_work_subjects(fleet_servers: Fleet) -> None:
    """Hub → member, the leaf user may only carry consumer creates for the record streams and flow control:
    an admin of the hub publishing onto a member's work subjects or into its work streams' API reaches nothing."""
    c1 = fleet_servers.members["c1"]
    before = await _stream_state(c1.server.url, c1.creds.seed_file("admin"), streams.EVENTS.name)
    admin = await fleet_servers.hub_connect()
    try:
        await admin.publish(subjects.event_subject("team-a", "job-0"), b"{}")
        await admin.publish(subjects.apply_subject("team-a", "job-0", "jobset"), b"{}")
        # No answer: no responder where the hub has no interest from the member for it, or the request is
        # dropped on the way (the member's wildcard interest in its domain's API is only loosely matched
        # against the leaf user's permissions at subscription time; each message is checked).
        with pytest.raises((nats.errors.NoRespondersError, nats.errors.TimeoutError)):
            await admin.request(f"$JS.c1.API.STREAM.PURGE.{streams.EVENTS.name}", b"", timeout=2)
        with pytest.raises((nats.errors.NoRespondersError, nats.errors.TimeoutError)):
            await admin.request(f"$JS.c1.API.CONSUMER.CREATE.{streams.EVENTS.name}", b"{}", timeout=2)
        await admin.flush()
    finally:
        await admin.close()
    await asyncio.sleep(0.5)
    assert await _stream_state(c1.server.url, c1.creds.seed_file("admin"), streams.EVENTS.name) == before


async def _stream_state(url: str, seed: Path, stream: str) -> tuple[int, int, int]:
    """Messages, last sequence and consumers of ``stream``: what a request that got through would change."""
    nc = await nats.connect(url, nkeys_seed=str(seed), allow_reconnect=False)
    try:
        info = await nc.jetstream().stream_info(stream)
        return info.state.messages, info.state.last_seq, info.state.consumer_count
    finally:
        await nc.close()


def test_leaf_permissions_name_only_the_members_own_subjects() -> None:
    rules = fleet_nats.leaf_permissions("c1")
    assert all(".c1." in subject for subject in rules.publish + rules.subscribe)
    assert not any(subject.startswith(("tj.", "$JS.API", "$KV")) for subject in rules.publish + rules.subscribe)


async def test_a_members_leaf_seed_gets_no_flow_control_of_another_member(fleet_servers: Fleet) -> None:
    """Each member's server names its domain in its consumers' flow control (``$JS.FC.<cluster>.…``) and each
    leaf user may receive only its own: a rogue with c1's seed asking for c2's flow control, every member's,
    the first form's or c2's API gets none of it, while both members' copies, flow-controlled, reach the hub."""
    admin = await fleet_servers.hub_connect()
    flow_control: list[str] = []

    async def watch(msg: nats.aio.msg.Msg) -> None:
        flow_control.append(msg.subject)

    await admin.subscribe("$JS.FC.>", cb=watch)
    await admin.flush()
    leaves = []
    try:
        results = streams.RESULTS.name
        for subject in ("$JS.FC.>", "$JS.FC.c2.>", f"$JS.FC.*.*.{results}.>", f"$JS.FC.{results}.>", "$JS.c2.API.>"):
            leaf = await RogueLeaf.open(fleet_servers, "c1")
            await leaf.subscribe(subject)
            leaves.append(leaf)
        before = len(await hub_records(fleet_servers, RESULTS_FLEET))
        count = 600
        await asyncio.gather(
            publish_large_results(fleet_servers.members["c1"], count=count, size=5000),
            publish_large_results(fleet_servers.members["c2"], count=count, size=5000),
        )
        held = await until_hub_holds(fleet_servers, RESULTS_FLEET, before + 2 * count, timeout=60)
        assert len(held) == before + 2 * count
        await asyncio.sleep(0.5)
        # Of c2, nothing: at most c1's own flow control reaches any of them (their wildcards match it too).
        heard = [line for leaf in leaves for line in leaf.received()]
        assert [line for line in heard if not line.startswith("HMSG $JS.FC.c1.")] == []
        # The hub answered each member's flow control, in the form that names the member.
        assert "c2" in {subject.split(".")[2] for subject in flow_control}, flow_control
        assert {subject.split(".")[2] for subject in flow_control} <= {"c1", "c2"}, flow_control
    finally:
        await admin.close()
        for leaf in leaves:
            await leaf.close()


async def test_a_members_leaf_seed_hears_nothing_of_another_member(fleet_servers: Fleet) -> None:
    """Asking the hub for another member's copies, the fleet's subjects or everything gets nothing of them."""
    c2 = fleet_servers.members["c2"]
    leaves = []
    try:
        for subject in (f"{fleet_contract.DELIVER_PREFIX}.c2.>", "$JSC.R.c2.>", f"{fleet_contract.PREFIX}.>", ">"):
            leaf = await RogueLeaf.open(fleet_servers, "c1")
            await leaf.subscribe(subject)
            leaves.append(leaf)
        before = len(await hub_records(fleet_servers, EVENTS_FLEET))
        await publish_records(c2, start=10_000, count=5)
        while len(await hub_records(fleet_servers, EVENTS_FLEET)) < before + 5:
            await asyncio.sleep(0.2)
        await asyncio.sleep(0.5)
        # Of c2, nothing: at most c1's own flow control reaches any of them (their wildcards match it too).
        heard = [line for leaf in leaves for line in leaf.received()]
        assert [line for line in heard if not line.startswith("HMSG $JS.FC.c1.")] == []
    finally:
        for leaf in leaves:
            await leaf.close()


async def test_a_leaf_seed_without_a_members_certificate_gets_no_connection(fleet_servers: Fleet) -> None:
    """The hub verifies its members' client certificates: a stolen seed alone does not get a leaf connection."""
    with pytest.raises((ssl.SSLError, ConnectionError, asyncio.IncompleteReadError, TimeoutError)):
        leaf = await asyncio.wait_for(RogueLeaf.open(fleet_servers, "c1", with_certificate=False), timeout=10)
        try:
            # TLS 1.3 reports a refused client certificate on the first read after the handshake.
            assert await leaf.publish(f"{fleet_contract.DELIVER_PREFIX}.c1.nothing", b"{}")
            raise ConnectionError("refused after the handshake")
        finally:
            await leaf.close()
    assert "client didn't provide a certificate" in fleet_servers.hub.servers[0].process.log_path.read_text()
