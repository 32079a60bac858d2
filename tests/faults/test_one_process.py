"""``tjpipe controller``: the three stages in one process, on the real servers.

It must build what the three processes build, with each stage still its own NATS identity (checked on
nats-server's own connection list), and a stage that cannot start must stop the process with its error
instead of leaving the others running without it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from typing import Any

import pytest

from tjpipe.credentials import SERVICE_IDENTITY

from .support import (
    Pipeline,
    assert_repeats_cost_nothing,
    converged,
    jobset_matches,
    no_dead_letters,
    quiet,
    results_of,
    services_ready,
    trainjob,
    until,
)

pytestmark = [pytest.mark.cluster, pytest.mark.nats, pytest.mark.timeout(150)]


def _connections(p: Pipeline) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"{p.nats.monitor_url}/connz?auth=true&limit=1024", timeout=5) as response:
        return list(json.load(response).get("connections") or [])


async def test_one_process_builds_what_three_do_each_stage_as_its_own_identity(pipeline: Pipeline) -> None:
    p = pipeline
    process = p.start("controller")
    nc = await p.connect()
    try:
        bus = nc.jetstream()
        await services_ready(bus)
        names = [f"one-{i}" for i in range(4)]
        for i, name in enumerate(names):
            p.create(trainjob(name, num_nodes=1 + i))
        await until(lambda: converged(p, names), timeout=60, what="the JobSets of the one-process controller")
        await quiet(p, bus)

        assert process.is_running()
        assert [name for name, proc in p.processes.items() if proc.is_running()] == ["controller"]
        jobsets, trainjobs = p.jobsets(), p.trainjobs()
        for name in names:
            assert jobset_matches(jobsets[name], trainjobs[name])
        results = await results_of(bus, p.namespace)
        assert {r.action for r in results} <= {"created", "configured", "unchanged", "skipped"}, results
        assert not [r for r in results if r.action == "failed"]
        await no_dead_letters(bus, p.namespace)
        # The fence and the ledger work as they do across processes: a replay writes nothing.
        _, repeat, _ = await assert_repeats_cost_nothing(p, bus)
        assert {k: v for k, v in repeat.summary().items() if k != "trainjobs/status"} == {}

        # One process, three NATS connections, each with its own stage's nkey: nats-server enforces each
        # stage's permissions exactly as for three processes.
        credentials = p.stack.credentials
        assert credentials is not None
        ours = {c["name"]: c for c in _connections(p) if c.get("name", "").startswith("tjpipe-")}
        # The controller runs the three pipeline stages; the status server is a process of its own.
        stages = ("watcher", "planner", "applier")
        for stage in stages:
            connection = ours[f"tjpipe-{stage}"]
            expected = credentials.public_key(SERVICE_IDENTITY[stage])
            assert connection.get("authorized_user") == expected, (stage, connection)
        assert len({ours[f"tjpipe-{stage}"]["cid"] for stage in stages}) == 3
    finally:
        await nc.close()

    process.popen.send_signal(signal.SIGTERM)
    assert process.popen.wait(timeout=30) == 0
    log = process.log_path.read_text()
    assert "Traceback" not in log, log[-3000:]


def _run_controller(p: Pipeline, **changes: str | None) -> subprocess.CompletedProcess[str]:
    env = p.stack.service_env("controller")
    for name, value in changes.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    argv = [sys.executable, "-m", "tjpipe", "controller", "--metrics-port", "0", "--namespace", p.namespace]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, cwd=os.getcwd())


def test_a_stage_that_cannot_start_stops_the_process_with_its_error(pipeline: Pipeline) -> None:
    p = pipeline
    missing = str(p.root / "no-such-key.pem")
    done = _run_controller(p, TJPIPE_PLANNER_SIGNING_KEY=missing)
    assert done.returncode == 2, done.stderr[-2000:]
    assert f"error: cannot read the signing key {missing}" in done.stderr, done.stderr[-2000:]
    assert "the planner stage failed; stopping the others" in done.stderr
    # An unset key names the controller's own flag and variable for that stage, not the single service's.
    done = _run_controller(p, TJPIPE_PLANNER_SIGNING_KEY=None)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "set --planner-signing-key / TJPIPE_PLANNER_SIGNING_KEY" in done.stderr, done.stderr[-2000:]
    # Nothing of the stages that had started stays connected.
    assert not [c for c in _connections(p) if c.get("name", "").startswith("tjpipe-")]
