"""Helpers for the fault-injection tests: private servers, the apiserver's own write counters, bus reads.

Every fault test owns what it breaks. A private kube-apiserver + etcd serves one test module (or the whole
package when nobody restarts it); every test gets a fresh nats-server in its own store directory and its
own three service processes, with the watcher limited to the test's namespace so that nothing another
test left behind can write while we count.

Writes are counted from ``apiserver_request_total`` on the apiserver's ``/metrics``: that counter is
incremented by the server for every request it answers, so it sees writes that reached the server even
when the client that sent them was killed before reading the answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import secrets
import signal
import ssl
import time
import urllib.request
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
from kubernetes import client as kube_client
from kubernetes import dynamic
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from contracts import streams, subjects
from contracts.messages import AppliedRecord, DeadLetter, decode_dead_letter
from plumbing.bus_history import SOURCE_HEADER
from tjpipe.credentials import Credentials, generate_credentials, server_authorization
from tjpipe.local.kubeapi import LocalKube, new_api_client
from tjpipe.local.natsd import LocalNats, LocalNatsCluster, start_nats, start_nats_cluster
from tjpipe.local.procs import ManagedProcess, free_port, spawn, wait_until
from tjpipe.local.stack import Stack, StatePaths

TRAINER = "trainer.kubeflow.org/v1alpha1"
JOBSET = "jobset.x-k8s.io/v1alpha2"
WRITE_VERBS = frozenset({"APPLY", "PATCH", "POST", "PUT", "DELETE", "DELETECOLLECTION"})
REVIEWS = frozenset(
    {
        "selfsubjectaccessreviews",
        "selfsubjectrulesreviews",
        "selfsubjectreviews",
        "subjectaccessreviews",
        "localsubjectaccessreviews",
        "tokenreviews",
    }
)
"""Questions put to the API server as a POST that store nothing (the applier asks once at start whether it
may watch TrainJobs): not writes."""
WATCHED = (
    ("jobsets", ""),
    ("configmaps", ""),
    ("secrets", ""),
    ("trainjobs", "status"),
    ("trainjobs", ""),
    ("events", ""),
)
"""(resource, subresource) pairs whose write counts the tests report."""


# --------------------------------------------------------------------------------------------- waiting


async def until(check: Callable[[], Any], *, timeout: float, what: str, interval: float = 0.25) -> Any:
    """Poll ``check`` (sync) until it returns something truthy; fail with the last exception otherwise."""
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while True:
        try:
            value = check()
            if value:
                return value
        except Exception as exc:  # not there yet
            last = exc
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}" + (f": {last!r}" if last else ""))
        await asyncio.sleep(interval)


async def until_async(check: Callable[[], Awaitable[Any]], *, timeout: float, what: str, interval: float = 0.25) -> Any:
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while True:
        try:
            value = await check()
            if value:
                return value
        except Exception as exc:
            last = exc
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}" + (f": {last!r}" if last else ""))
        await asyncio.sleep(interval)


# --------------------------------------------------------------------------------------------- metrics


_SAMPLE = re.compile(r"^apiserver_request_total\{(?P<labels>[^}]*)\}\s+(?P<value>\S+)$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True)
class WriteCounts:
    """``apiserver_request_total`` write requests, by (resource, subresource, verb)."""

    by_key: dict[tuple[str, str, str], float]

    def writes(self, resource: str, subresource: str = "", verbs: Iterable[str] = WRITE_VERBS) -> int:
        wanted = set(verbs)
        return int(
            sum(
                v
                for (res, sub, verb), v in self.by_key.items()
                if res == resource and sub == subresource and verb in wanted
            )
        )

    def __sub__(self, other: WriteCounts) -> WriteCounts:
        keys = set(self.by_key) | set(other.by_key)
        return WriteCounts({k: self.by_key.get(k, 0.0) - other.by_key.get(k, 0.0) for k in keys})

    def __add__(self, other: WriteCounts) -> WriteCounts:
        keys = set(self.by_key) | set(other.by_key)
        return WriteCounts({k: self.by_key.get(k, 0.0) + other.by_key.get(k, 0.0) for k in keys})

    def all_writes(self) -> dict[tuple[str, str, str], int]:
        """Every write, on any resource, but the API server's own identity Lease (it renews it every 10 s;
        the pipeline keeps its leases on NATS and never writes a Lease)."""
        return {k: int(v) for k, v in self.by_key.items() if v and k[0] != "leases"}

    def summary(self) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for (res, sub, verb), value in sorted(self.by_key.items()):
            if verb in WRITE_VERBS and value and (res, sub) in WATCHED:
                out.setdefault(res + (f"/{sub}" if sub else ""), {})[verb] = int(value)
        return out


def read_write_counts(kube: LocalKube, *, dry_runs: bool = True) -> WriteCounts:
    """Write requests the apiserver answered so far (any status code), from its own ``/metrics``; with
    ``dry_runs=False`` the dry runs are left out (a controller's start-up probe is one)."""
    tls = ssl.create_default_context(cafile=str(kube.ca_file))
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=tls))
    request = urllib.request.Request(f"{kube.server}/metrics", headers={"Authorization": f"Bearer {kube.token}"})
    with opener.open(request, timeout=10) as response:
        text = response.read().decode()
    counts: dict[tuple[str, str, str], float] = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match is None:
            continue
        labels = dict(_LABEL.findall(match["labels"]))
        if labels.get("verb") not in WRITE_VERBS or (labels.get("dry_run") and not dry_runs):
            continue
        if labels.get("resource", "") in REVIEWS:
            continue
        key = (labels.get("resource", ""), labels.get("subresource", ""), labels["verb"])
        counts[key] = counts.get(key, 0.0) + float(match["value"])
    return WriteCounts(counts)


