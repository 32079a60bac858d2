"""The order of things: machine facts, planner, stack, floor, Trainer, services, end to end, amplification, memory.

The planner microbenchmark runs before any server starts; the apiserver floor and Trainer's controller run
before the pipeline's services start, so nothing measured competes with anything else for the two cores,
and Trainer's controller and the pipeline never run at the same time. The history server and the
status-server flood (Trainer's status server, then the pipeline's) run after the shared stack stopped, on
servers of their own. The lifecycle scenario (``--lifecycle``) runs last, Trainer's side then the pipeline's,
each on a simulated cluster of its own. Whatever fails, the stack is stopped and the report is written with
what was measured.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import secrets
import shlex
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from bench import stats, workload
from bench.micro import run_planner_micro

SCENARIOS = (
    "planner",
    "floor",
    "trainer",
    "trainer-memory",
    "one-process",
    "e2e",
    "paced",
    "writes",
    "memory",
    "history",
    "status-flood",
)
SERVER_SCENARIOS = ("floor", "trainer", "one-process", "e2e", "paced", "writes", "memory")
FLOOD = (2, 10, 10)
"""The status-server flood by default: 2 TrainJobs x 10 pods x 10 updates, 200 updates per side."""
QUICK_FLOOD = (2, 5, 6)
LIFECYCLE_JOBS, LIFECYCLE_NODES = 500, 20
"""The lifecycle's default run: a few minutes for both sides on two quiet cores."""
QUICK_LIFECYCLE_JOBS = 50
LARGE_LIFECYCLE_JOBS, LARGE_LIFECYCLE_NODES = 5_000, 200
"""``--lifecycle-large``: ten times the default on ten times the nodes, where per-TrainJob costs dominate."""


def lifecycle_default_jobs(*, quick: bool, large: bool) -> int:
    if large:
        return LARGE_LIFECYCLE_JOBS
    return QUICK_LIFECYCLE_JOBS if quick else LIFECYCLE_JOBS


@dataclass(frozen=True)
class Settings:
    out: Path
    quick: bool
    sizes: tuple[int, ...]
    memory_jobs: int
    skip: frozenset[str]
    floor_jobs: int
    floor_concurrency: int
    compare_jobs: int
    lifecycle_jobs: int
    lifecycle_nodes: int
    pod_run_seconds: float
    concurrency: int
    create_concurrency: int
    paced_rate: float
    paced_seconds: float
    planner_seconds: float
    quiet_seconds: float
    resync_seconds: float
    flood: tuple[int, int, int]
    """The status-server flood: TrainJobs per side, pods per TrainJob, updates per pod."""
    keep_state: bool
    command: str


