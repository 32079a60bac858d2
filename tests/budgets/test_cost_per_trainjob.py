"""What one torch TrainJob costs the pipeline, counted by the servers and held to a budget.

A TrainJob is created on the simulated cluster (``sim_cluster``: JobSet's manager, kube-controller-manager,
kube-scheduler, kwok pods that run 3 s) under the pipeline's three services, alone on a nats-server of
their own, and followed until the pipeline goes quiet. Every event, apply message, ledger write, ack, KV
read and API request it caused is counted from the servers' own counters (``costs``) and compared with the
tables below: one row per figure, the most it may cost and what each one buys. A row that goes over, or a
request of a kind no row names, fails the test; so does nothing else, timings least of all.

Raising a budget is allowed, on purpose: change the row's number and its reason in the same commit as
the change that costs more, and say in the commit message what the extra round trip buys. A figure that
comes out below its row is printed as a saving to lock in by lowering the row (docs/cost-budgets.md).

The watcher runs with a long resync period: a resync relists every TrainJob on a timer, which is a cost
per resync, not per TrainJob (the benchmark measures it, ``bench`` "writes on resync").
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from faults.support import (
    JOBSET,
    TRAINER,
    Pipeline,
    close_pipeline,
    condition_of,
    open_pipeline,
    stream_messages,
    trainjob,
    until,
)
from lifecycle.support import ready

from contracts import streams
from contracts.messages import decode_event
from tjpipe.local.cluster import SimulatedCluster, start_simulated_cluster

from .costs import Wiretap, audit_flags, measured, snapshot, until_quiet, until_started
from .declared import CREATION, LIFECYCLE, Row, table, verdict

pytestmark = [pytest.mark.cluster, pytest.mark.nats]

STEP = 90.0
"""Upper bound for one step (a state the pipeline and the simulated cluster have to reach)."""
RESYNC_SECONDS = "3600"


# ------------------------------------------------------------------------------------------- fixture


@pytest.fixture(scope="module")
def audited_cluster(
    tmp_path_factory: pytest.TempPathFactory, uncaptured_progress: Callable[[str], None]
) -> Iterator[tuple[SimulatedCluster, Path]]:
    """The simulated cluster (as ``sim_cluster``) on an apiserver that writes an audit log of every request, and
    the log's path: who sent each request is what tells the pipeline's apart from everyone else's."""
    root = tmp_path_factory.mktemp("audited-cluster")
    flags, log = audit_flags(root / "audit")
    cluster = start_simulated_cluster(
        work_dir=root,
        log_dir=root / "logs",
        kubeconfig_path=root / "kubeconfig",
        progress=uncaptured_progress,
        pod_run_seconds=3.0,
        extra_apiserver_args=flags,
    )
    try:
        yield cluster, log
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def budget_pipeline(
    audited_cluster: tuple[SimulatedCluster, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Pipeline]:
    """The lifecycle tests' pipeline (``faults.support.open_pipeline``): its own nats-server, the three services
    as the pipeline's own ServiceAccounts, the watcher limited to a fresh namespace."""
    cluster, _ = audited_cluster
    pipe = open_pipeline(
        cluster.kube, tmp_path_factory.mktemp("budgets"), runtimes=("torch-distributed",), own_identities=True
    )
    try:
        pipe.start("watcher", extra=["--resync-seconds", RESYNC_SECONDS])
        pipe.start("planner")
        pipe.start("applier")
        yield pipe
    finally:
        print(close_pipeline(pipe))


# ------------------------------------------------------------------------------------------- helpers


class Run:
    """One TrainJob's measurement: the wiretap and the snapshots around it. The test's own requests are the
    admin's, which the audit log tells apart; nothing needs subtracting."""

    def __init__(self, p: Pipeline, audit_log: Path) -> None:
        self.p = p
        self.audit_log = audit_log
        self.tap = Wiretap()

    async def __aenter__(self) -> Run:
        # The services bound their consumers and finished starting (their lists, their partitions' claims):
        # all of it before the window, since none of it is the TrainJob's.
        await ready(self.p)
        await until_started(self.audit_log)
        await until_quiet(self.p, self.audit_log)
        await self.tap.start(self.p)
        self.before = await snapshot(self.p, self.tap, self.audit_log)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.tap.stop()

    def create(self, body: dict[str, Any]) -> None:
        self.p.create(body)

    def trainjob(self, name: str) -> dict[str, Any]:
        return self.p.get(TRAINER, "TrainJob", name)

    def jobset(self, name: str) -> dict[str, Any] | None:
        return self.p.get_or_none(JOBSET, "JobSet", name)

    async def costs(self) -> dict[str, int]:
        await until_quiet(self.p, self.audit_log)
        return measured(self.before, await snapshot(self.p, self.tap, self.audit_log), self.p.namespace)


async def breakdown(p: Pipeline, name: str) -> tuple[dict[str, int], dict[str, Any]]:
    """The observations, the echoes and the apply messages by component, read back from the history; and for the
    log the apply messages by target and the watcher's cause for each event."""
    nc = await p.connect()
    try:
        js = nc.jetstream()
        ns = p.namespace
        applies = await stream_messages(js, streams.APPLY.name, f"tj.apply.*.{ns}.{name}.>")
        events = [decode_event(m.data) for m in await stream_messages(js, streams.EVENTS.name, f"tj.ev.*.{ns}.{name}")]
    finally:
        await nc.close()
    echoes = sum(1 for event in events if getattr(event, "echo", False))
    components = Counter(str(m.subject).rsplit(".", 1)[1].split("_", 1)[0] for m in applies)
    live = sum(1 for e in events if not getattr(e, "echo", True) and getattr(e, "runtime_source", "") != "snapshot")
    units = {"observation": len(events) - echoes, "echo": echoes, "observation without the snapshot": live}
    units |= {f"apply messages for {component}": count for component, count in components.items()}
    return units, {
        "applies by target": dict(Counter(str(m.subject).rsplit(".", 1)[1] for m in applies)),
        "event causes": [getattr(event, "cause", "deleted") for event in events],
    }


def check(
    what: str, costs: dict[str, int], rows: tuple[Row, ...], found: tuple[dict[str, int], dict[str, Any]]
) -> None:
    units, extra = found
    costs = {**costs, **units}
    print(f"\n[budgets] {what}:\n{table(costs, rows)}\n{json.dumps(extra, indent=1, default=str)}")
    print(f"[budgets-json] {json.dumps({'what': what, 'costs': costs, **extra}, default=str)}")
    problems = verdict(costs, rows)
    assert not problems, f"{what} costs other than its budget (docs/cost-budgets.md):\n" + "\n".join(problems)


# ------------------------------------------------------------------------------------------- tests


async def test_creation_costs_at_most_its_budget(
    budget_pipeline: Pipeline, audited_cluster: tuple[SimulatedCluster, Path]
) -> None:
    p = budget_pipeline
    name = "created"
    async with Run(p, audited_cluster[1]) as run:
        run.create(trainjob(name, num_nodes=2, suspend=True))

        def built() -> bool:
            js = run.jobset(name)
            suspended = condition_of(run.trainjob(name), "Suspended")
            return bool(js and js["spec"].get("suspend") and suspended and suspended["status"] == "True")

        await until(built, timeout=STEP, what="the suspended JobSet and the Suspended condition", interval=0.5)
        costs = await run.costs()
    check("creation (suspended)", costs, CREATION, await breakdown(p, name))


async def test_a_run_to_complete_costs_at_most_its_budget(
    budget_pipeline: Pipeline, audited_cluster: tuple[SimulatedCluster, Path]
) -> None:
    p = budget_pipeline
    name = "completed"
    async with Run(p, audited_cluster[1]) as run:
        run.create(trainjob(name, num_nodes=2))

        def complete() -> bool:
            done = condition_of(run.trainjob(name), "Complete")
            return bool(done and done["status"] == "True")

        await until(complete, timeout=STEP, what="Complete", interval=0.5)
        costs = await run.costs()
    check("run to Complete", costs, LIFECYCLE, await breakdown(p, name))