def total_writes(counts: WriteCounts) -> int:
    return sum(counts.writes(res, sub) for res, sub in WATCHED if res != "events")


def jobset_admission_policy(
    name: str, namespace: str, *, expression: str, message: str, operations: Iterable[str] = ("CREATE", "UPDATE")
) -> list[dict[str, Any]]:
    """A ValidatingAdmissionPolicy and its binding that refuse a JobSet in ``namespace`` unless the CEL
    ``expression`` holds: a stand-in for an admission webhook refusing a component (the API server's 422)."""
    admission = "admissionregistration.k8s.io/v1"
    rule = {
        "apiGroups": ["jobset.x-k8s.io"],
        "apiVersions": ["*"],
        "operations": list(operations),
        "resources": ["jobsets"],
    }
    return [
        {
            "apiVersion": admission,
            "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": name},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {"resourceRules": [rule]},
                "validations": [{"expression": expression, "message": message, "reason": "Invalid"}],
            },
        },
        {
            "apiVersion": admission,
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": name},
            "spec": {
                "policyName": name,
                "validationActions": ["Deny"],
                "matchResources": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}},
            },
        },
    ]


# --------------------------------------------------------------------------------------- service metrics


def metric(port: int, name: str) -> dict[str, float]:
    """Samples of one metric from a service's /metrics, by their label text (``{reason="x",stage="y"}``)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith((name + "{", name + " ")):  # an unlabelled sample's key is ""
            labels, _, value = line.rpartition(" ")
            out[labels[len(name) :]] = float(value)
    return out


def start_with_metrics(p: Pipeline, **extra: list[str]) -> dict[str, int]:
    """Start the three services, each serving /metrics on a free port (returned by service), with ``extra``
    arguments by service."""
    ports = {}
    for service in ("watcher", "planner", "applier"):
        ports[service] = free_port()
        p.start(service, extra=["--metrics-port", str(ports[service]), *extra.get(service, [])])
    return ports


# ------------------------------------------------------------------------------------------ apiserver


def restart_apiserver(
    kube: LocalKube, *, log_dir: Path, downtime: float, name: str = "kube-apiserver-2"
) -> ManagedProcess:
    """SIGKILL the kube-apiserver group, keep it down ``downtime`` seconds, start it again on the same port.

    The new process gets the old one's argv: the same etcd, port, serving certificate, token file and
    service-account keys, so every client's kubeconfig stays valid and only the connection breaks.
    """
    old = kube.processes[-1]
    argv = [str(a) for a in old.popen.args]
    with contextlib.suppress(ProcessLookupError):
        os.killpg(old.pid, signal.SIGKILL)
    old.popen.wait(timeout=10)
    time.sleep(downtime)
    return start_apiserver_like(kube, argv=argv, log_dir=log_dir, name=name)


def start_apiserver_like(kube: LocalKube, *, argv: list[str], log_dir: Path, name: str) -> ManagedProcess:
    new = spawn(name=name, argv=argv, log_dir=log_dir)
    tls = ssl.create_default_context(cafile=str(kube.ca_file))
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=tls))

    def ready() -> bool:
        request = urllib.request.Request(f"{kube.server}/readyz", headers={"Authorization": f"Bearer {kube.token}"})
        try:
            with opener.open(request, timeout=2) as response:
                return bool(response.status == 200)
        except Exception:
            return False

    wait_until(ready, timeout=90, what=f"{name} /readyz on {kube.server}", process=new)
    return new


def kill_group(process: ManagedProcess, sig: signal.Signals = signal.SIGKILL) -> None:
    """Signal a service's whole process group (it is its group leader) and reap it on SIGKILL."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, sig)
    if sig == signal.SIGKILL:
        process.popen.wait(timeout=10)


