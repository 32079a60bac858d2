"""The fleet's figures: how far the hub lags behind its members under load, and what a TrainJob costs the hub.

A loopback fleet (``tjpipe.local.fleet``: a hub of three nats-servers, members joined as leaf nodes with their
own JetStream domains) is filled the way the pipeline fills a member's bus: for each TrainJob its event, the
plans ``planner.core.plan`` makes of it, a result per plan and a second event once it completed
(``bench.history._fill``), published in every member at once as fast as the admin identity can. The hub
copies them with its stream sources meanwhile.

Lag is per record: the time the hub stored its copy minus the time the member stored the record, both from
the servers' own stored timestamps on one machine's clock, over every record of every member's five record
streams; so it is the lag under the load of the fill itself. Storage is the fleet streams' bytes (one
replica; the hub keeps three) per TrainJob, next to the member's record streams' bytes per TrainJob.

Figures are printed, never asserted: ``python -m bench.fleet --trainjobs 200``. On 2 shared cores the fleet's
five servers compete with the publishers for CPU, which is part of what the lag shows.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench import stats, workload
from bench.history import _fill
from contracts import fleet as fleet_contract
from plumbing import bus_history

Progress = Callable[[str], None]


async def fleet_figures(
    *, trainjobs: int, members: int, runtime: dict[str, Any], progress: Progress, root: Path | None = None
) -> dict[str, Any]:
    """Fill ``members`` members with ``trainjobs`` TrainJobs' records each; the hub's lag and storage."""
    from tjpipe import fleet
    from tjpipe.local.fleet import start_fleet

    clusters = [f"c{i + 1}" for i in range(members)]
    work = root or Path(tempfile.mkdtemp(prefix="tjpipe-bench-fleet-"))
    progress(f"fleet: starting a hub of 3 servers and {members} members in {work}")
    running = start_fleet(work, clusters)
    try:
        admins = {c: await running.members[c].connect("admin") for c in clusters}
        hub = await running.hub_connect()
        try:
            started = time.monotonic()
            counts = await asyncio.gather(
                *(
                    _fill(admins[c].jetstream(), trainjobs=trainjobs, runtime=runtime, progress=progress)
                    for c in clusters
                )
            )
            fill_s = time.monotonic() - started
            progress(f"fleet: {sum(counts)} records published in {fill_s:.1f}s; waiting for the hub")
            await fleet.wait_caught_up(hub.jetstream(), timeout=300)
            caught_up_s = time.monotonic() - started
            lags: list[float] = []
            hub_bytes = member_bytes = 0
            hub_records = member_records = 0
            for spec in fleet_contract.FLEET_STREAMS:
                stored = await bus_history.read_stream(hub.jetstream(), spec.name, f"{fleet_contract.PREFIX}.>")
                hub_records += len(stored)
                at_hub = {(fleet_contract.cluster_of(m.subject)[0], m.origin_seq): m.time for m in stored}
                hub_bytes += (await hub.jetstream().stream_info(spec.name)).state.bytes
                for cluster in clusters:
                    js = admins[cluster].jetstream()
                    member_bytes += (await js.stream_info(spec.origin)).state.bytes
                    for record in await bus_history.read_stream(js, spec.origin, ">"):
                        member_records += 1
                        copied = at_hub.get((cluster, record.seq))
                        if copied is not None:
                            lags.append(copied - record.time)
        finally:
            for nc in (*admins.values(), hub):
                await nc.close()
    finally:
        running.stop()
        if root is None:
            shutil.rmtree(work, ignore_errors=True)
    jobs = trainjobs * members
    lag = stats.summarize(lags)
    return {
        "trainjobs_per_member": trainjobs,
        "members": members,
        "records": {"member": member_records, "hub": hub_records, "published": sum(counts)},
        "fill_seconds": round(fill_s, 2),
        "hub_caught_up_seconds": round(caught_up_s, 2),
        "lag_seconds": {k: (round(v, 4) if isinstance(v, float) else v) for k, v in lag.items()},
        "bytes_per_trainjob": {
            "hub_one_replica": round(hub_bytes / jobs),
            "hub_three_replicas": round(3 * hub_bytes / jobs),
            "member": round(member_bytes / jobs),
            "hub_over_member": stats.ratio(hub_bytes, member_bytes),
        },
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fleet", description=__doc__.splitlines()[0])
    parser.add_argument("--trainjobs", type=int, default=200, help="TrainJobs' records per member (default 200)")
    parser.add_argument("--members", type=int, default=2, help="member clusters (default 2)")
    args = parser.parse_args(argv)
    from tjpipe.local import crds

    runtime = crds.shipped_runtimes()[workload.TORCH_RUNTIME]
    figures = asyncio.run(
        fleet_figures(
            trainjobs=args.trainjobs,
            members=args.members,
            runtime=runtime,
            progress=lambda line: print(line, file=sys.stderr),
        )
    )
    lag = figures["lag_seconds"]
    size = figures["bytes_per_trainjob"]
    print(json.dumps(figures, indent=2))
    print(
        f"hub lag behind a member under load: p50 {lag['p50']}s, p99 {lag['p99']}s, max {lag['max']}s "
        f"({lag['count']} records); storage per TrainJob: hub {size['hub_one_replica']} B per replica "
        f"({size['hub_three_replicas']} B on its 3 servers), member {size['member']} B, hub/member "
        f"{size['hub_over_member'] or 0:.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