def parse_args(argv: Sequence[str] | None = None) -> Settings:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="Benchmark the pipeline against its own local stack and write report.md and report.json.",
    )
    parser.add_argument("--quick", action="store_true", help="a small run (about 3 minutes on 2 quiet cores)")
    parser.add_argument("--out", type=Path, default=Path(".bench"), help="report folder (default .bench/)")
    parser.add_argument("--sizes", help="end-to-end sizes, comma-separated (default 200,1000; --quick 100)")
    parser.add_argument(
        "--memory-jobs",
        type=int,
        help="TrainJobs present for the memory figures, both sides (default 10000; --quick 1000)",
    )
    parser.add_argument(
        "--skip",
        action="append",
        default=[],
        help=f"scenarios to leave out, comma-separated or repeated: {', '.join(SCENARIOS)}",
    )
    parser.add_argument("--floor-jobs", type=int, help="TrainJobs per apiserver floor run (default: largest size)")
    parser.add_argument(
        "--floor-concurrency", type=int, default=32, help="TrainJobs in flight in the floor (create, then applies)"
    )
    parser.add_argument(
        "--compare-jobs", type=int, help="TrainJobs of the side-by-side runs with Trainer (default 1000; --quick 100)"
    )
    parser.add_argument(
        "--lifecycle",
        action="store_true",
        help="also run TrainJobs to completion on a simulated cluster, Trainer's controller then the pipeline "
        "(a stack of their own each, after everything else)",
    )
    parser.add_argument(
        "--lifecycle-large",
        action="store_true",
        help=f"the lifecycle's larger run: {LARGE_LIFECYCLE_JOBS:,} TrainJobs on {LARGE_LIFECYCLE_NODES} simulated "
        "nodes per side, unless --lifecycle-jobs/--lifecycle-nodes say otherwise (implies --lifecycle)",
    )
    parser.add_argument(
        "--lifecycle-only",
        action="store_true",
        help="run the lifecycle comparison alone: every other scenario skipped (implies --lifecycle)",
    )
    parser.add_argument(
        "--lifecycle-jobs",
        type=int,
        help=f"TrainJobs of the lifecycle run, per side (default {LIFECYCLE_JOBS}; --quick {QUICK_LIFECYCLE_JOBS})",
    )
    parser.add_argument(
        "--lifecycle-nodes", type=int, help=f"simulated nodes of the lifecycle run (default {LIFECYCLE_NODES})"
    )
    parser.add_argument("--pod-run-seconds", type=float, default=5.0, help="how long each simulated pod runs")
    parser.add_argument("--concurrency", type=int, default=16, help="applier concurrency")
    parser.add_argument("--create-concurrency", type=int, default=32, help="concurrent TrainJob creates")
    parser.add_argument("--paced-rate", type=float, default=20.0, help="TrainJobs/s of the paced run")
    parser.add_argument("--paced-seconds", type=float, help="length of the paced run (default 10; --quick 5)")
    parser.add_argument(
        "--flood",
        help="the status-server flood, TRAINJOBSxPODSxUPDATES per side "
        f"(default {'x'.join(map(str, FLOOD))}; --quick {'x'.join(map(str, QUICK_FLOOD))})",
    )
    parser.add_argument("--keep-state", action="store_true", help="keep the temporary stack folder and its logs")
    args = parser.parse_args(argv)

    skip = frozenset(s.strip() for item in args.skip for s in item.split(",") if s.strip())
    unknown = skip - set(SCENARIOS)
    if unknown:
        parser.error(f"unknown scenario(s) to skip: {', '.join(sorted(unknown))}; known: {', '.join(SCENARIOS)}")
    if args.lifecycle_only:
        skip = frozenset(SCENARIOS)
    wants_lifecycle = bool(args.lifecycle or args.lifecycle_large or args.lifecycle_only)
    for flag, value in (("--lifecycle-jobs", args.lifecycle_jobs), ("--lifecycle-nodes", args.lifecycle_nodes)):
        if value is not None and value <= 0:
            parser.error(f"{flag} needs a positive number, got {value}")
    quick = bool(args.quick)
    if args.sizes:
        try:
            sizes = tuple(int(s) for s in args.sizes.split(",") if s.strip())
        except ValueError:
            parser.error(f"--sizes takes integers, e.g. 200,1000; got {args.sizes!r}")
    else:
        sizes = (100,) if quick else (200, 1000)
    if not sizes or any(s <= 0 for s in sizes):
        parser.error("--sizes needs at least one positive size")
    memory_jobs = args.memory_jobs if args.memory_jobs is not None else (1000 if quick else 10_000)
    flood = QUICK_FLOOD if quick else FLOOD
    if args.flood:
        try:
            trainjobs, pods, updates = (int(n) for n in args.flood.lower().split("x"))
        except ValueError:
            parser.error(f"--flood takes TRAINJOBSxPODSxUPDATES, e.g. 2x10x10; got {args.flood!r}")
        if min(trainjobs, pods, updates) <= 0:
            parser.error(f"--flood needs three positive numbers, got {args.flood!r}")
        flood = (trainjobs, pods, updates)
    return Settings(
        out=args.out,
        quick=quick,
        sizes=sizes,
        memory_jobs=memory_jobs,
        skip=skip,
        floor_jobs=args.floor_jobs or max(sizes),
        floor_concurrency=args.floor_concurrency,
        compare_jobs=args.compare_jobs or (100 if quick else 1000),
        lifecycle_jobs=(args.lifecycle_jobs or lifecycle_default_jobs(quick=quick, large=args.lifecycle_large))
        if wants_lifecycle
        else 0,
        lifecycle_nodes=args.lifecycle_nodes or (LARGE_LIFECYCLE_NODES if args.lifecycle_large else LIFECYCLE_NODES),
        pod_run_seconds=args.pod_run_seconds,
        concurrency=args.concurrency,
        create_concurrency=args.create_concurrency,
        paced_rate=args.paced_rate,
        paced_seconds=args.paced_seconds if args.paced_seconds is not None else (5.0 if quick else 10.0),
        planner_seconds=0.5 if quick else 2.0,
        quiet_seconds=2.0 if quick else 3.0,
        resync_seconds=3.0 if quick else 5.0,
        flood=flood,
        keep_state=args.keep_state,
        command=shlex.join(["python", "-m", "bench", *(sys.argv[1:] if argv is None else argv)]),
    )


