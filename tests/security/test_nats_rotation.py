"""NATS seed rotation on a real nats-server: every identity's connection moves to its new key with no restart.

First on bare connections: the steps are the ones ``tjpipe nats-credentials rotate`` runs
(``tjpipe.credentials.rotation_step``), with the server reloaded by SIGHUP as an operator would. Each
connection asks the server something through its reply inbox before, during and after, so a refused inbox
(or a refused key) would show as a timeout. Two rotations in a row: a connection keeps its inbox for its
whole life, so the second proves the inbox is the identity's and not the first key's.

Then the whole pipeline: the three services as processes against a real nats-server and kube-apiserver,
TrainJobs created before, during and after a rotation of every identity run as ``tjpipe`` commands. At the
end every TrainJob has the JobSet Trainer builds, its events and apply messages are in the history, there is
no dead letter and no write once idle; every connection logs in with its new key, the services switched by
themselves (their logs say so) and are the same processes; the old seeds are refused, and no seed, old or
new, is in any log.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from faults.support import (
    Pipeline,
    apply_filter,
    converged,
    events_filter,
    missing,
    no_dead_letters,
    quiet,
    report,
    services_ready,
    subject_count,
    trainjob,
    until,
)
from nats.aio.client import Client as NATS

from contracts import streams
from plumbing import bus
from tjpipe.credentials import IDENTITIES, Credentials, generate_credentials, rotation_step, server_authorization
from tjpipe.local.natsd import LocalNats, start_nats
from tjpipe.nats_server import connections_by_key
from tjpipe.private_files import write_private_file

pytestmark = pytest.mark.nats

STREAM_OF = {
    "admin": streams.EVENTS.name,
    "watcher": streams.EVENTS.name,
    "planner": streams.EVENTS.name,
    "applier": streams.APPLY.name,
    "reader": streams.RESULTS.name,
    "dlq-operator": streams.DLQ.name,
    "status-server": streams.PROGRESS.name,
    "history-keeper": streams.EVENTS_HISTORY.name,
}
"""A stream each identity may ask about: an API request answered in its inbox."""


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[LocalNats, Credentials]]:
    from tjpipe.local.stack import setup_bus_as_admin

    creds = generate_credentials(tmp_path / "creds")
    local = start_nats(
        store_dir=tmp_path / "store", log_dir=tmp_path / "logs", authorization=server_authorization(creds)
    )
    try:
        setup_bus_as_admin(local.url, creds)
        yield local, creds
    finally:
        local.stop()


async def answered(connections: dict[str, NATS]) -> None:
    for identity, nc in connections.items():
        if identity == "log-keeper":  # it may ask nothing: a chunk it adds to the logs bucket is acknowledged
            ack = await nc.jetstream(timeout=5).publish(f"{streams.LOGS.chunks}.rotation", b"x")
            assert ack.stream == streams.LOGS.stream, identity
            continue
        info = await nc.jetstream(timeout=5).stream_info(STREAM_OF[identity])
        assert info.config.name == STREAM_OF[identity], identity


async def until_keys(local: LocalNats, wanted: dict[str, str], timeout: float = 20) -> None:
    """Until the connection named ``rot-<identity>`` logs in with ``wanted[identity]``, for each identity."""
    deadline = time.monotonic() + timeout
    while True:
        by_key = connections_by_key(local.monitor_url)
        current = {name.removeprefix("rot-"): key for key, names in by_key.items() for name in names}
        if all(current.get(identity) == key for identity, key in wanted.items()):
            return
        assert time.monotonic() < deadline, f"connections still on their old keys: {current} != {wanted}"
        await asyncio.sleep(0.1)


async def test_every_identity_rotates_twice_on_live_connections(
    server: tuple[LocalNats, Credentials], tmp_path: Path
) -> None:
    local, creds = server
    config, pid = local.store_dir.parent / "nats.conf", str(local.process.pid)
    connections = {
        identity: await bus.connect(
            local.url,
            name=f"rot-{identity}",
            creds=creds.seed_file(identity),
            identity=identity,
            credentials_check_seconds=0.2,
        )
        for identity in IDENTITIES
    }
    said: list[str] = []
    try:
        await answered(connections)
        for round_ in (1, 2):
            old = creds.public_keys()
            old_seeds = {}
            for identity in IDENTITIES:
                old_seeds[identity] = tmp_path / f"old-{round_}-{identity}.nk"
                write_private_file(old_seeds[identity], creds.seed_file(identity).read_bytes())

            rotation_step("begin", creds, authorization=config, reload=pid, monitor=local.monitor_url, say=said.append)
            assert all(creds.rotation_phase(identity) == "begun" for identity in IDENTITIES)
            assert all(len(creds.trusted_keys(identity)) == 2 for identity in IDENTITIES)
            await answered(connections)  # the old keys still work, and nobody was disconnected
            assert all(nc.stats["reconnects"] == round_ - 1 for nc in connections.values())

            rotation_step("swap", creds, authorization=config, say=said.append)
            new = creds.public_keys()
            assert all(new[identity] != old[identity] for identity in IDENTITIES)
            assert all((creds.seed_file(identity).stat().st_mode & 0o777) == 0o600 for identity in IDENTITIES)
            await until_keys(local, new)  # each connection saw its file change and reconnected by itself
            await answered(connections)

            rotation_step(
                "finish", creds, authorization=config, reload=pid, monitor=local.monitor_url, wait=5, say=said.append
            )
            assert all(creds.rotation_phase(identity) == "" for identity in IDENTITIES)
            await answered(connections)
            assert all(nc.stats["reconnects"] == round_ for nc in connections.values())
            for identity in IDENTITIES:
                with pytest.raises(bus.NotAuthorized):
                    await bus.connect(local.url, name=f"old-{identity}", creds=old_seeds[identity])
        # What the steps said names keys and files, never a seed.
        text = "\n".join(said)
        assert not re.search(r"\bSU[A-Z2-7]{50,}", text), text
        seeds = [path.read_text().strip() for path in [*tmp_path.glob("old-*.nk"), *creds.root.glob("*.nk")]]
        assert seeds and not any(seed in text for seed in seeds)
    finally:
        for nc in connections.values():
            await nc.close()


async def test_finish_refuses_while_a_connection_still_uses_an_old_key(
    server: tuple[LocalNats, Credentials], tmp_path: Path
) -> None:
    """A process that does not follow its seed file (here: one that copied the old seed) holds up the finish,
    with its identity and connection name in the refusal, and nothing is dropped."""
    local, creds = server
    config, pid = local.store_dir.parent / "nats.conf", str(local.process.pid)
    copy = tmp_path / "copied-planner.nk"
    write_private_file(copy, creds.seed_file("planner").read_bytes())
    stale = await bus.connect(local.url, name="stale-planner", creds=copy, identity="planner")
    try:
        rotation_step("begin", creds, authorization=config, reload=pid, monitor=local.monitor_url, say=lambda _: None)
        rotation_step("swap", creds, authorization=config, say=lambda _: None)
        with pytest.raises(ValueError, match=r"planner \(1: stale-planner\)"):
            rotation_step(
                "finish", creds, authorization=config, reload=pid, monitor=local.monitor_url, wait=1, say=lambda _: None
            )
        assert creds.rotation_phase("planner") == "swapped"
        await answered({"planner": stale})
    finally:
        await stale.close()


# ------------------------------------------------------------------------------------- the whole pipeline

SERVICES = ("watcher", "planner", "applier")


def rotate(p: Pipeline, step: str, *extra: str) -> str:
    """``tjpipe nats-credentials rotate STEP`` on the pipeline's folder, as an operator runs it."""
    argv = [
        sys.executable,
        "-m",
        "tjpipe",
        "nats-credentials",
        "rotate",
        step,
        "--dir",
        str(p.stack.paths.creds),
        "--authorization",
        str(p.root / "nats.conf"),
        "--reload",
        str(p.nats.process.pid),
        "--monitor",
        p.nats.monitor_url,
        *extra,
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=os.environ.copy())
    assert done.returncode == 0, (step, done.stdout, done.stderr)
    return done.stdout + done.stderr


