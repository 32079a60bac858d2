"""Each member's copies at the hub are in streams of its own, each with the member's quota as its byte limit:
a member that floods the hub drops only its own oldest copies, never another member's.

The quota here is set small (512 KiB for the results) by the hub's administrator, as ``setup_fleet_streams``
would with a smaller limit; c1 then sends about three times that. Checked against the real servers: c2's
copies are all still at the hub, unchanged; c1's stream is within its quota, holds c1's newest results and
dropped its oldest, its source has caught up, and the gap count says nothing was lost (the hub removed
those copies itself; a member's records it never got would be counted).
"""

from __future__ import annotations

import msgspec
import pytest

from contracts import fleet as fleet_contract
from contracts import streams
from fleet.support import RESULTS_FLEET, Fleet, hub_records, publish_large_results, publish_records
from plumbing import bus_setup
from tjpipe import fleet_nats

pytestmark = [pytest.mark.nats, pytest.mark.timeout(150)]

QUOTA = 512 * 1024


async def test_a_member_flooding_the_hub_leaves_another_members_records_intact(fleet_servers: Fleet) -> None:
    c1, c2 = fleet_servers.members["c1"], fleet_servers.members["c2"]
    (spec,) = [s for s in fleet_contract.FLEET_STREAMS if s.name == RESULTS_FLEET]
    admin = await fleet_servers.hub_connect()
    try:
        js = admin.jetstream()
        for cluster in ("c1", "c2"):
            small = msgspec.structs.replace(spec, member_max_bytes=QUOTA)
            await bus_setup.put_stream(js, fleet_nats.fleet_stream_config(small, cluster))

        await publish_records(c2, start=0, count=20)
        await fleet_nats.wait_caught_up(js, timeout=60)
        before = [(r.seq, r.subject, r.data) for r in await hub_records(fleet_servers, RESULTS_FLEET)]
        before_c2 = [r for r in before if fleet_contract.cluster_of(r[1])[0] == "c2"]
        assert len(before_c2) == 20

        await publish_large_results(c1, count=300, size=5000)  # about 1.5 MB: three times c1's quota at the hub
        c1_admin = await c1.connect("admin")
        try:
            c1_last = (await c1_admin.jetstream().stream_info(streams.RESULTS.name)).state.last_seq
        finally:
            await c1_admin.close()
        states = await fleet_nats.wait_caught_up(js, timeout=60)
        c1_stream = await js.stream_info(fleet_contract.fleet_stream(streams.RESULTS.name, "c1"))
        after = await hub_records(fleet_servers, RESULTS_FLEET)
    finally:
        await admin.close()

    # c2's copies: every one still there, unchanged.
    assert [(r.seq, r.subject, r.data) for r in after if fleet_contract.cluster_of(r.subject)[0] == "c2"] == before_c2
    # c1's: within its quota, its newest copied, its oldest dropped by the hub (not lost on the way).
    mine = [r for r in after if fleet_contract.cluster_of(r.subject)[0] == "c1"]
    assert c1_stream.state.bytes <= QUOTA
    assert mine[-1].origin_seq == c1_last
    assert 0 < len(mine) < 300
    assert {(s.stream, s.cluster): s.lag for s in states}[(RESULTS_FLEET, "c1")] == 0
    reader = await fleet_servers.hub_connect(fleet_nats.HUB_READER)
    try:
        gaps = {(g.stream, g.cluster): g.missing for g in await fleet_nats.source_gaps(reader.jetstream())}
    finally:
        await reader.close()
    assert gaps[(RESULTS_FLEET, "c1")] == 0
