"""Many replicas, many TrainJobs, and a crash of one of everything in the middle.

A 3-node JetStream cluster (every stream, consumer and KV bucket with 3 replicas), a private kube-apiserver
with the CRDs and ``torch-distributed``, 2 watchers, 3 planners and 3 appliers. 500 TrainJobs over four
namespaces are created through a bounded thread pool. When about a third of their JobSets exist, one replica
of each service is SIGKILLed, and so is one NATS node: it is made the leader of TJ_APPLY beforehand, while
TJ_EVENTS, TJ_DLQ, the lease bucket and the planners' consumers are led from the others, and the surviving
watcher and planners talk to the others only, so events keep reaching planners whose output stream has lost
its leader. That node first hangs for 10 s (SIGSTOP), the way a frozen or cut-off server does before the
rest of the cluster notices, and is then SIGKILLed. Then:

- every TrainJob converges: a JobSet it controls whose ``node`` job has parallelism and completions equal
  to ``numNodes``, and its runtime snapshot ConfigMap; no TrainJob is lost, and nothing is dead-lettered
  (every TrainJob here is valid, so a dead letter is a change given up on); 45 s without progress fails
  at once, with where the stuck TrainJobs sit (partition, owner, consumer backlog);
- no stale plan overwrites a newer one: 20 suspended TrainJobs have their runtime patches (a pod label and
  a nodeSelector) changed just before the crash and again just after it, and their JobSets must end at the
  second change, also once the pipeline has drained and redeliveries of the killed replicas' work are over;
- the survivors own all 16 partitions of each partitioned service, in fair shares, read from ``tj_leases``.

``test_planner_survives_lost_puback`` is the same hang-then-die of TJ_APPLY's leader, reduced to one planner
and events published by the test, so that what the big test can only catch now and then is shown every time
(it found the planner waiting forever on a PubAck lost with the leader; the wait is now bounded).

Why a private apiserver instead of the session one: 500 TrainJobs with their JobSets would stay behind in
the session's etcd, and every later watcher that lists all namespaces would have to plan them all again.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import nats.errors
import pytest
import urllib3
from kubernetes import client as kube_client
from kubernetes.client.exceptions import ApiException
from nats.js.api import DiscardPolicy, Placement, StorageType, StreamConfig
from nats.js.errors import KeyNotFoundError, NoKeysError

from contracts import streams, subjects
from contracts.messages import TrainJobObserved, decode_dead_letter, encode
from contracts.streams import APPLIED_BUCKET
from contracts.subjects import PARTITIONS
from contracts.trainer import RUNTIME_SNAPSHOT_SUFFIX, TrainingRuntime, TrainJob
from plumbing import bus, bus_history, bus_setup
from plumbing.partitions import LEASE_BUCKET, partition_consumer
from tjpipe.credentials import Credentials, generate_credentials, server_authorization
from tjpipe.keys.signing import KeyFolder
from tjpipe.local import crds
from tjpipe.local.kubeapi import LocalKube, new_api_client, start_kube
from tjpipe.local.natsd import LocalNatsCluster, start_nats_cluster
from tjpipe.local.procs import ManagedProcess, read_log_tail, spawn, wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.nats, pytest.mark.timeout(600)]

TRAINER = ("trainer.kubeflow.org", "v1alpha1")
JOBSET = ("jobset.x-k8s.io", "v1alpha2")
RUNTIME = "torch-distributed"
NAMESPACES = ("scale-a", "scale-b", "scale-c", "scale-d")
TOTAL = 500
PATCHED = 20
MAX_NODES = 8
PATCH_MANAGER = "tjpipe.test/scale"
REV_LABEL = "tjpipe.test/rev"
POOL_KEY = "tjpipe.test/pool"
FINAL_REV = 2

NATS_NODES = 3
WATCHERS, PLANNERS, APPLIERS = 2, 3, 3
CREATE_WORKERS = 8

READY_TIMEOUT = 60.0
MIDWAY_TIMEOUT = 120.0
CONVERGE_TIMEOUT = 180.0
TAKEOVER_TIMEOUT = 60.0
IDLE_TIMEOUT = 100.0
STALL_SECONDS = 45.0
FREEZE_SECONDS = 10.0
PROBE_TIMEOUT = 30.0


# ----------------------------------------------------------------------------------------------- the jobs


@dataclass(frozen=True)
class Job:
    namespace: str
    name: str
    num_nodes: int
    patched: bool


def planned_jobs() -> list[Job]:
    jobs = [
        Job(
            namespace=NAMESPACES[i % len(NAMESPACES)],
            name=f"tj-{i:03d}",
            num_nodes=1 + i % MAX_NODES,
            patched=i % (TOTAL // PATCHED) == 0,
        )
        for i in range(TOTAL)
    ]
    # The patched ones go first: they must exist before the crash, when their first change is made.
    return sorted(jobs, key=lambda job: not job.patched)


def runtime_patches(rev: int) -> list[dict[str, Any]]:
    pod_template = {"metadata": {"labels": {REV_LABEL: str(rev)}}, "spec": {"nodeSelector": {POOL_KEY: f"rev-{rev}"}}}
    node = {"name": "node", "template": {"spec": {"template": pod_template}}}
    return [{"manager": PATCH_MANAGER, "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [node]}}}}]


def trainjob(job: Job) -> dict[str, Any]:
    spec: dict[str, Any] = {"runtimeRef": {"name": RUNTIME}, "trainer": {"numNodes": job.num_nodes}}
    if job.patched:
        spec["suspend"] = True
        spec["runtimePatches"] = runtime_patches(0)
    return {
        "apiVersion": "/".join(TRAINER),
        "kind": "TrainJob",
        "metadata": {"name": job.name, "namespace": job.namespace},
        "spec": spec,
    }


_RETRYABLE = (urllib3.exceptions.HTTPError, ConnectionError, TimeoutError)


def _with_retries(call: Callable[[], object], *, what: str) -> None:
    for attempt in range(10):
        try:
            call()
            return
        except ApiException as exc:
            if exc.status == 409 and "already exists" in str(exc.body):
                return  # an earlier attempt got through before its response was lost
            if exc.status not in (409, 429, 500, 503, 504):
                raise
        except _RETRYABLE:
            pass
        time.sleep(0.1 * (attempt + 1))
    raise AssertionError(f"{what}: still failing after 10 attempts")


def create_trainjob(custom: kube_client.CustomObjectsApi, job: Job) -> None:
    _with_retries(
        lambda: custom.create_namespaced_custom_object(
            *TRAINER, job.namespace, "trainjobs", trainjob(job), _request_timeout=30
        ),
        what=f"create TrainJob {job.namespace}/{job.name}",
    )


def patch_runtime(custom: kube_client.CustomObjectsApi, job: Job, rev: int) -> None:
    _with_retries(
        lambda: custom.patch_namespaced_custom_object(
            *TRAINER,
            job.namespace,
            "trainjobs",
            job.name,
            {"spec": {"runtimePatches": runtime_patches(rev)}},
            _content_type="application/merge-patch+json",
            _request_timeout=30,
        ),
        what=f"patch TrainJob {job.namespace}/{job.name} to rev {rev}",
    )


# ------------------------------------------------------------------------------------------- reading kube


def _list(call: Callable[..., Any], *args: Any, **params: Any) -> dict[str, Any]:
    response = call(*args, _preload_content=False, _request_timeout=60, **params)
    body: dict[str, Any] = json.loads(response.data)
    return body


def count_jobsets(custom: kube_client.CustomObjectsApi) -> int:
    body = _list(custom.list_cluster_custom_object, *JOBSET, "jobsets", limit=1)
    return len(body["items"]) + int(body["metadata"].get("remainingItemCount") or 0)


def node_pod_template(jobset: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The ``node`` replicated job's Job spec and pod template."""
    for rjob in jobset["spec"]["replicatedJobs"]:
        if rjob["name"] == "node":
            job_spec = rjob["template"]["spec"]
            return job_spec, job_spec["template"]
    raise KeyError("no replicated job named node")