# ------------------------------------------------------------------------------------------- machine


def machine() -> dict[str, Any]:
    def read(path: str) -> str:
        try:
            return Path(path).read_text()
        except OSError:
            return ""

    mem_kib = stats.parse_status_kib(read("/proc/meminfo"), "MemTotal")
    return {
        "cores": os.cpu_count(),
        "cpu_model": stats.cpu_model(read("/proc/cpuinfo")),
        "memory_gib": round(mem_kib / 1024 / 1024, 1) if mem_kib else None,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "loadavg_start": _loadavg(),
    }


def _loadavg() -> str:
    try:
        return " ".join(f"{v:.2f}" for v in os.getloadavg())
    except OSError:
        return "n/a"


# -------------------------------------------------------------------------------------------- running


class Clock:
    def __init__(self) -> None:
        self.start = time.monotonic()

    def progress(self, line: str) -> None:
        print(f"[bench {time.monotonic() - self.start:6.1f}s] {line}", file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    settings = parse_args(argv)
    clock = Clock()
    started = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    report: dict[str, Any] = {
        "meta": {
            "command": settings.command,
            "started": started,
            "quick": settings.quick,
            "sizes": list(settings.sizes),
            "memory_jobs": settings.memory_jobs,
            "skipped": sorted(settings.skip),
            "backend": "",
            "settings": {
                "floor_jobs": settings.floor_jobs,
                "floor_concurrency": settings.floor_concurrency,
                "compare_jobs": settings.compare_jobs,
                "lifecycle_jobs": settings.lifecycle_jobs,
                "lifecycle_nodes": settings.lifecycle_nodes,
                "pod_run_seconds": settings.pod_run_seconds,
                "applier_concurrency": settings.concurrency,
                "create_concurrency": settings.create_concurrency,
                "paced_rate": settings.paced_rate,
                "paced_seconds": settings.paced_seconds,
                "planner_cpu_seconds_per_runtime": settings.planner_seconds,
                "quiet_seconds": settings.quiet_seconds,
                "resync_seconds": settings.resync_seconds,
                "flood": list(settings.flood),
            },
        },
        "machine": machine(),
        "scenarios": {},
        "notes": [],
    }
    status = 0
    try:
        asyncio.run(run(settings, report, clock))
    except KeyboardInterrupt:
        report["notes"].append("interrupted; the report holds what was measured until then")
        status = 130
    except Exception as exc:
        clock.progress(f"failed: {exc!r}")
        report["notes"].append(f"the run failed: {exc!r}; the report holds what was measured until then")
        report["error"] = traceback.format_exc()
        status = 1
    report["meta"]["duration_s"] = time.monotonic() - clock.start
    report["machine"]["loadavg_end"] = _loadavg()
    finish(report)
    write_report(settings.out, report)
    clock.progress(f"wrote {settings.out / 'report.md'} and {settings.out / 'report.json'}")
    return status


def finish(report: dict[str, Any]) -> None:
    """Ratios, checks and the notes that follow from the figures alone."""
    scenarios = report["scenarios"]
    stats.add_ratios(scenarios)
    report["checks"] = stats.build_checks(scenarios)
    e2e = scenarios.get("e2e") or {}
    for run in [*e2e.get("runs", []), *[e2e[k] for k in ("paced", "seed") if e2e.get(k)]]:
        if not (run.get("complete") and run.get("verified")):
            report["notes"].append(f"{run['label']}: {run.get('good', 0)}/{run['n']} built: {run.get('problem', '')}")
        if run.get("failed_results"):
            report["notes"].append(f"{run['label']}: the applier reported failures: {run['failed_results']}")
        if run.get("create_errors"):
            report["notes"].append(f"{run['label']}: TrainJob creates failed: {run['create_errors']}")
    memory = scenarios.get("memory") or {}
    fill = memory.get("fill") or {}
    if fill and not (fill.get("complete") and fill.get("verified")):
        report["notes"].append(f"memory fill: {fill.get('good', 0)}/{fill['n']} built: {fill.get('problem', '')}")
    life = scenarios.get("lifecycle") or {}
    for side in life.get("sides", []):
        run = life.get(side) or {}
        label = f"lifecycle, {run.get('label', side)}"
        if run.get("error"):
            report["notes"].append(f"{label}: the side failed: {run['error']}")
        if run.get("create_errors"):
            report["notes"].append(f"{label}: TrainJob creates failed: {run['create_errors']}")
        if run.get("exited"):
            report["notes"].append(f"{label}: the controller had exited: {run['exited']}")
    flood = scenarios.get("status_flood") or {}
    if flood.get("error") or flood.get("skipped"):
        report["notes"].append(f"status-server flood: {flood.get('error') or flood.get('skipped')}")
    cores = report["machine"].get("cores") or 1
    # Only the load at the start tells of other work: by the end the last minute's average is mostly the
    # benchmark's own servers (a lifecycle's simulated cluster keeps both cores busy by itself).
    text = str(report["machine"].get("loadavg_start", ""))
    with contextlib.suppress(ValueError, IndexError):
        if float(text.split()[0]) > cores:
            report["notes"].append(
                f"load average {text} at the start exceeds the {cores} cores: other work was running on this "
                "machine, so absolute figures are lower than on an idle one; ratios measured in this same run "
                "are less affected"
            )


def write_report(out: Path, report: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=2, sort_keys=False, default=str) + "\n")
    (out / "report.md").write_text(stats.render_markdown(report))