@pytest.mark.cluster
@pytest.mark.timeout(240)
async def test_every_seed_rotates_while_trainjobs_flow(pipeline: Pipeline) -> None:
    p = pipeline
    creds = p.stack.credentials
    assert creds is not None
    p.start_all()
    pids = {name: p.processes[name].pid for name in SERVICES}
    held = {
        identity: await bus.connect(
            p.nats.url, name=f"held-{identity}", identity=identity, **p.stack.nats_connect_options(identity)
        )
        for identity in ("admin", "reader", "dlq-operator")
    }
    js = held["admin"].jetstream()
    await services_ready(js)
    old_keys = creds.public_keys()
    old_seeds = p.root / "old-seeds"
    old_seeds.mkdir(mode=0o700)
    for identity in IDENTITIES:
        write_private_file(old_seeds / f"{identity}.nk", creds.seed_file(identity).read_bytes())

    names: list[str] = []
    errors: list[BaseException] = []
    rotated = threading.Event()

    def create_throughout() -> None:
        """TrainJobs every 0.3 s from before ``begin`` until 8 more after ``finish``."""
        try:
            after = 0
            while after < 8:
                name = f"r-{len(names):03d}"
                p.create(trainjob(name, num_nodes=1 + len(names) % 3))
                names.append(name)
                after += rotated.is_set()
                time.sleep(0.3)
        except BaseException as exc:
            errors.append(exc)

    creator = threading.Thread(target=create_throughout, name="create-trainjobs")
    creator.start()
    try:
        await asyncio.sleep(1.5)
        began = time.monotonic()
        said = await asyncio.to_thread(rotate, p, "begin")
        before_swap = len(names)
        said += await asyncio.to_thread(rotate, p, "swap")
        new_keys = creds.public_keys()
        # finish waits (--monitor) until no connection logs in with an old key, then drops them.
        said += await asyncio.to_thread(rotate, p, "finish", "--wait", "60")
        rotation_seconds = time.monotonic() - began
        during = len(names) - before_swap
        # The held connections were reading all along; they still are.
        for identity, stream in (("reader", streams.RESULTS.name), ("dlq-operator", streams.DLQ.name)):
            assert (await held[identity].jetstream().stream_info(stream)).config.name == stream
    finally:
        rotated.set()
        await asyncio.to_thread(creator.join, 60)
    assert not errors, errors

    try:
        await until(lambda: converged(p, names), timeout=120, what=f"every JobSet: {missing(p, names)}")
        await quiet(p, js, timeout=60)
        for name in names:
            assert await subject_count(js, streams.EVENTS.name, events_filter(p.namespace, name)) >= 1, name
            assert await subject_count(js, streams.APPLY.name, apply_filter(p.namespace, name)) >= 1, name
        await no_dead_letters(js, p.namespace)

        # 2: every connection on its new key, the same service processes, which switched by themselves.
        by_key = connections_by_key(p.nats.monitor_url)
        assert not set(by_key) & set(old_keys.values()), by_key
        for name in SERVICES:
            assert p.processes[name].is_running() and p.processes[name].pid == pids[name], name
            assert new_keys[name] in by_key, (name, by_key)
            assert "now hold key" in p.log_text(name), f"{name} did not follow its seed file"
        assert all(nc.is_connected for nc in held.values())

        # 3: the old seeds are refused; no seed anywhere in a log or in what the commands said.
        for identity in IDENTITIES:
            with pytest.raises(bus.NotAuthorized):
                await bus.connect(p.nats.url, name=f"old-{identity}", creds=old_seeds / f"{identity}.nk")
        seeds = [f.read_text().strip() for f in [*old_seeds.glob("*.nk"), *creds.root.glob("*.nk")]]
        logs = [path.read_text(errors="replace") for path in Path(p.logs).glob("*.log")]
        assert logs and not any(seed in text for seed in seeds for text in [*logs, said])
        report(
            "nats-rotation",
            trainjobs=len(names),
            created_between_swap_and_finish=during,
            rotation_seconds=round(rotation_seconds, 1),
            reconnects={identity: nc.stats["reconnects"] for identity, nc in held.items()},
        )
    finally:
        for nc in held.values():
            await nc.close()