def convergence_problems(
    custom: kube_client.CustomObjectsApi, core: kube_client.CoreV1Api, jobs: list[Job]
) -> tuple[list[str], dict[tuple[str, str], str]]:
    """Everything that is not yet as it must end, one line per TrainJob; and the uid of every TrainJob."""
    trainjobs = {
        (o["metadata"]["namespace"], o["metadata"]["name"]): o["metadata"]["uid"]
        for o in _list(custom.list_cluster_custom_object, *TRAINER, "trainjobs")["items"]
    }
    jobsets = {
        (o["metadata"]["namespace"], o["metadata"]["name"]): o
        for o in _list(custom.list_cluster_custom_object, *JOBSET, "jobsets")["items"]
    }
    snapshots = {
        (o["metadata"]["namespace"], o["metadata"]["name"])
        for o in _list(core.list_config_map_for_all_namespaces)["items"]
    }
    problems = []
    for job in jobs:
        key = (job.namespace, job.name)
        where = f"{job.namespace}/{job.name}"
        uid = trainjobs.get(key)
        if uid is None:
            problems.append(f"{where}: TrainJob missing")
            continue
        if (job.namespace, job.name + RUNTIME_SNAPSHOT_SUFFIX) not in snapshots:
            problems.append(f"{where}: no runtime snapshot ConfigMap")
        jobset = jobsets.get(key)
        if jobset is None:
            problems.append(f"{where}: no JobSet")
            continue
        controllers = [r.get("uid") for r in jobset["metadata"].get("ownerReferences") or [] if r.get("controller")]
        if controllers != [uid]:
            problems.append(f"{where}: JobSet controlled by {controllers}, not {uid}")
        job_spec, pod = node_pod_template(jobset)
        if (job_spec.get("parallelism"), job_spec.get("completions")) != (job.num_nodes, job.num_nodes):
            problems.append(
                f"{where}: parallelism/completions {job_spec.get('parallelism')}/{job_spec.get('completions')}, "
                f"numNodes {job.num_nodes}"
            )
        if job.patched:
            rev = ((pod.get("metadata") or {}).get("labels") or {}).get(REV_LABEL)
            pool = ((pod.get("spec") or {}).get("nodeSelector") or {}).get(POOL_KEY)
            if (rev, pool) != (str(FINAL_REV), f"rev-{FINAL_REV}"):
                problems.append(f"{where}: JobSet at rev {rev} / pool {pool}, want rev {FINAL_REV}")
    return problems, trainjobs