async def run(settings: Settings, report: dict[str, Any], clock: Clock) -> None:
    from tjpipe.local import crds

    progress = clock.progress
    scenarios = report["scenarios"]
    runtimes = crds.shipped_runtimes()
    if "planner" not in settings.skip:
        progress("planner microbenchmark (no servers running)")
        scenarios["planner"] = await asyncio.to_thread(
            run_planner_micro, runtimes, seconds=settings.planner_seconds, progress=progress
        )
    if any(s not in settings.skip for s in SERVER_SCENARIOS):
        await run_with_stack(settings, report, runtimes, progress)
    else:
        report["meta"]["backend"] = "none (no scenario needed the shared stack)"
    if "history" not in settings.skip:
        from bench.history import history_server

        progress(f"history server: {settings.memory_jobs} TrainJobs' history, on servers of its own")
        scenarios["history"] = await history_server(
            trainjobs=settings.memory_jobs,
            requests=50 if settings.quick else 200,
            runtime=runtimes[workload.TORCH_RUNTIME],
            progress=progress,
            keep_state=settings.keep_state,
        )
    if "status-flood" not in settings.skip:
        from bench.status_flood import status_flood

        trainjobs, pods, updates = settings.flood
        progress(
            f"status-server flood: {trainjobs} TrainJobs x {pods} pods x {updates} updates, to Trainer's status "
            "server then to the pipeline's, in namespaces of their own"
        )
        scenarios["status_flood"] = await status_flood(
            trainjobs=trainjobs, pods=pods, updates=updates, progress=progress, keep_state=settings.keep_state
        )
    if settings.lifecycle_jobs:
        from bench.lifecycle import lifecycle

        progress(
            f"lifecycle: {settings.lifecycle_jobs} TrainJobs to completion on {settings.lifecycle_nodes} simulated "
            "nodes, Trainer's controller then the pipeline, each on a simulated cluster of its own"
        )
        scenarios["lifecycle"] = {}
        await lifecycle(
            into=scenarios["lifecycle"],
            n=settings.lifecycle_jobs,
            nodes=settings.lifecycle_nodes,
            pod_run_seconds=settings.pod_run_seconds,
            runtime=runtimes[workload.TORCH_RUNTIME],
            concurrency=settings.concurrency,
            create_concurrency=settings.create_concurrency,
            quiet_seconds=settings.quiet_seconds,
            keep_state=settings.keep_state,
            progress=progress,
        )