# ------------------------------------------------------------------------------------------- pipeline


@dataclass
class Pipeline:
    """One test's bus and services, on a private apiserver shared by the module."""

    kube: LocalKube
    root: Path
    namespace: str
    nats: LocalNats | LocalNatsCluster
    stack: Stack
    dyn: dynamic.DynamicClient
    api: kube_client.ApiClient
    processes: dict[str, ManagedProcess] = field(default_factory=dict)

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    def start(self, service: str, *, name: str | None = None, extra: Iterable[str] = ()) -> ManagedProcess:
        # No health/metrics listener: the services would bind it on 0.0.0.0, and these tests stay on loopback.
        args = ["--metrics-port", "0", *extra]
        if service in ("watcher", "controller"):
            args += ["--namespace", self.namespace]
        process = self.stack.start_service(service, name=name or service, extra=args)
        self.processes[name or service] = process
        return process

    def start_all(self) -> None:
        for service in ("watcher", "planner", "applier"):
            self.start(service)

    def kill(self, name: str) -> None:
        kill_group(self.processes[name])

    def restart_nats(self, *, downtime: float) -> None:
        """Stop nats-server (SIGTERM), wait, and start it again on the same port with the same store."""
        assert isinstance(self.nats, LocalNats), "restart_nats is for one server"
        port = self.nats.port
        self.nats.stop()
        time.sleep(downtime)
        self.nats = start_nats(
            store_dir=self.nats.store_dir,
            log_dir=self.logs,
            name="nats-2",
            port=port,
            authorization=self.nats.authorization,
        )

    async def connect(self, identity: str = "admin") -> NATS:
        """A connection to the test's nats-server as ``identity``: admin (may do anything) unless told."""
        return await self.stack.connect(identity, name=f"fault-test-{identity}")

    def writes(self) -> WriteCounts:
        return read_write_counts(self.kube)

    def sign_headers(self, subject: str, payload: bytes, *, stage: str | None = None) -> dict[str, str]:
        """The signature a genuine message on ``subject`` carries (watcher key for events, planner key for
        apply messages); ``stage`` signs with another stage's key on purpose."""
        return self.stack.sign_headers(subject, payload, stage=stage)

    def log_tails(self, lines: int = 40) -> str:
        parts = []
        for name, process in self.processes.items():
            parts.append(f"--- {name} (pid {process.pid}) ---\n{process.log_tail(lines)}")
        return "\n".join(parts)

    def log_text(self, name: str) -> str:
        return self.processes[name].log_path.read_text(errors="replace")

    # ---------------------------------------------------------------------------------- kube reads

    def resource(self, api_version: str, kind: str) -> Any:
        return self.dyn.resources.get(api_version=api_version, kind=kind)

    def get(self, api_version: str, kind: str, name: str) -> dict[str, Any]:
        obj: dict[str, Any] = self.resource(api_version, kind).get(namespace=self.namespace, name=name).to_dict()
        return obj

    def get_or_none(self, api_version: str, kind: str, name: str) -> dict[str, Any] | None:
        try:
            return self.get(api_version, kind, name)
        except dynamic.exceptions.NotFoundError:
            return None

    def list(self, api_version: str, kind: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.resource(api_version, kind).get(namespace=self.namespace).to_dict()["items"]
        return items

    def jobsets(self) -> dict[str, dict[str, Any]]:
        return {js["metadata"]["name"]: js for js in self.list(JOBSET, "JobSet")}

    def trainjobs(self) -> dict[str, dict[str, Any]]:
        return {tj["metadata"]["name"]: tj for tj in self.list(TRAINER, "TrainJob")}

    def create(self, body: dict[str, Any]) -> dict[str, Any]:
        body = json.loads(json.dumps(body))
        res = self.resource(body["apiVersion"], body["kind"])
        namespaced = bool(res.namespaced)
        if namespaced:
            body["metadata"].setdefault("namespace", self.namespace)
        created: dict[str, Any] = (
            res.create(body=body, namespace=self.namespace) if namespaced else res.create(body=body)
        ).to_dict()
        return created

    def merge_patch(self, api_version: str, kind: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        patched: dict[str, Any] = (
            self.resource(api_version, kind)
            .patch(namespace=self.namespace, name=name, body=body, content_type="application/merge-patch+json")
            .to_dict()
        )
        return patched

    def events(self) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.resource("v1", "Event").get(namespace=self.namespace).to_dict()["items"]
        return items


def new_namespace(api: kube_client.ApiClient, prefix: str = "f") -> str:
    name = f"{prefix}-{secrets.token_hex(4)}"
    kube_client.CoreV1Api(api).create_namespace(kube_client.V1Namespace(metadata=kube_client.V1ObjectMeta(name=name)))
    return name


def open_pipeline(
    kube: LocalKube,
    root: Path,
    *,
    runtimes: Iterable[str] = ("torch-distributed",),
    own_identities: bool = False,
    nats_servers: int = 1,
    bus: tuple[LocalNats, Credentials] | None = None,
    namespace: str | None = None,
) -> Pipeline:
    """NATS and a Stack on ``kube``; with ``own_identities`` the services run as the pipeline's ServiceAccounts.

    ``nats_servers`` above 1 makes a JetStream cluster of that many on loopback, every stream and bucket with
    as many replicas (``TJPIPE_STREAM_REPLICAS``), as ``deploy/`` runs it. ``bus`` is a server started
    elsewhere and the identities it trusts (a fleet member's, ``tjpipe.local.fleet``), used instead of one of
    the pipeline's own. ``namespace`` names the namespace to create and watch (else a fresh random one).
    """
    root.mkdir(parents=True, exist_ok=True)
    nats: LocalNats | LocalNatsCluster
    if bus is not None:
        nats, credentials = bus
    elif nats_servers > 1:
        credentials = generate_credentials(root / "creds")
        nats = start_nats_cluster(
            size=nats_servers,
            base_dir=root / "nats",
            log_dir=root / "logs",
            authorization=server_authorization(credentials),
        )
    else:
        credentials = generate_credentials(root / "creds")
        nats = start_nats(
            store_dir=root / "nats-store",
            log_dir=root / "logs",
            name="nats",
            authorization=server_authorization(credentials),
        )
    stack = Stack(paths=StatePaths(root), progress=lambda _: None)
    replicas = os.environ.get("TJPIPE_STREAM_REPLICAS")
    os.environ["TJPIPE_STREAM_REPLICAS"] = str(nats_servers)  # read by the bus set-up
    try:
        stack.start_infrastructure(
            nats_url=nats.url, kubeconfig=kube.kubeconfig, install_crds=False, credentials=credentials
        )
    finally:
        if replicas is None:
            del os.environ["TJPIPE_STREAM_REPLICAS"]
        else:
            os.environ["TJPIPE_STREAM_REPLICAS"] = replicas
    if own_identities:
        stack.use_own_identities()
    for name in runtimes:
        stack.install_runtime(name)
    api = new_api_client(kube.kubeconfig)
    if namespace is None:
        namespace = new_namespace(api)
    else:
        kube_client.CoreV1Api(api).create_namespace(
            kube_client.V1Namespace(metadata=kube_client.V1ObjectMeta(name=namespace))
        )
    pipeline = Pipeline(
        kube=kube,
        root=root,
        namespace=namespace,
        nats=nats,
        stack=stack,
        dyn=dynamic.DynamicClient(api),
        api=api,
    )
    return pipeline


def close_pipeline(pipeline: Pipeline) -> str:
    tails = pipeline.log_tails()
    pipeline.stack.stop()
    for process in pipeline.processes.values():
        process.stop(timeout=5)
    # The NATS process may have been replaced by restart_nats; stop whichever is current.
    pipeline.nats.stop()
    pipeline.api.close()
    return tails


# ------------------------------------------------------------------------------------------------ bus


@dataclass(frozen=True)
class Recorded:
    """A message as its work stream had it: ``seq`` is its place there, read back from its history copy."""

    seq: int
    subject: str
    data: bytes
    headers: dict[str, str]


async def stream_messages(js: JetStreamContext, stream: str, subject: str) -> list[Any]:
    """Every message in ``stream`` on ``subject`` (wildcards allowed), oldest first, read by direct get.

    A work stream keeps only what waits to be done, so for one its history stream is read, and each copy
    is given back with the subject, sequence and headers it had in the work stream.
    """
    history = streams.HISTORY_OF.get(stream)
    out: list[Any] = []
    seq = 1
    while True:
        try:
            msg = await js.get_msg(history or stream, seq=seq, subject=subject, next=True)
        except NotFoundError:
            return out
        seq = int(msg.seq) + 1
        if history is None:
            out.append(msg)
            continue
        headers = dict(msg.headers or {})
        source = headers.pop(SOURCE_HEADER, "").split()
        origin = int(source[1]) if len(source) > 1 and source[1].isdigit() else int(msg.seq)
        out.append(Recorded(seq=origin, subject=str(msg.subject), data=bytes(msg.data or b""), headers=headers))


async def subject_count(js: JetStreamContext, stream: str, subject: str) -> int:
    info = await js.stream_info(streams.HISTORY_OF.get(stream, stream), subjects_filter=subject)
    return int(sum((info.state.subjects or {}).values()))


def results_filter(namespace: str, name: str = "*") -> str:
    return f"{subjects.RESULTS_PREFIX}.*.{namespace}.{name}.>"


def apply_filter(namespace: str, name: str = "*") -> str:
    return f"{subjects.APPLY_PREFIX}.*.{namespace}.{name}.>"


def events_filter(namespace: str, name: str = "*") -> str:
    return f"{subjects.EVENTS_PREFIX}.*.{namespace}.{name}"


def dlq_filter(namespace: str, stage: str = "*", name: str = "*") -> str:
    return f"{subjects.DLQ_PREFIX}.{stage}.{namespace}.{name}"


_record_decoder = msgspec.json.Decoder(AppliedRecord)


async def dead_letters(js: JetStreamContext, *namespaces: str) -> list[DeadLetter]:
    """The dead letters about TrainJobs in ``namespaces``, oldest first within each namespace."""
    out: list[DeadLetter] = []
    for namespace in namespaces:
        out += [decode_dead_letter(m.data) for m in await stream_messages(js, streams.DLQ.name, dlq_filter(namespace))]
    return out


async def ledger_record(js: JetStreamContext, key: str) -> AppliedRecord | None:
    kv = await js.key_value(streams.APPLIED_BUCKET)
    try:
        entry = await kv.get(key)
    except Exception:
        return None
    return _record_decoder.decode(entry.value) if entry.value else None


async def consumer_backlog(js: JetStreamContext, stream: str) -> tuple[int, int, int]:
    """(consumers, num_pending, num_ack_pending) over every durable consumer of ``stream``.

    Counted over all consumers so the helpers work with one durable per service as well as with one
    durable per partition.
    """
    infos = await js.consumers_info(stream)
    return (
        len(infos),
        sum(int(i.num_pending or 0) for i in infos),
        sum(int(i.num_ack_pending or 0) for i in infos),
    )


async def drained(js: JetStreamContext) -> bool:
    """The planner's and the applier's consumers exist and have nothing to deliver or awaiting an ack."""
    for stream in (streams.EVENTS.name, streams.APPLY.name):
        consumers, pending, ack_pending = await consumer_backlog(js, stream)
        if not consumers or pending or ack_pending:
            return False
    return True


async def services_ready(js: JetStreamContext, *, timeout: float = 30) -> None:
    """The planner and the applier have bound their consumers (the watcher needs no consumer)."""

    async def bound() -> bool:
        return all([(await consumer_backlog(js, s))[0] > 0 for s in (streams.EVENTS.name, streams.APPLY.name)])

    await until_async(bound, timeout=timeout, what="the planner's and the applier's consumers")
    await asyncio.sleep(0.5)


# ------------------------------------------------------------------------------------------ TrainJobs


def trainjob(
    name: str,
    *,
    num_nodes: int = 2,
    suspend: bool | None = None,
    runtime: str = "torch-distributed",
    runtime_kind: str | None = None,
    runtime_group: str | None = None,
    patches: list[dict[str, Any]] | None = None,
    labels: dict[str, str] | None = None,
    trainer: dict[str, Any] | None = None,
    extra_spec: dict[str, Any] | None = None,
) -> dict[str, Any]:
    ref: dict[str, Any] = {"name": runtime}
    if runtime_kind is not None:
        ref["kind"] = runtime_kind
    if runtime_group is not None:
        ref["apiGroup"] = runtime_group
    spec: dict[str, Any] = {"runtimeRef": ref}
    trainer_spec = {"numNodes": num_nodes, "image": "example.com/train:1.0"} if trainer is None else trainer
    if trainer_spec:
        spec["trainer"] = trainer_spec
    if suspend is not None:
        spec["suspend"] = suspend
    if patches is not None:
        spec["runtimePatches"] = patches
    if extra_spec:
        spec.update(extra_spec)
    metadata: dict[str, Any] = {"name": name}
    if labels:
        metadata["labels"] = labels
    return {"apiVersion": TRAINER, "kind": "TrainJob", "metadata": metadata, "spec": spec}


def step_patch(step: str, *, manager: str = "example.com/faults") -> list[dict[str, Any]]:
    """A runtime patch that sets the JobSet's label ``step`` and the node pods' nodeSelector ``step``."""
    return [
        {
            "manager": manager,
            "trainingRuntimeSpec": {
                "template": {
                    "metadata": {"labels": {"step": step}},
                    "spec": {
                        "replicatedJobs": [
                            {
                                "name": "node",
                                "template": {"spec": {"template": {"spec": {"nodeSelector": {"step": step}}}}},
                            }
                        ]
                    },
                }
            },
        }
    ]


def node_job(jobset: dict[str, Any], name: str = "node") -> dict[str, Any]:
    for rjob in jobset["spec"]["replicatedJobs"]:
        if rjob["name"] == name:
            return dict(rjob)
    raise KeyError(name)


def owned_by(obj: dict[str, Any], uid: str) -> bool:
    return any(o.get("controller") and o.get("uid") == uid for o in obj["metadata"].get("ownerReferences") or [])


def condition_of(obj: dict[str, Any], kind: str) -> dict[str, Any] | None:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond["type"] == kind:
            return dict(cond)
    return None


def managers_of(obj: dict[str, Any], subresource: str = "") -> dict[str, dict[str, Any]]:
    """manager → fieldsV1 of the entries on the object (or subresource)."""
    out: dict[str, dict[str, Any]] = {}
    for entry in obj["metadata"].get("managedFields") or []:
        if (entry.get("subresource") or "") == subresource:
            out[f"{entry['manager']}/{entry['operation']}"] = entry.get("fieldsV1") or {}
    return out


def jobset_matches(js: dict[str, Any] | None, tj: dict[str, Any]) -> bool:
    """The JobSet is the one Trainer builds for this TrainJob: owner, node count, suspend flag."""
    if js is None:
        return False
    spec = tj["spec"]
    node = node_job(js)["template"]["spec"]
    want_nodes = spec.get("trainer", {}).get("numNodes", 1)
    return (
        owned_by(js, tj["metadata"]["uid"])
        and node["parallelism"] == want_nodes
        and node["completions"] == want_nodes
        and bool(js["spec"].get("suspend", False)) == bool(spec.get("suspend", False))
    )


def converged(pipeline: Pipeline, names: Iterable[str]) -> bool:
    """Every named TrainJob has its JobSet, built from its current spec."""
    jobsets = pipeline.jobsets()
    trainjobs = pipeline.trainjobs()
    return all(jobset_matches(jobsets.get(n), trainjobs[n]) for n in names)


def missing(pipeline: Pipeline, names: Iterable[str]) -> list[str]:
    jobsets = pipeline.jobsets()
    trainjobs = pipeline.trainjobs()
    return [n for n in names if not jobset_matches(jobsets.get(n), trainjobs[n])]


# ------------------------------------------------------------------------------------------- repeats


async def quiet(pipeline: Pipeline, js: JetStreamContext, *, settle: float = 1.5, timeout: float = 90) -> WriteCounts:
    """Wait until both consumers are drained and the apiserver saw no write for ``settle`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        before = pipeline.writes()
        await asyncio.sleep(settle)
        after = pipeline.writes()
        if total_writes(after - before) == 0 and await drained(js):
            return after
        if time.monotonic() >= deadline:
            raise AssertionError(f"the pipeline did not go quiet in {timeout:.0f}s: {(after - before).summary()}")


async def replay_applies(pipeline: Pipeline, js: JetStreamContext, *, timeout: float = 60) -> tuple[int, WriteCounts]:
    """Publish every apply message of the namespace again, with fresh message ids, and wait for the results.

    Returns how many messages were replayed and the writes the apiserver saw meanwhile. Every replayed
    message is either the last thing applied to its target (``unchanged``: one GET) or older than it
    (``skipped`` as stale: no API call at all), so the writes must be zero.
    """
    ns = pipeline.namespace
    before_results = await subject_count(js, streams.RESULTS.name, results_filter(ns))
    before = await quiet(pipeline, js)
    messages = await stream_messages(js, streams.APPLY.name, apply_filter(ns))
    for msg in messages:
        # The planner's signature is kept, as `tjpipe dlq retry` keeps it; only the message id is new.
        headers = {**(msg.headers or {}), "Nats-Msg-Id": f"replay-{secrets.token_hex(8)}"}
        await js.publish(msg.subject, msg.data, headers=headers)
    want = before_results + len(messages)
    await until_async(
        lambda: at_least(js, streams.RESULTS.name, results_filter(ns), want),
        timeout=timeout,
        what=f"{len(messages)} results of the replayed apply messages",
    )
    after = await quiet(pipeline, js)
    return len(messages), after - before


async def at_least(js: JetStreamContext, stream: str, subject: str, count: int) -> bool:
    """Whether ``stream`` holds ``count`` or more messages on ``subject``."""
    return await subject_count(js, stream, subject) >= count


async def results_of(js: JetStreamContext, namespace: str, name: str = "*") -> list[Any]:
    from contracts.messages import decode_result

    return [
        decode_result(m.data) for m in await stream_messages(js, streams.RESULTS.name, results_filter(namespace, name))
    ]


# ------------------------------------------------------------------------------------------- tripwire


class Tripwire:
    """Freeze a service (SIGSTOP on its process group) the moment the k-th message appears on a subject.

    A core NATS subscription sees every message published to a stream's subjects as it is published,
    so the freeze lands within a millisecond or so of the k-th apply result (or plan): mid-batch, with
    work in flight. The frozen process can then be SIGKILLed at leisure.
    """

    def __init__(self, process: ManagedProcess, *, after: int) -> None:
        self.process = process
        self.after = after
        self.seen = 0
        self.fired = asyncio.Event()
        self._sub: Any = None

    async def arm(self, nc: Any, subject: str) -> None:
        self._sub = await nc.subscribe(subject, cb=self._on_message)

    async def _on_message(self, msg: Any) -> None:
        self.seen += 1
        if self.seen == self.after:
            kill_group(self.process, signal.SIGSTOP)
            self.fired.set()

    async def disarm(self) -> None:
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()
            self._sub = None


def expected_apply_ids(events: list[Any]) -> dict[str, int]:
    """Nats-Msg-Id → event seq of every apply message the (pure) planner makes from these stored events."""
    from contracts.messages import decode_event, encode
    from planner.core import plan
    from planner.service import apply_message_id

    ids: dict[str, int] = {}
    for raw in events:
        try:
            event = decode_event(raw.data)
        except (msgspec.DecodeError, msgspec.ValidationError):
            continue
        for message in plan(event, source_seq=int(raw.seq)).applies:
            ids[apply_message_id(message, encode(message))] = int(raw.seq)
    return ids


# -------------------------------------------------------------------------------------- assertions


REPORT: dict[str, Any] = {}
"""Measured numbers, printed at the end of each test (pytest -s, or the captured output on failure)."""


def report(test: str, **values: Any) -> None:
    REPORT.setdefault(test, {}).update(values)
    print(f"[faults] {test}: {values}")


def step_of(pipeline: Pipeline, name: str) -> tuple[str | None, str | None]:
    """(JobSet label ``step``, node pods' nodeSelector ``step``) of the live JobSet."""
    js = pipeline.get_or_none(JOBSET, "JobSet", name)
    if js is None:
        return None, None
    label = (js["metadata"].get("labels") or {}).get("step")
    pod = node_job(js)["template"]["spec"]["template"]["spec"]
    return label, (pod.get("nodeSelector") or {}).get("step")


async def assert_ledger_holds_live(pipeline: Pipeline, js: Any, name: str, *, spec_version: int) -> Any:
    """The ledger's record for the JobSet: applied, made from an observation no older than the TrainJob's
    last spec change (``spec_version``, the resourceVersion that write returned), and describing the
    live JobSet (its resourceVersion is the one our last apply returned)."""
    record = await ledger_record(js, f"{pipeline.namespace}.jobset.{name}")
    live = pipeline.get(JOBSET, "JobSet", name)
    assert record is not None, f"no ledger record for JobSet {name}"
    assert record.state == "applied", record
    assert record.source_version >= spec_version, (record, spec_version)
    assert record.resource_version == live["metadata"]["resourceVersion"], (
        record,
        live["metadata"]["resourceVersion"],
        live["metadata"].get("managedFields"),
    )
    return record


def rv(obj: dict[str, Any]) -> int:
    return int(obj["metadata"]["resourceVersion"])


async def no_dead_letters(js: Any, namespace: str) -> None:
    letters = await stream_messages(js, streams.DLQ.name, dlq_filter(namespace))
    assert not letters, [m.data[:300] for m in letters]


def same_version_status_plans(applies: list[Any]) -> int:
    """How many (TrainJob, source_version) pairs have more than one *different* status plan.

    Two observations of a TrainJob with the same versions (one before our status write landed, one
    after a ConfigMap or runtime event, seconds apart) plan conditions with different lastTransitionTimes;
    the ledger fence cannot order them (equal source_version), so replaying both writes twice. See
    test_bugs.py::test_two_observations_of_the_same_version_cost_one_status_write.
    """
    from contracts.messages import ApplyTrainJobStatus, decode_apply

    plans: dict[tuple[str, int], set[bytes]] = {}
    for raw in applies:
        try:
            message = decode_apply(raw.data)
        except (msgspec.DecodeError, msgspec.ValidationError):
            continue
        if isinstance(message, ApplyTrainJobStatus):
            key = (str(message.trainjob), message.source_version)
            plans.setdefault(key, set()).add(msgspec.json.encode(message.object))
    return sum(1 for bodies in plans.values() if len(bodies) > 1)


async def assert_repeats_cost_nothing(pipeline: Pipeline, js: JetStreamContext) -> tuple[int, WriteCounts, int]:
    """Replay every apply message of the test; no write may follow.

    The one tolerated exception is the known bug of two different status plans with the same
    source_version (``same_version_status_plans``): each such pair may cost two status writes on replay;
    test_bugs.py pins it deterministically. Returns (replayed, writes, such pairs).
    """
    ambiguous = same_version_status_plans(
        await stream_messages(js, streams.APPLY.name, apply_filter(pipeline.namespace))
    )
    replayed, repeat = await replay_applies(pipeline, js)
    assert replayed > 0
    others = {k: v for k, v in repeat.summary().items() if k != "trainjobs/status"}
    assert others == {}, repeat.summary()
    assert repeat.writes("trainjobs", "status") <= 2 * ambiguous, (repeat.summary(), ambiguous)
    return replayed, repeat, ambiguous