# -------------------------------------------------------------------------------------------- reading NATS


ADMIN: list[Credentials] = []
"""The current test's NATS identities; the test's own reads and set-up connect as their admin."""


def start_cluster(tmp_path: Path, log_dir: Path) -> LocalNatsCluster:
    """A JetStream cluster with client authorization on (and authenticated routes), and its credentials."""
    creds = generate_credentials(tmp_path / "creds")
    ADMIN[:] = [creds]
    return start_nats_cluster(
        size=NATS_NODES, base_dir=tmp_path / "nats", log_dir=log_dir, authorization=server_authorization(creds)
    )


def identity_env(role: str) -> dict[str, str]:
    return {"NATS_CREDS": str(ADMIN[0].seed_file(role))}


def _run(coro_factory: Callable[[Any], Any], url: str, *, timeout: float = 30.0, raw: bool = False) -> Any:
    """Run one read against the bus on a fresh connection, retrying while the cluster elects new leaders."""

    async def main() -> Any:
        nc = await bus.connect(url, name="tjpipe-scale-test", creds=ADMIN[0].seed_file("admin"))
        try:
            return await coro_factory(nc if raw else nc.jetstream())
        finally:
            await nc.close()

    deadline = time.monotonic() + timeout
    while True:
        try:
            return asyncio.run(main())
        except (nats.errors.Error, TimeoutError, OSError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def read_leases(url: str) -> dict[str, str]:
    """Every live key of ``tj_leases`` and the replica it names."""

    async def read(js: Any) -> dict[str, str]:
        kv = await js.key_value(LEASE_BUCKET)
        try:
            keys = await kv.keys()
        except NoKeysError:
            return {}
        out = {}
        for key in keys:
            with contextlib.suppress(KeyNotFoundError):
                entry = await kv.get(key)
                if entry.value:
                    out[key] = entry.value.decode()
        return out

    leases: dict[str, str] = _run(read, url)
    return leases


def held_leases(url: str, *, timeout: float = 30.0) -> dict[str, str]:
    """The leases once a reading shows every planner and applier partition held.

    Just after the lease bucket's stream changes leader, listing its keys can come back empty or partial for a
    moment although every lease is held; one such reading is not evidence that nobody holds a partition.
    """
    deadline = time.monotonic() + timeout
    while True:
        leases = read_leases(url)
        if all(len(owners(leases, role)) == PARTITIONS for role in ("planner", "applier")):
            return leases
        if time.monotonic() > deadline:
            return leases
        time.sleep(0.2)


def owners(leases: dict[str, str], role: str) -> dict[int, str]:
    return {p: leases[f"{role}.p{p}"] for p in range(PARTITIONS) if f"{role}.p{p}" in leases}


def backlog(
    url: str, specs: tuple[streams.ConsumerSpec, ...] = (streams.PLANNER, streams.APPLIER)
) -> dict[str, tuple[int, int]]:
    """Each partition consumer with work left: messages not yet delivered, and delivered but not acked."""

    async def read(js: Any) -> dict[str, tuple[int, int]]:
        out = {}
        for spec in specs:
            for partition in range(PARTITIONS):
                durable = partition_consumer(spec, partition).durable
                info = await js.consumer_info(spec.stream, durable)
                if info.num_pending or info.num_ack_pending:
                    out[durable] = (info.num_pending or 0, info.num_ack_pending or 0)
        return out

    result: dict[str, tuple[int, int]] = _run(read, url)
    return result


def pick_victim(cluster: LocalNatsCluster) -> int:
    """The member to hang and kill: not the meta leader, whose loss would stall every consumer creation
    (and with it the lease rounds, whose expiry restarts the planners' loops and hides a hang by luck)."""
    meta = cluster.meta_leader()
    return next(i for i, name in enumerate(cluster.names) if name != meta)


def move_stream_leader_to(url: str, stream: str, node: str) -> None:
    """Make ``node`` the leader of ``stream`` (a step-down with ``node`` as the preferred placement)."""

    async def step(nc: Any) -> None:
        js = nc.jetstream()
        leader = ""
        for _ in range(40):
            info = await js.stream_info(stream)
            leader = str(info.cluster.leader if info.cluster else "")
            if leader == node:
                return
            with contextlib.suppress(nats.errors.Error, TimeoutError):
                request = json.dumps({"placement": {"preferred": node}}).encode()
                await nc.request(f"$JS.API.STREAM.LEADER.STEPDOWN.{stream}", request, timeout=5)
            await asyncio.sleep(0.3)
        raise AssertionError(f"{stream} is led by {leader}, not {node}")

    _run(step, url, raw=True, timeout=60)


def move_leaders_off(url: str, node: str, *, streams_: tuple[str, ...], consumers: tuple[tuple[str, str], ...]) -> None:
    """Make every listed stream and consumer led by ``node`` step down, until none is."""

    async def step(nc: Any) -> None:
        js = nc.jetstream()
        on_node: list[str] = []
        for _ in range(40):
            on_node = []
            for stream in streams_:
                info = await js.stream_info(stream)
                if info.cluster is None or info.cluster.leader in (None, "", node):
                    on_node.append(f"STREAM.LEADER.STEPDOWN.{stream}")
            for stream, durable in consumers:
                cinfo = await js.consumer_info(stream, durable)
                if cinfo.cluster is None or cinfo.cluster.leader in (None, "", node):
                    on_node.append(f"CONSUMER.LEADER.STEPDOWN.{stream}.{durable}")
            if not on_node:
                return
            for api in on_node:
                with contextlib.suppress(nats.errors.Error, TimeoutError):
                    await nc.request(f"$JS.API.{api}", b"", timeout=5)
            await asyncio.sleep(0.5)
        raise AssertionError(f"still led by {node}: {on_node}")

    _run(step, url, raw=True, timeout=60)


def dead_letters(url: str) -> collections.Counter[str]:
    """What the DLQ holds, as ``stage/reason: error (TrainJob)`` lines with their counts."""

    async def read(js: Any) -> collections.Counter[str]:
        out: collections.Counter[str] = collections.Counter()
        for stored in await bus_history.read_stream(js, streams.DLQ.name, f"{subjects.DLQ_PREFIX}.>"):
            letter = decode_dead_letter(stored.data)
            out[f"{letter.stage}/{letter.reason}: {letter.error[:80]}"] += 1
        return out

    letters: collections.Counter[str] = _run(read, url)
    return letters


def stream_facts(url: str) -> dict[str, tuple[int, int]]:
    """Replicas and message count of every stream and both KV buckets."""

    async def read(js: Any) -> dict[str, tuple[int, int]]:
        out = {}
        for name in (*(s.name for s in streams.ALL_STREAMS), f"KV_{LEASE_BUCKET}", f"KV_{APPLIED_BUCKET}"):
            info = await js.stream_info(name)
            out[name] = (info.config.num_replicas, info.state.messages)
        return out

    facts: dict[str, tuple[int, int]] = _run(read, url)
    return facts


def stall_report(
    jobs: list[Job], problems: list[str], leases: dict[str, str], work_left: dict[str, tuple[int, int]]
) -> str:
    """Where the TrainJobs that do not move sit: their partitions, who owns those, what the consumers hold."""
    stuck = [job for job in jobs if any(p.startswith(f"{job.namespace}/{job.name}:") for p in problems)]
    by_partition = collections.Counter(subjects.partition_of(job.namespace, job.name) for job in stuck)
    where = ", ".join(
        f"p{p}: {n} (planner {leases.get(f'planner.p{p}', '-')}, applier {leases.get(f'applier.p{p}', '-')})"
        for p, n in sorted(by_partition.items())
    )
    return (
        f"{len(stuck)} TrainJobs stuck, by partition {where}; consumers with work left (not delivered, unacked): "
        f"{work_left}; e.g.:\n" + "\n".join(problems[:10])
    )


# -------------------------------------------------------------------------------------------- processes


@dataclass
class Replica:
    role: str
    name: str
    process: ManagedProcess
    killed: bool = False


def start_replica(role: str, name: str, *, env: dict[str, str], log_dir: Path) -> Replica:
    argv = [sys.executable, "-m", "tjpipe", role, "--log-format", "json", "--metrics-port", "0", "--replica-id", name]
    return Replica(role=role, name=name, process=spawn(name=name, argv=argv, log_dir=log_dir, env=env))


def sigkill(process: ManagedProcess) -> None:
    if process.popen.poll() is None:  # once reaped, the pid may belong to a stranger: never signal it
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.popen.wait(timeout=10)


def rss_mib(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError):
        pass
    return 0.0


@dataclass
class MemoryPeaks:
    peaks: dict[str, float] = field(default_factory=dict)

    def sample(self, groups: dict[str, list[ManagedProcess]]) -> None:
        total = 0.0
        for group, processes in groups.items():
            used = sum(rss_mib(p.pid) for p in processes if p.is_running())
            total += used
            self.peaks[group] = max(self.peaks.get(group, 0.0), used)
        self.peaks["total"] = max(self.peaks.get("total", 0.0), total)

    def __str__(self) -> str:
        return ", ".join(f"{group} {mib:.0f} MiB" for group, mib in self.peaks.items())


def log_summary(replica: Replica) -> str:
    levels: collections.Counter[str] = collections.Counter()
    messages: collections.Counter[str] = collections.Counter()
    with contextlib.suppress(OSError), replica.process.log_path.open(errors="replace") as log_file:
        for line in log_file:
            try:
                record = json.loads(line)
            except ValueError:
                levels["non-json"] += 1
                continue
            levels[record.get("level", "?")] += 1
            if record.get("level") in ("warning", "error", "critical"):
                messages[str(record.get("msg", ""))[:90]] += 1
    top = "; ".join(f"{n}x {m}" for m, n in messages.most_common(3))
    return f"{replica.name}{' (killed)' if replica.killed else ''}: {dict(levels)}" + (f" — {top}" if top else "")


# ---------------------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def scale_kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalKube]:
    root = tmp_path_factory.mktemp("scale-kube")
    kube = start_kube(
        work_dir=root / "kube", log_dir=root / "logs", kubeconfig_path=root / "kubeconfig", progress=lambda _: None
    )
    try:
        with new_api_client(kube.kubeconfig) as api:
            crds.install_crds(api, crds.crd_manifests(progress=lambda _: None))
            crds.apply_objects(api, [crds.shipped_runtimes()[RUNTIME]], field_manager="tjpipe-scale-test")
            crds.apply_objects(
                api,
                [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}} for ns in NAMESPACES],
                field_manager="tjpipe-scale-test",
            )
        yield kube
    finally:
        kube.stop()


