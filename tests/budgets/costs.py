"""Counting what one TrainJob costs, from the servers' own records, and checking it against its budget.

Every count comes from the server that did the work, never from the services' own bookkeeping, so a
request a service forgets to count still shows, and every kind of request is counted, so a new kind shows too:
- API requests: the kube-apiserver's audit log (``audit_flags``), one record per request with the user who sent
  it, its resource, subresource and verb, WATCH and LIST included (a watch is counted when it starts). The
  services run as the pipeline's own ServiceAccounts (``tjpipe.local.identities``), so their requests are told
  apart from the test's, the garbage collector's and JobSet's manager's, on every resource. An apply (a patch
  with ``force``) is counted as APPLY, as ``apiserver_request_total`` labels it.
- Messages stored: every stream's last sequence from nats-server's ``/jsz``, whatever its name: the work
  streams, their history copies, the results, the dead letters, the KV buckets (every put is a message).
- Acknowledgements: each durable's ack floor from ``/jsz``, summed over a stage's partitions; plus every
  ``$JS.ACK`` message the server routed, seen by a wiretap (below), which also catches a negative ack or
  an in-progress beat that moves no floor.
- Every JetStream API request by kind (``$JS.API.STREAM.INFO``, ``DIRECT.GET`` of which stream, pulls, ...): the
  same wiretap, an admin connection subscribed to ``$JS.API.>``, which gets a copy of each request the server
  routes (it answers none). Its counts are read without sleeping: a flush's PONG comes after every message the
  server routed to it before, and the messages wait in the subscription's queue until read.

The services do a few things on a clock whatever the TrainJobs do (pulls that wait for work, the partition
leases, the stream usage report); those rows are budgeted per second of the measured window
(``budgets.declared``), not left out. The pipeline under measurement is the only one on its nats-server and
its apiserver, in a namespace of its own, so every delta between two snapshots is the test's TrainJob or the
clock.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
import urllib.request
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from faults.support import Pipeline

from contracts import streams
from plumbing.bus_setup import LEASE_BUCKET
from tjpipe.local import identities

STAGES = {"planner": streams.PLANNER.stream, "applier": streams.APPLIER.stream}
"""Durable name prefix → the stream it consumes (one durable per partition: ``planner-p0`` …)."""
STATUS_WRITE_VERBS = frozenset({"APPLY", "PATCH", "UPDATE"})
READ_VERBS = frozenset({"GET", "LIST", "WATCH"})
COMPONENT_RESOURCES = frozenset({"configmaps", "jobsets", "podgroups", "secrets"})
"""What a TrainJob owns: a write to one of them by anyone is a change the watcher may observe."""
PIPELINE_USERS = {
    f"system:serviceaccount:{identities.NAMESPACE}:{account}": service
    for service, account in identities.SERVICE_ACCOUNTS.items()
}
LEASES_STREAM = f"KV_{LEASE_BUCKET}"


# ------------------------------------------------------------------------------------------ the apiserver

AUDIT_POLICY = """apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Metadata
"""


def audit_flags(folder: Path) -> tuple[list[str], Path]:
    """kube-apiserver flags for an audit log of every request at the Metadata level (who, what, which verb; no
    bodies, so no Secret's data), written before each response completes; and the log's path."""
    folder.mkdir(parents=True, exist_ok=True)
    policy, log = folder / "audit-policy.yaml", folder / "audit.log"
    policy.write_text(AUDIT_POLICY)
    return [f"--audit-policy-file={policy}", f"--audit-log-path={log}", "--audit-log-mode=blocking"], log


@dataclass(frozen=True)
class Request:
    user: str
    namespace: str
    resource: str
    subresource: str
    verb: str

    @property
    def label(self) -> str:
        return f"{self.resource}{'/' + self.subresource if self.subresource else ''} {self.verb}"


def _verb(event: Mapping[str, Any]) -> str:
    verb = str(event.get("verb", "")).upper()
    if verb == "PATCH" and "force" in parse_qs(urlsplit(str(event.get("requestURI", ""))).query):
        return "APPLY"
    return verb


def audit_requests(log: Path) -> dict[str, Request]:
    """Every request in the audit log by its audit ID (a watch's records share one: it counts once, from its
    start). Requests that are not to a resource (``/metrics``, discovery) are left out."""
    seen: dict[str, Request] = {}
    if not log.exists():
        return seen
    with log.open(encoding="utf-8") as fh:
        for line in fh:
            event = json.loads(line)
            ref = event.get("objectRef") or {}
            if event["auditID"] in seen or not ref.get("resource"):
                continue
            seen[event["auditID"]] = Request(
                user=str((event.get("user") or {}).get("username", "")),
                namespace=str(ref.get("namespace", "")),
                resource=str(ref["resource"]),
                subresource=str(ref.get("subresource", "")),
                verb=_verb(event),
            )
    return seen


# ------------------------------------------------------------------------------------------ nats-server

_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def jsz(p: Pipeline) -> dict[str, Any]:
    monitor = getattr(p.nats, "monitor_url", None)
    assert monitor, "the budget tests need one nats-server with its monitoring port"
    with _DIRECT.open(f"{monitor}/jsz?accounts=true&streams=true&consumers=true", timeout=10) as response:
        data: dict[str, Any] = json.loads(response.read())
    return data


@dataclass(frozen=True)
class BusState:
    """What nats-server's ``/jsz`` says at one moment."""

    last_seq: dict[str, int]
    acked: dict[str, int]
    """Stage → the sum of its durables' ack floors (consumer sequence)."""
    delivered: dict[str, int]
    pending: int
    """Messages the stages' durables have not delivered or not had acknowledged."""


def bus_state(p: Pipeline) -> BusState:
    data = jsz(p)
    last_seq: dict[str, int] = {}
    acked: Counter[str] = Counter()
    delivered: Counter[str] = Counter()
    pending = 0
    for account in data.get("account_details") or []:
        for stream in account.get("stream_detail") or []:
            last_seq[stream["name"]] = int(stream["state"]["last_seq"])
            for consumer in stream.get("consumer_detail") or []:
                durable = str(consumer.get("name", ""))
                stage = durable.split("-p", 1)[0]
                if stage in STAGES and STAGES[stage] == stream["name"]:
                    acked[stage] += int((consumer.get("ack_floor") or {}).get("consumer_seq") or 0)
                    delivered[stage] += int((consumer.get("delivered") or {}).get("consumer_seq") or 0)
                    pending += int(consumer.get("num_pending") or 0) + int(consumer.get("num_ack_pending") or 0)
    return BusState(last_seq=last_seq, acked=dict(acked), delivered=dict(delivered), pending=pending)


# ------------------------------------------------------------------------------------------- the wiretap


def api_kind(subject: str) -> str:
    """``$JS.API.DIRECT.GET.KV_x`` → ``DIRECT.GET.KV_x`` (which stream is read matters); ``$JS.API.STREAM.INFO.S``
    → ``STREAM.INFO``; ``$JS.API.CONSUMER.MSG.NEXT.S.d`` → ``CONSUMER.MSG.NEXT``."""
    words = subject.split(".")[2:]
    if words[:2] in (["DIRECT", "GET"], ["CONSUMER", "MSG"], ["STREAM", "MSG"]):
        return ".".join(words[:3])
    return ".".join(words[:2])


def ack_kind(data: bytes) -> str:
    """What a message on ``$JS.ACK…`` says: an empty body or ``+ACK`` acknowledges."""
    word = bytes(data).split(b" ", 1)[0]
    return "+ACK" if word in (b"", b"+ACK") else word.decode(errors="replace")


@dataclass
class Wiretap:
    """An admin connection's view of every JetStream API request and acknowledgement the server routes."""

    api: Counter[str] = field(default_factory=Counter)
    acks: Counter[str] = field(default_factory=Counter)
    _nc: Any = None
    _subs: tuple[Any, Any] | None = None

    async def start(self, p: Pipeline) -> None:
        self._nc = await p.connect()
        self._subs = (await self._nc.subscribe("$JS.API.>"), await self._nc.subscribe("$JS.ACK.>"))
        await self._nc.flush()

    async def snapshot(self) -> tuple[Counter[str], Counter[str]]:
        """Everything the server routed to the tap before now. The flush's PONG follows those messages on the
        connection, so once it is back they all wait in the subscriptions' queues: they are read from there,
        with no sleep and no guess."""
        assert self._subs is not None
        await self._nc.flush()
        api_sub, ack_sub = self._subs
        for _ in range(api_sub.pending_msgs):
            self.api[api_kind((await api_sub.next_msg(timeout=5)).subject)] += 1
        for _ in range(ack_sub.pending_msgs):
            self.acks[ack_kind((await ack_sub.next_msg(timeout=5)).data)] += 1
        return Counter(self.api), Counter(self.acks)

    async def stop(self) -> None:
        if self._nc is not None:
            await self._nc.close()


# --------------------------------------------------------------------------------------------- one run


@dataclass(frozen=True)
class Snapshot:
    at: float
    requests: dict[str, Request]
    bus: BusState
    wire_api: Counter[str]
    wire_acks: Counter[str]


async def snapshot(p: Pipeline, tap: Wiretap, audit_log: Path) -> Snapshot:
    wire_api, wire_acks = await tap.snapshot()
    return Snapshot(
        at=time.monotonic(),
        requests=audit_requests(audit_log),
        bus=bus_state(p),
        wire_api=wire_api,
        wire_acks=wire_acks,
    )


def _delta(after: Mapping[Any, int], before: Mapping[Any, int]) -> dict[Any, int]:
    moved = {k: after.get(k, 0) - before.get(k, 0) for k in set(after) | set(before)}
    return {k: v for k, v in moved.items() if v}


def measured(before: Snapshot, after: Snapshot, namespace: str) -> dict[str, int]:
    """Every counted figure between two snapshots, under the names the budget rows use: ``api
    <resource>[/<sub>] <VERB>`` for each kind of request the pipeline's services sent, ``stored in <stream>``
    for each stream that grew, ``JetStream API <kind>`` for each kind of JetStream request, the acks; and the
    units the rows are counted per (``declared.UNITS``) that the servers' counts give: the window's ``second``
    and each ``component write`` (the pipeline's and JobSet's manager's)."""
    out: Counter[str] = Counter()
    for audit_id, request in after.requests.items():
        if audit_id in before.requests:
            continue
        if request.user in PIPELINE_USERS:
            out[f"api {request.label}"] += 1
            if (request.resource, request.subresource) == ("trainjobs", "status"):
                out["status writes"] += request.verb in STATUS_WRITE_VERBS
        if request.namespace == namespace and request.resource in COMPONENT_RESOURCES:
            out["component write"] += request.verb not in READ_VERBS
    for stream, value in _delta(after.bus.last_seq, before.bus.last_seq).items():
        out[f"stored in {stream}"] = value
    for stage in STAGES:
        out[f"{stage} acks (ack floor)"] = after.bus.acked.get(stage, 0) - before.bus.acked.get(stage, 0)
        out[f"{stage} deliveries"] = after.bus.delivered.get(stage, 0) - before.bus.delivered.get(stage, 0)
    wire_acks = _delta(after.wire_acks, before.wire_acks)
    out["acks sent"] = wire_acks.pop("+ACK", 0)
    out["other ack replies (nak, in progress, term)"] = sum(wire_acks.values())
    for kind, value in _delta(after.wire_api, before.wire_api).items():
        out[f"JetStream API {kind}"] = value
    out["second"] = math.ceil(after.at - before.at)
    return {k: v for k, v in out.items() if v}


async def until_started(audit_log: Path, *, timeout: float = 120.0) -> None:
    """Until the services that speak to the API server have started: each has begun its watch on TrainJobs,
    which they open last, once their lists of everything else are in. A window opened before would count their
    start as the TrainJob's (a loaded machine can take longer to start a process than ``until_quiet`` settles)."""
    deadline = time.monotonic() + timeout
    want = {"watcher", "applier"}
    while True:
        watching = {
            PIPELINE_USERS[r.user]
            for r in audit_requests(audit_log).values()
            if r.user in PIPELINE_USERS and (r.resource, r.verb) == ("trainjobs", "WATCH")
        }
        if want <= watching:
            return
        if time.monotonic() >= deadline:
            raise AssertionError(f"{sorted(want - watching)} did not start watching TrainJobs in {timeout:.0f}s")
        await asyncio.sleep(0.5)


async def until_quiet(p: Pipeline, audit_log: Path, *, settle: float = 4.0, timeout: float = 60.0) -> None:
    """Until nothing is pending on the stages' durables and neither the streams (but the partition leases,
    renewed on a timer) nor the pipeline's requests (but its leases) moved for ``settle`` seconds: the
    pipeline has done everything the TrainJob's last change asks of it."""
    deadline = time.monotonic() + timeout
    last: tuple[Any, ...] | None = None
    since = time.monotonic()
    while True:
        bus = bus_state(p)
        work = tuple(sorted((name, seq) for name, seq in bus.last_seq.items() if name != LEASES_STREAM))
        requests = sum(1 for r in audit_requests(audit_log).values() if r.user in PIPELINE_USERS)
        state = (work, requests)
        now = time.monotonic()
        if state != last or bus.pending:
            last, since = state, now
        elif now - since >= settle:
            return
        if now >= deadline:
            raise AssertionError(f"the pipeline did not go quiet in {timeout:.0f}s (pending {bus.pending})")
        await asyncio.sleep(0.5)
