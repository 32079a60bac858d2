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

``--pipeline N`` is the lag under the benchmark's own load instead: ``python -m bench``'s end-to-end creation
runs (torch and mix, N TrainJobs each, the pipeline's three processes on a private kube-apiserver) with a
fleet member's nats-server as the bus, the hub of three copying it meanwhile; and, in the same sitting, the same
runs on a lone bus, so what joining a fleet costs the member is a ratio of two runs side by side.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
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
    from tjpipe import fleet_nats
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
            await fleet_nats.wait_caught_up(hub.jetstream(), timeout=300)
            caught_up_s = time.monotonic() - started
            copied = await _copied(hub, admins)
        finally:
            for nc in (*admins.values(), hub):
                await nc.close()
    finally:
        running.stop()
        if root is None:
            shutil.rmtree(work, ignore_errors=True)
    return {
        "trainjobs_per_member": trainjobs,
        "members": members,
        "published": sum(counts),
        "fill_seconds": round(fill_s, 2),
        "hub_caught_up_seconds": round(caught_up_s, 2),
        **copied.figures(trainjobs * members),
    }


class _Copied:
    """Every record of the members' record streams against the hub's copy: lag per record, and bytes."""

    def __init__(self) -> None:
        self.lags: list[float] = []
        self.hub_bytes = self.member_bytes = self.hub_records = self.member_records = 0

    def figures(self, trainjobs: int) -> dict[str, Any]:
        lag = stats.summarize(self.lags)
        return {
            "records": {"member": self.member_records, "hub": self.hub_records},
            "lag_seconds": {k: (round(v, 4) if isinstance(v, float) else v) for k, v in lag.items()},
            "bytes_per_trainjob": {
                "hub_one_replica": round(self.hub_bytes / trainjobs),
                "hub_three_replicas": round(3 * self.hub_bytes / trainjobs),
                "member": round(self.member_bytes / trainjobs),
                "hub_over_member": stats.ratio(self.hub_bytes, self.member_bytes),
            },
        }


async def _copied(hub: Any, members: dict[str, Any]) -> _Copied:
    """The hub's copy of each member's record streams (``members``: cluster → a connection to its bus)."""
    out = _Copied()
    for spec in fleet_contract.FLEET_STREAMS:
        for cluster, nc in members.items():
            name = fleet_contract.fleet_stream(spec.origin, cluster)
            stored = await bus_history.read_stream(hub.jetstream(), name, f"{fleet_contract.PREFIX}.>")
            out.hub_records += len(stored)
            at_hub = {(fleet_contract.cluster_of(m.subject)[0], m.origin_seq): m.time for m in stored}
            out.hub_bytes += (await hub.jetstream().stream_info(name)).state.bytes
            js = nc.jetstream()
            out.member_bytes += (await js.stream_info(spec.origin)).state.bytes
            for record in await bus_history.read_stream(js, spec.origin, ">"):
                out.member_records += 1
                copied = at_hub.get((cluster, record.seq))
                if copied is not None:
                    out.lags.append(copied - record.time)
    return out


PIPELINE_ONLY = "planner,floor,trainer,one-process,paced,writes,memory,history,status-flood"
"""``python -m bench --skip``: everything but the end-to-end creation runs."""


def _bench_e2e(trainjobs: int, out: Path, bus: dict[str, str], progress: Progress) -> dict[str, Any]:
    """``python -m bench``'s end-to-end runs of ``trainjobs`` TrainJobs, on the bus ``bus`` names (NATS_URL and
    the folder of identities it trusts) or a private one; its report's runs. No CPU figure: an adopted
    nats-server is not the benchmark's process, so the two runs' CPU would not count the same things."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NATS_", "TJPIPE_")) and k != "KUBECONFIG"}
    env.update(bus)
    command = [sys.executable, "-m", "bench", "--skip", PIPELINE_ONLY, "--sizes", str(trainjobs), "--out", str(out)]
    progress(f"fleet: {' '.join(command[1:])} on {'the member' if bus else 'a lone bus'}")
    subprocess.run(command, env=env, check=True, timeout=1800)
    report = json.loads((out / "report.json").read_text())
    runs: list[dict[str, Any]] = report["scenarios"]["e2e"]["runs"]
    return {
        run["label"]: {
            "trainjobs_per_s": run.get("trainjobs_per_s"),
            "latency_p50_s": run["latency"].get("p50"),
            "latency_p99_s": run["latency"].get("p99"),
            "verified": run.get("verified"),
        }
        for run in runs
    }


async def member_under_load(*, trainjobs: int, progress: Progress, root: Path | None = None) -> dict[str, Any]:
    """The benchmark's creation runs on a lone bus, then on member c1 of a loopback fleet with the hub copying;
    the hub's lag behind the member over every record the second made, and both runs' figures."""
    from tjpipe import fleet_nats
    from tjpipe.local.fleet import start_fleet

    work = root or Path(tempfile.mkdtemp(prefix="tjpipe-bench-fleet-load-"))
    try:
        alone = await asyncio.to_thread(_bench_e2e, trainjobs, work / "alone", {}, progress)
        progress("fleet: starting a hub of 3 servers and member c1")
        running = start_fleet(work / "fleet", ["c1"])
        try:
            member = running.members["c1"]
            bus = {"NATS_URL": member.server.url, "TJPIPE_NATS_CREDS_DIR": str(member.creds.root)}
            as_member = await asyncio.to_thread(_bench_e2e, trainjobs, work / "member", bus, progress)
            admin = await member.connect("admin")
            hub = await running.hub_connect()
            try:
                started = time.monotonic()
                await fleet_nats.wait_caught_up(hub.jetstream(), timeout=300)
                caught_up_s = time.monotonic() - started
                copied = await _copied(hub, {"c1": admin})
            finally:
                for nc in (admin, hub):
                    await nc.close()
        finally:
            running.stop()
    finally:
        if root is None:
            shutil.rmtree(work, ignore_errors=True)
    runs = {
        label: {
            "alone": alone[label],
            "member": as_member.get(label),
            "throughput_member_over_alone": stats.ratio(
                (as_member.get(label) or {}).get("trainjobs_per_s"), alone[label]["trainjobs_per_s"]
            ),
        }
        for label in alone
    }
    return {
        "trainjobs_per_run": trainjobs,
        "runs": runs,
        "hub_caught_up_after_run_seconds": round(caught_up_s, 2),
        **copied.figures(2 * trainjobs),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fleet", description=__doc__.splitlines()[0])
    parser.add_argument("--trainjobs", type=int, default=200, help="TrainJobs' records per member (default 200)")
    parser.add_argument("--members", type=int, default=2, help="member clusters (default 2)")
    parser.add_argument(
        "--pipeline",
        type=int,
        metavar="N",
        help="instead: python -m bench's creation runs of N TrainJobs (torch, mix) on a lone bus, then on a member",
    )
    args = parser.parse_args(argv)
    from tjpipe.local import crds

    if args.pipeline:
        loaded = asyncio.run(
            member_under_load(trainjobs=args.pipeline, progress=lambda line: print(line, file=sys.stderr))
        )
        print(json.dumps(loaded, indent=2))
        lag = loaded["lag_seconds"]
        for label, run in loaded["runs"].items():
            alone = run["alone"]["trainjobs_per_s"] or 0
            member = (run["member"] or {}).get("trainjobs_per_s") or 0
            ratio = run["throughput_member_over_alone"] or 0
            print(f"{label}: {alone:.1f} TJ/s alone, {member:.1f} as a member ({ratio:.2f}x)")
        print(
            f"hub lag behind the member under the benchmark's load: p50 {lag['p50']}s, p99 {lag['p99']}s, "
            f"max {lag['max']}s ({lag['count']} records); the hub caught up "
            f"{loaded['hub_caught_up_after_run_seconds']}s after the runs"
        )
        return 0

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