# -------------------------------------------------------------------------------------------------- test


def test_multi_replica_crash_converges(scale_kube: LocalKube, tmp_path: Path) -> None:
    started = time.monotonic()
    log_dir = tmp_path / "logs"
    jobs = planned_jobs()
    patched = [job for job in jobs if job.patched]
    memory = MemoryPeaks()
    replicas: list[Replica] = []
    pool = ThreadPoolExecutor(CREATE_WORKERS, thread_name_prefix="create")
    creator_api = new_api_client(scale_kube.kubeconfig)
    reader_api = new_api_client(scale_kube.kubeconfig)
    custom = kube_client.CustomObjectsApi(reader_api)
    core = kube_client.CoreV1Api(reader_api)
    cluster: LocalNatsCluster | None = None
    frozen: int | None = None

    def say(line: str) -> None:
        print(f"[scale {time.monotonic() - started:6.1f}s] {line}", flush=True)

    def groups() -> dict[str, list[ManagedProcess]]:
        out: dict[str, list[ManagedProcess]] = {
            "nats": [s.process for s in cluster.servers] if cluster else [],
            "kube": list(scale_kube.processes),
        }
        for role in ("watcher", "planner", "applier"):
            out[role + "s"] = [r.process for r in replicas if r.role == role]
        return out

    def check_alive() -> None:
        for replica in replicas:
            if not replica.killed and not replica.process.is_running():
                raise AssertionError(
                    f"{replica.name} exited with {replica.process.popen.returncode}:\n{replica.process.log_tail()}"
                )

    try:
        cluster = start_cluster(tmp_path, log_dir)
        live_url = cluster.url
        say(f"NATS cluster ready ({cluster.url}, meta leader {cluster.meta_leader()})")
        env = {
            "NATS_URL": cluster.url,
            "KUBECONFIG": str(scale_kube.kubeconfig.resolve()),
            "TJPIPE_STREAM_REPLICAS": str(NATS_NODES),
            "PYTHONUNBUFFERED": "1",
        }
        _run(lambda js: bus_setup.setup_bus(js, streams.configured_streams(env), replicas=NATS_NODES), cluster.url)
        # The watcher and planners that survive talk to the nodes that survive, so events keep being published
        # and planned while the node leading the planners' output stream hangs; the appliers and the replicas
        # to be killed get the whole cluster.
        victim = pick_victim(cluster)
        others_url = ",".join(s.url for i, s in enumerate(cluster.servers) if i != victim)
        keys = KeyFolder(tmp_path / "keys").ensure()
        for role, count in (("watcher", WATCHERS), ("planner", PLANNERS), ("applier", APPLIERS)):
            for i in range(count):
                survivor_upstream = role in ("watcher", "planner") and i > 0
                replica_env = {**env, "NATS_URL": others_url} if survivor_upstream else env
                replica_env = {**replica_env, **keys.service_env(role), **identity_env(role)}
                replicas.append(start_replica(role, f"{role}-{i}", env=replica_env, log_dir=log_dir))

        def spread() -> bool:
            check_alive()
            memory.sample(groups())
            with contextlib.suppress(Exception):
                leases = read_leases(live_url)
                return all(
                    len(owners(leases, role)) == PARTITIONS and len(set(owners(leases, role).values())) == count
                    for role, count in (("planner", PLANNERS), ("applier", APPLIERS))
                )
            return False

        wait_until(spread, timeout=READY_TIMEOUT, what="3 planners and 3 appliers sharing all 16 partitions")
        say(f"services up and sharing partitions; memory so far: {memory}")

        # ------------------------------------------------------------------------- create, crash midway
        creator = kube_client.CustomObjectsApi(creator_api)
        create_started = time.monotonic()
        creates: list[Future[None]] = [pool.submit(create_trainjob, creator, job) for job in jobs]
        for future in creates[:PATCHED]:
            future.result(timeout=60)

        midway = TOTAL // 3
        deadline = time.monotonic() + MIDWAY_TIMEOUT
        while (existing := count_jobsets(custom)) < midway:
            check_alive()
            memory.sample(groups())
            assert time.monotonic() < deadline, f"only {existing} JobSets after {MIDWAY_TIMEOUT:.0f}s"
            time.sleep(0.2)
        created_so_far = sum(f.done() for f in creates)
        say(f"{existing} JobSets exist, {created_so_far} TrainJobs created: changing {PATCHED} TrainJobs, then crash")

        # The NATS node to kill is made the leader of TJ_APPLY, the hand-off between planner and applier.
        # Events must keep flowing into the planners meanwhile, so TJ_EVENTS and the planners' consumers are
        # led from elsewhere; so are the leases, which must not expire and restart the planners' loops by
        # luck, and TJ_DLQ, so that any message given up on is recorded rather than retried by luck.
        move_stream_leader_to(cluster.url, streams.APPLY.name, cluster.names[victim])
        move_leaders_off(
            cluster.url,
            cluster.names[victim],
            streams_=(streams.EVENTS.name, streams.DLQ.name, f"KV_{LEASE_BUCKET}"),
            consumers=tuple(
                (streams.PLANNER.stream, partition_consumer(streams.PLANNER, p).durable) for p in range(PARTITIONS)
            ),
        )
        meta_leader = cluster.meta_leader()
        for job in patched:
            patch_runtime(custom, job, 1)
        leases_before = held_leases(live_url)
        killed = {role: f"{role}-0" for role in ("watcher", "planner", "applier")}
        live_url = ",".join(s.url for i, s in enumerate(cluster.servers) if i != victim)
        # The node hangs before it dies (SIGSTOP, then SIGKILL): messages routed to it meanwhile are neither
        # refused nor answered, which is what a frozen or partitioned server does before the others notice.
        crash = time.monotonic()
        os.killpg(cluster.servers[victim].process.pid, signal.SIGSTOP)
        frozen = victim
        for replica in replicas:
            if replica.name in killed.values():
                sigkill(replica.process)
                replica.killed = True
        held_before = {
            role: sorted(p for p, owner in owners(leases_before, role).items() if owner == killed[role])
            for role in ("planner", "applier")
        }
        say(
            f"froze NATS {cluster.names[victim]} (leader of {streams.APPLY.name}; meta leader was {meta_leader}) "
            f"and SIGKILLed {', '.join(killed.values())}; they held planner partitions {held_before['planner']} "
            f"and applier partitions {held_before['applier']}"
        )
        assert held_before["planner"] and held_before["applier"], f"the killed replicas held nothing: {leases_before}"
        for job in patched:
            patch_runtime(custom, job, FINAL_REV)
        say(f"changed the {PATCHED} suspended TrainJobs a second time")
        time.sleep(max(0.0, crash + FREEZE_SECONDS - time.monotonic()))
        cluster.kill(victim)
        frozen = None
        say(f"SIGKILLed NATS {cluster.names[victim]} after {time.monotonic() - crash:.1f}s frozen")

        for future in creates:
            future.result(timeout=max(1.0, CONVERGE_TIMEOUT - (time.monotonic() - crash)))
        created = time.monotonic()
        say(f"all {TOTAL} TrainJobs created in {created - create_started:.1f}s")

        survivors = {role: {r.name for r in replicas if r.role == role and not r.killed} for role in killed}

        def takeover_problems(leases: dict[str, str]) -> list[str]:
            out = []
            for role in ("planner", "applier"):
                held = owners(leases, role)
                shares = collections.Counter(held.values())
                if len(held) != PARTITIONS:
                    out.append(f"{role}: partitions {sorted(set(range(PARTITIONS)) - set(held))} have no owner")
                if set(shares) - survivors[role]:
                    out.append(f"{role}: held by {sorted(set(shares) - survivors[role])}, which were killed")
                if sorted(shares.values()) != [PARTITIONS // len(survivors[role])] * len(survivors[role]):
                    out.append(f"{role}: shares {dict(shares)}, not {PARTITIONS // len(survivors[role])} each")
                if f"{role}.member.{killed[role]}" in leases:
                    out.append(f"{role}: the membership of {killed[role]} is still there")
            return out

        # ------------------------------------------------------------------------------- convergence
        problems: list[str] = []
        last_report = 0.0
        taken_over: float | None = None
        last_change, last_problems = time.monotonic(), frozenset[str]()
        while True:
            check_alive()
            memory.sample(groups())
            if taken_over is None and not takeover_problems(read_leases(live_url)):
                taken_over = time.monotonic()
                say(f"the survivors own all partitions in fair shares, {taken_over - crash:.1f}s after the crash")
            problems, _ = convergence_problems(custom, core, jobs)
            if not problems:
                break
            # Every TrainJob here is valid: a dead letter is an event or a plan given up on, so a change lost.
            letters = dead_letters(live_url) if stream_facts(live_url)[streams.DLQ.name][1] else collections.Counter()
            assert not letters, (
                f"{sum(letters.values())} messages dead-lettered {time.monotonic() - crash:.0f}s after the crash "
                f"while {len(problems)} TrainJobs are not converged (e.g. {problems[:3]}): {dict(letters)}"
            )
            now = time.monotonic()
            if frozenset(problems) != last_problems:
                last_change, last_problems = now, frozenset(problems)
            elif now - last_change > STALL_SECONDS:
                raise AssertionError(
                    f"no progress for {STALL_SECONDS:.0f}s: "
                    + stall_report(jobs, problems, read_leases(live_url), backlog(live_url))
                )
            if now - crash > CONVERGE_TIMEOUT:
                raise AssertionError(
                    f"{len(problems)} TrainJobs not converged {CONVERGE_TIMEOUT:.0f}s after the crash, e.g.:\n"
                    + "\n".join(problems[:15])
                )
            if now - last_report > 10:
                say(f"{len(problems)} TrainJobs not converged yet, e.g. {problems[0]}")
                last_report = now
            time.sleep(1.0)
        converged = time.monotonic()
        say(
            f"all {TOTAL} TrainJobs converged {converged - create_started:.1f}s after the first create, "
            f"{converged - crash:.1f}s after the crash"
        )

        # ------------------------------------------------------------------------- partition takeover
        leases_after: dict[str, str] = {}
        while takeover_problems(leases_after := read_leases(live_url)):
            check_alive()
            if time.monotonic() - crash > TAKEOVER_TIMEOUT:
                raise AssertionError(
                    f"{TAKEOVER_TIMEOUT:.0f}s after the crash the partitions are not taken over: "
                    f"{takeover_problems(leases_after)}; leases: {leases_after}"
                )
            time.sleep(0.5)
        if taken_over is None:
            taken_over = time.monotonic()
        say(
            "partitions now: "
            + "; ".join(
                f"{role}: "
                + ", ".join(
                    f"{name} {sorted(p for p, o in owners(leases_after, role).items() if o == name)}"
                    for name in sorted(survivors[role])
                )
                for role in ("planner", "applier")
            )
        )

        # --------------------------------------------------- drained: nothing left that could overwrite
        last_backlog: dict[str, tuple[int, int]] = {}

        def drained() -> bool:
            nonlocal last_backlog
            check_alive()
            last_backlog = backlog(live_url)
            return not last_backlog

        with contextlib.suppress(TimeoutError):
            wait_until(drained, timeout=IDLE_TIMEOUT, what="every partition consumer drained")
        assert not last_backlog, f"not drained {IDLE_TIMEOUT:.0f}s after converging (pending, unacked): {last_backlog}"
        idle = time.monotonic()
        problems, trainjobs = convergence_problems(custom, core, jobs)
        assert not problems, "after the pipeline drained:\n" + "\n".join(problems[:15])
        assert len(trainjobs) == TOTAL
        say(f"pipeline drained {idle - crash:.1f}s after the crash")

        facts = stream_facts(live_url)
        say("streams (replicas, messages): " + ", ".join(f"{n} {r}/{m}" for n, (r, m) in facts.items()))
        assert {r for r, _ in facts.values()} == {NATS_NODES}, facts
        dlq_size = facts[streams.DLQ.name][1]
        check_alive()
        memory.sample(groups())
        say(f"peak RSS: {memory}")
        for replica in replicas:
            say(log_summary(replica))
        say(
            f"timings: created {created - create_started:.1f}s, converged {converged - create_started:.1f}s "
            f"after the first create ({converged - crash:.1f}s after the crash), partitions taken over "
            f"{taken_over - crash:.1f}s and drained {idle - crash:.1f}s after the crash; "
            f"whole test {time.monotonic() - started:.1f}s"
        )
        assert dlq_size == 0, f"{dlq_size} dead letters on {streams.DLQ.name}: {dict(dead_letters(live_url))}"
    except BaseException:
        for replica in replicas:
            print(f"--- {replica.name}{' (killed)' if replica.killed else ''} ---\n{replica.process.log_tail(15)}")
        if cluster is not None:
            for server in cluster.servers:
                print(f"--- {server.process.name} ---\n{read_log_tail(server.process.log_path, lines=10)}")
        raise
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
        for replica in reversed(replicas):
            replica.process.stop(timeout=10)
        if cluster is not None:
            if frozen is not None:
                cluster.kill(frozen)  # a stopped process would sit out SIGTERM's whole grace period
            cluster.stop()
        creator_api.close()  # type: ignore[no-untyped-call]
        reader_api.close()  # type: ignore[no-untyped-call]


# ---------------------------------------------------------------------------------- a PubAck lost in flight


def observed_event(namespace: str, name: str, *, version: int, runtime: dict[str, Any]) -> bytes:
    """A TrainJobObserved as the watcher would publish it, for a TrainJob that exists only on the bus."""
    job = {
        "apiVersion": "/".join(TRAINER),
        "kind": "TrainJob",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": f"uid-{namespace}-{name}",
            "resourceVersion": str(version),
        },
        "spec": {
            "runtimeRef": {"apiGroup": TRAINER[0], "kind": "ClusterTrainingRuntime", "name": RUNTIME},
            "trainer": {"numNodes": 2},
        },
    }
    event = TrainJobObserved(
        trainjob=msgspec.convert(job, TrainJob),
        runtime=msgspec.convert(runtime, TrainingRuntime),
        observed_at=time.time(),
        cause="TrainJob ADDED",
        trace_id=f"probe-{name}-{version}",
    )
    return encode(event)