async def run_with_stack(
    settings: Settings, report: dict[str, Any], runtimes: dict[str, dict[str, Any]], progress: Any
) -> None:

    from bench import scenarios as sc
    from bench.cluster import (
        CountingKube,
        Services,
        apply_object,
        bus_probe,
        close_clients,
        cpu_of,
        pids_by_name,
        purge_history,
    )
    from contracts import resources
    from plumbing.kube import KubeConfig
    from tjpipe.local.stack import Stack, StatePaths

    state = Path(tempfile.mkdtemp(prefix="tjpipe-bench-"))
    stack = Stack(paths=StatePaths(state), progress=lambda line: progress(f"stack: {line}"))
    backend = []
    backend.append(f"NATS_URL={os.environ['NATS_URL']}" if os.environ.get("NATS_URL") else "private nats-server")
    backend.append(
        f"KUBECONFIG={os.environ['KUBECONFIG']}" if os.environ.get("KUBECONFIG") else "private etcd + kube-apiserver"
    )
    report["meta"]["backend"] = ", ".join(backend) + f" (state in {state})"
    scenarios = report["scenarios"]
    kube: CountingKube | None = None
    nc: Any = None
    session: aiohttp.ClientSession | None = None
    try:
        await asyncio.to_thread(stack.start_infrastructure, use_env=True)  # the benchmark adopts NATS_URL/KUBECONFIG
        assert stack.kubeconfig is not None
        report["meta"]["backend"] += (
            "; NATS authorization on (an nkey identity per service, anonymous refused)"
            if stack.credentials is not None
            else "; NATS without credentials (anonymous)"
        )
        kube = CountingKube(KubeConfig.load(str(stack.kubeconfig)), max_connections=64)
        for name in (workload.TORCH_RUNTIME, workload.MPI_RUNTIME):
            await apply_object(kube, resources.CLUSTER_TRAINING_RUNTIME, runtimes[name], field_manager="tjpipe-bench")
        gang = workload.gang_runtime(runtimes[workload.TORCH_RUNTIME])
        await apply_object(kube, resources.CLUSTER_TRAINING_RUNTIME, gang, field_manager="tjpipe-bench")
        progress(f"runtimes installed: {workload.TORCH_RUNTIME}, {workload.MPI_RUNTIME}, {workload.GANG_RUNTIME}")

        floor_kinds = {"torch": workload.TORCH_ONLY, "mix": workload.MIX}
        if "floor" not in settings.skip:
            scenarios["floor"] = {"runs": []}
            for mix_name, mix in floor_kinds.items():
                floor_kube = CountingKube(
                    KubeConfig.load(str(stack.kubeconfig)), max_connections=settings.floor_concurrency
                )
                async with floor_kube:
                    scenarios["floor"]["runs"].append(
                        await sc.floor(
                            floor_kube,
                            {**runtimes, workload.GANG_RUNTIME: gang},
                            workload.kinds_for(settings.floor_jobs, mix),
                            label=f"{mix_name} N={settings.floor_jobs}",
                            concurrency=settings.floor_concurrency,
                            progress=progress,
                            cpu=lambda: cpu_of(pids_by_name(stack)),
                        )
                    )

        if "trainer" not in settings.skip:
            from bench.reference import trainer_side

            scenarios["reference"] = {"n": settings.compare_jobs, "memory_jobs": settings.memory_jobs}
            try:
                scenarios["reference"]["trainer"] = await trainer_side(
                    kube,
                    kubeconfig=stack.kubeconfig,
                    state_dir=state / "trainer",
                    pids=lambda extra: pids_by_name(stack, extra),
                    n=settings.compare_jobs,
                    memory_jobs=0 if "trainer-memory" in settings.skip else settings.memory_jobs,
                    create_concurrency=settings.create_concurrency,
                    quiet_seconds=settings.quiet_seconds,
                    run_id=secrets.token_hex(2),
                    progress=progress,
                )
            except Exception as exc:  # the pipeline's figures are still worth having
                progress(f"trainer: failed: {exc!r}")
                report["notes"].append(f"Trainer's controller could not be measured: {exc!r}")

        session = aiohttp.ClientSession()
        concurrency = ["--concurrency", str(settings.concurrency)]
        services = Services(
            stack=stack,
            session=session,
            progress=progress,
            base_args={"applier": concurrency, "controller": concurrency},
        )
        # Admin: the benchmark reads consumer state and stream sequences; the services run as their own identities.
        nc = await stack.connect(name="tjpipe-bench")
        js = nc.jetstream()
        if "trainer" not in settings.skip and "one-process" not in settings.skip:
            from bench.reference import ONE_PROCESS, one_process_side

            async def start_one() -> None:
                await services.start(ONE_PROCESS)
                await services.wait_ready([ONE_PROCESS])
                progress(f"one process: tjpipe controller ready, pid {services.pid(ONE_PROCESS)}")

            scenarios.setdefault("reference", {})["one_process"] = await one_process_side(
                kube,
                start=start_one,
                stop=lambda: services.stop(ONE_PROCESS),
                forget=lambda: purge_history(js),
                pids=lambda: pids_by_name(stack),
                probe=bus_probe(js),
                n=settings.compare_jobs,
                create_concurrency=settings.create_concurrency,
                quiet_seconds=settings.quiet_seconds,
                run_id=secrets.token_hex(2),
                progress=progress,
            )
        await services.start_all()
        progress(f"services ready: {', '.join(f'{p.name} pid {p.pid}' for p in stack.services)}")
        ctx = sc.Context(
            kube=kube,
            nc=nc,
            js=js,
            services=services,
            runtimes=runtimes,
            progress=progress,
            quiet_seconds=settings.quiet_seconds,
            create_concurrency=settings.create_concurrency,
        )

        if "trainer" not in settings.skip:
            from bench.reference import PIPELINE_PROCESSES, controller_run

            # First, with nothing else present: the same load as Trainer's, measured the same way.
            namespace = f"bench-pipeline-{ctx.run_id}"
            ctx.namespaces.append(namespace)
            side = await controller_run(
                kube,
                label=f"pipeline torch N={settings.compare_jobs}",
                namespace=namespace,
                n=settings.compare_jobs,
                create_concurrency=settings.create_concurrency,
                pids=lambda: pids_by_name(stack),
                controller=PIPELINE_PROCESSES,
                probe=bus_probe(js),
                quiet_seconds=settings.quiet_seconds,
                progress=progress,
            )
            ctx.present += side["created"]
            scenarios.setdefault("reference", {})["pipeline"] = {"run": side}

        e2e: dict[str, Any] = {"runs": []}
        if "e2e" not in settings.skip:
            scenarios["e2e"] = e2e
            for size in settings.sizes:
                e2e["runs"].append(
                    await sc.e2e_run(ctx, f"torch N={size}", workload.kinds_for(size, workload.TORCH_ONLY))
                )
                e2e["runs"].append(await sc.e2e_run(ctx, f"mix N={size}", workload.kinds_for(size, workload.MIX)))
        if "paced" not in settings.skip:
            scenarios["e2e"] = e2e
            n = max(1, round(settings.paced_rate * settings.paced_seconds))
            paced = await sc.e2e_run(
                ctx,
                f"paced {settings.paced_rate:g}/s",
                workload.kinds_for(n, workload.TORCH_ONLY),
                rate=settings.paced_rate,
            )
            paced["rate"] = settings.paced_rate
            e2e["paced"] = paced

        if "writes" not in settings.skip:
            if ctx.present == 0:
                seed = 50 if settings.quick else 200
                e2e.setdefault("seed", await sc.e2e_run(ctx, f"seed N={seed}", workload.kinds_for(seed, workload.MIX)))
            situations: list[dict[str, Any]] = []
            scenarios["write_amplification"] = {"resources": list(stats.TRACKED_RESOURCES), "situations": situations}
            for run in [*e2e.get("runs", []), *([e2e["paced"]] if e2e.get("paced") else [])]:
                row = dict(run["write_amplification"])
                row["name"] = f"creation: {run['label']}"
                situations.append(row)
            situations.append(await sc.resync_by_restarting_watcher(ctx, resync_seconds=settings.resync_seconds))
            situations.append(await sc.restart_all(ctx))
            situations.append(await sc.replay_latest_events(ctx))

        if "memory" not in settings.skip:
            progress(f"memory: filling up to {settings.memory_jobs} TrainJobs")
            scenarios["memory"] = await sc.memory(ctx, total=settings.memory_jobs)
            for s in scenarios["memory"]["services"]:
                progress(f"memory: {s['service']}: RSS {s['rss_mb'] or 0:.1f} MB (peak {s['hwm_mb'] or 0:.1f} MB)")
    finally:
        failed_logs = {p.name: p.log_tail(5) for p in stack.services if not p.is_running()}
        for name, tail in failed_logs.items():
            report["notes"].append(f"{name} had exited before the end; last log lines: {tail}")
        await close_clients(nc, session, kube)
        progress("stopping the stack")
        await asyncio.to_thread(stack.stop)
        if settings.keep_state:
            progress(f"state kept in {state}")
        else:
            shutil.rmtree(state, ignore_errors=True)