def one_name_per_partition(namespace: str) -> dict[int, str]:
    names: dict[int, str] = {}
    k = 0
    while len(names) < PARTITIONS:
        names.setdefault(subjects.partition_of(namespace, f"probe-{k}"), f"probe-{k}")
        k += 1
    return names


def publish_events(url: str, namespace: str, names: dict[int, str], *, version: int, keys: KeyFolder) -> None:
    runtime = crds.shipped_runtimes()[RUNTIME]

    async def publish(js: Any) -> None:
        for name in names.values():
            payload = observed_event(namespace, name, version=version, runtime=runtime)
            subject = subjects.event_subject(namespace, name)
            headers = {bus.MSG_ID: f"uid-{namespace}-{name}/{version}", **keys.sign_headers(subject, payload)}
            await js.publish(subject, payload, headers=headers, timeout=5)

    _run(publish, url)


def test_planner_survives_lost_puback(tmp_path: Path) -> None:
    """One planner, on the two nodes that stay up, plans an event for every partition while the node leading
    TJ_APPLY hangs (SIGSTOP) and then dies; afterwards a newer event for every partition must be planned.

    The lease bucket is pinned off the hanging node (one replica), so that the planner's leases stay valid
    throughout: a lost lease would restart the partition's loop and hide a hang by luck.
    """
    log_dir = tmp_path / "logs"
    cluster = start_cluster(tmp_path, log_dir)
    planner: Replica | None = None
    frozen: int | None = None
    victim_index = pick_victim(cluster)
    victim = cluster.names[victim_index]
    others = ",".join(s.url for i, s in enumerate(cluster.servers) if i != victim_index)
    namespace = "probe"
    names = one_name_per_partition(namespace)
    keys = KeyFolder(tmp_path / "keys").ensure()
    try:
        env = {"TJPIPE_STREAM_REPLICAS": str(NATS_NODES)}

        async def setup(js: Any) -> None:
            keep_on = cluster.names[(victim_index + 1) % NATS_NODES]
            # The lease bucket as nats-py's create_key_value makes it, plus a placement (which it would drop).
            await js.add_stream(
                StreamConfig(
                    name=f"KV_{LEASE_BUCKET}",
                    subjects=[f"$KV.{LEASE_BUCKET}.>"],
                    allow_direct=True,
                    allow_rollup_hdrs=True,
                    allow_msg_ttl=True,
                    deny_delete=True,
                    discard=DiscardPolicy.NEW,
                    duplicate_window=6.0,
                    max_age=6.0,
                    max_consumers=-1,
                    max_msgs=-1,
                    max_msgs_per_subject=1,
                    num_replicas=1,
                    storage=StorageType.FILE,
                    placement=Placement(tags=[keep_on]),
                )
            )
            info = await js.stream_info(f"KV_{LEASE_BUCKET}")
            assert info.cluster is not None and info.cluster.leader == keep_on, info.cluster
            # Everything else as the admin set-up makes it (it keeps the placed bucket as it is).
            await bus_setup.setup_bus(js, streams.configured_streams(env), replicas=NATS_NODES)

        _run(setup, others)
        move_stream_leader_to(others, streams.APPLY.name, victim)
        planner_env = {**env, "NATS_URL": others, **keys.service_env("planner"), **identity_env("planner")}
        planner = start_replica("planner", "planner-0", env=planner_env, log_dir=log_dir)
        wait_until(
            lambda: len(owners(read_leases(others), "planner")) == PARTITIONS,
            timeout=READY_TIMEOUT,
            what="the planner owning all 16 partitions",
            process=planner.process,
        )
        planner_consumers = tuple(
            (streams.PLANNER.stream, partition_consumer(streams.PLANNER, p).durable) for p in range(PARTITIONS)
        )
        move_leaders_off(others, victim, streams_=(streams.EVENTS.name,), consumers=planner_consumers)

        os.killpg(cluster.servers[victim_index].process.pid, signal.SIGSTOP)
        frozen = victim_index
        publish_events(others, namespace, names, version=1, keys=keys)
        time.sleep(FREEZE_SECONDS)
        cluster.kill(victim_index)
        frozen = None
        publish_events(others, namespace, names, version=2, keys=keys)

        left: dict[str, tuple[int, int]] = {}

        def planned_everything() -> bool:
            nonlocal left
            assert planner is not None and planner.process.is_running(), "the planner exited"
            left = backlog(others, (streams.PLANNER,))
            return not left

        with contextlib.suppress(TimeoutError):
            wait_until(planned_everything, timeout=PROBE_TIMEOUT, what="every event planned")
        leases = owners(read_leases(others), "planner")
        assert not left, (
            f"{PROBE_TIMEOUT:.0f} s after {victim} died, partitions still hold unplanned events "
            f"(not delivered, unacked): {left}; their leases are held by {sorted(set(leases.values()))}"
        )
    finally:
        if planner is not None:
            planner.process.stop(timeout=10)
        if frozen is not None:
            cluster.kill(frozen)
        cluster.stop()
