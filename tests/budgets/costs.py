"""Counting what one TrainJob costs, from the servers' own counters, and checking it against a budget.

Every count comes from the server that did the work, never from the services' own bookkeeping, so a
request a service forgets to count still shows:
- API requests by (resource, subresource, verb): the kube-apiserver's ``apiserver_request_total``. It has
  no label for who sent a request, so only the resources the pipeline owns alone on the simulated cluster
  are counted (TrainJobs and their status, runtimes, JobSets but not their status, which JobSet's manager
  writes, ConfigMaps, Secrets, PodGroups), less the test's own requests (its create and its status polls,
  counted as it sends them). WATCH is left out: the server counts a watch when it ends, at a timeout it
  randomises, so it says nothing about one TrainJob.
- Messages stored: each stream's last sequence from nats-server's ``/jsz`` (the work streams, their history
  copies, the results, the dead letters and the apply ledger's KV bucket, whose every write is a message).
- Acknowledgements: each durable's ack floor from ``/jsz``, summed over a stage's partitions; plus every
  ``$JS.ACK`` message the server routed, seen by a wiretap (below), which also catches a negative ack or
  an in-progress beat that moves no floor.
- What the server keeps no counter for: its direct gets (the ledger's KV reads) and purges are requests on
  ``$JS.API.…`` subjects, which an admin connection subscribed to ``$JS.API.>`` sees as the server routes
  them (a core subscription gets a copy of every matching message; it answers none). Pull requests and
  stream infos are counted too but not budgeted: the services pull on a timer and report stream usage every
  15 s, so their number follows the clock, not the TrainJob. ``/jsz``'s own ``api.total`` (every JetStream
  API request but pulls and direct gets) is reported beside them.

The pipeline under measurement is the only one on its nats-server and works in a namespace of its own, so
every delta between two snapshots is this test's TrainJob.
"""

from __future__ import annotations

import asyncio
import json
import re
import ssl
import time
import urllib.request
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from faults.support import Pipeline

from contracts import streams

Key = tuple[str, str, str]
"""(resource, subresource, verb) as ``apiserver_request_total`` labels a request."""

OWN_RESOURCES: frozenset[tuple[str, str]] = frozenset(
    {
        ("trainjobs", ""),
        ("trainjobs", "status"),
        ("trainingruntimes", ""),
        ("clustertrainingruntimes", ""),
        ("jobsets", ""),
        ("configmaps", ""),
        ("secrets", ""),
        ("podgroups", ""),
    }
)
"""(resource, subresource) only the pipeline and the test touch on the simulated cluster during a test: JobSet's
manager writes ``jobsets/status``, kube-controller-manager Jobs and Pods, the scheduler bindings and events,
so those are theirs."""
UNCOUNTED_VERBS = frozenset({"WATCH"})
STATUS_WRITE_VERBS = frozenset({"APPLY", "PATCH", "PUT"})

KV_STREAM = f"KV_{streams.APPLIED_BUCKET}"
COUNTED_STREAMS = (
    streams.EVENTS.name,
    streams.EVENTS_HISTORY.name,
    streams.APPLY.name,
    streams.APPLY_HISTORY.name,
    streams.RESULTS.name,
    streams.DLQ.name,
    KV_STREAM,
)
ON_A_TIMER = frozenset({"CONSUMER.MSG.NEXT", "STREAM.INFO", "DIRECT.GET.KV_tj_leases"})
"""JetStream API requests the services make on a clock, whatever the TrainJobs do: pulls (each waits up to its
expiry for work), the stream usage report (every 15 s) and the partition leases' reads. Any other kind of
request is budgeted: a new one fails the test until a row names it."""
STAGES = {"planner": streams.PLANNER.stream, "applier": streams.APPLIER.stream}
"""Durable name prefix → the stream it consumes (one durable per partition: ``planner-p0`` …)."""

_SAMPLE = re.compile(r"^apiserver_request_total\{(?P<labels>[^}]*)\}\s+(?P<value>\S+)$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


# ------------------------------------------------------------------------------------------ the servers


def api_requests(p: Pipeline) -> Counter[Key]:
    """``apiserver_request_total`` on the pipeline's own resources, by (resource, subresource, verb), every code."""
    kube = p.kube
    tls = ssl.create_default_context(cafile=str(kube.ca_file))
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=tls))
    request = urllib.request.Request(f"{kube.server}/metrics", headers={"Authorization": f"Bearer {kube.token}"})
    with opener.open(request, timeout=10) as response:
        text = response.read().decode()
    counts: Counter[Key] = Counter()
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match is None:
            continue
        labels = dict(_LABEL.findall(match["labels"]))
        resource, subresource, verb = labels.get("resource", ""), labels.get("subresource", ""), labels.get("verb", "")
        if (resource, subresource) in OWN_RESOURCES and verb not in UNCOUNTED_VERBS:
            counts[(resource, subresource, verb)] += int(float(match["value"]))
    return counts


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
    api_total: int


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
    return BusState(
        last_seq=last_seq,
        acked=dict(acked),
        delivered=dict(delivered),
        pending=pending,
        api_total=int((data.get("api") or {}).get("total") or 0),
    )


# ------------------------------------------------------------------------------------------- the wiretap


def api_kind(subject: str) -> str:
    """``$JS.API.DIRECT.GET.KV_x`` → ``DIRECT.GET.KV_x`` (which stream is read matters: the ledger's, or the
    partition leases'); ``$JS.API.CONSUMER.MSG.NEXT.S.d`` → ``CONSUMER.MSG.NEXT``; ``$JS.API.STREAM.MSG.DELETE.S`` →
    ``STREAM.MSG.DELETE``; ``$JS.API.STREAM.INFO.S`` → ``STREAM.INFO``."""
    words = subject.split(".")[2:]
    if words[:2] in (["CONSUMER", "MSG"], ["DIRECT", "GET"], ["STREAM", "MSG"]):
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

    async def start(self, p: Pipeline) -> None:
        self._nc = await p.connect()

        async def on_api(msg: Any) -> None:
            self.api[api_kind(msg.subject)] += 1

        async def on_ack(msg: Any) -> None:
            self.acks[ack_kind(msg.data)] += 1

        await self._nc.subscribe("$JS.API.>", cb=on_api)
        await self._nc.subscribe("$JS.ACK.>", cb=on_ack)
        await self._nc.flush()

    async def snapshot(self) -> tuple[Counter[str], Counter[str]]:
        await self._nc.flush()  # whatever the server routed before now has reached the callbacks
        await asyncio.sleep(0.05)
        return Counter(self.api), Counter(self.acks)

    async def stop(self) -> None:
        if self._nc is not None:
            await self._nc.close()


# --------------------------------------------------------------------------------------------- one run


@dataclass
class Own:
    """The test's own requests on counted resources, taken out of the API server's counts."""

    requests: Counter[Key] = field(default_factory=Counter)

    def sent(self, resource: str, verb: str, subresource: str = "") -> None:
        self.requests[(resource, subresource, verb)] += 1


@dataclass(frozen=True)
class Snapshot:
    api: Counter[Key]
    bus: BusState
    wire_api: Counter[str]
    wire_acks: Counter[str]


async def snapshot(p: Pipeline, tap: Wiretap) -> Snapshot:
    wire_api, wire_acks = await tap.snapshot()
    return Snapshot(api=api_requests(p), bus=bus_state(p), wire_api=wire_api, wire_acks=wire_acks)


def _delta(after: Mapping[Any, int], before: Mapping[Any, int]) -> dict[Any, int]:
    moved = {k: after.get(k, 0) - before.get(k, 0) for k in set(after) | set(before)}
    return {k: v for k, v in moved.items() if v}


def label(key: Key) -> str:
    resource, subresource, verb = key
    return f"{resource}{'/' + subresource if subresource else ''} {verb}"


def measured(before: Snapshot, after: Snapshot, own: Own) -> dict[str, int]:
    """Every counted figure, under the names the budget tables use."""
    out: dict[str, int] = {}
    api = Counter(_delta(after.api, before.api))
    api.subtract(own.requests)
    for key, value in sorted(api.items()):
        if value:
            out[f"api {label(key)}"] = value
    out["status writes"] = sum(
        v for (res, sub, verb), v in api.items() if (res, sub) == ("trainjobs", "status") and verb in STATUS_WRITE_VERBS
    )
    stored = _delta(after.bus.last_seq, before.bus.last_seq)
    names = {
        streams.EVENTS.name: "events published",
        streams.EVENTS_HISTORY.name: "event history copies",
        streams.APPLY.name: "apply messages",
        streams.APPLY_HISTORY.name: "apply history copies",
        streams.RESULTS.name: "results published",
        streams.DLQ.name: "dead letters",
        KV_STREAM: "ledger KV writes",
    }
    for stream, name in names.items():
        out[name] = stored.get(stream, 0)
    for stream, value in sorted(stored.items()):
        if stream not in names:  # the partition leases' bucket, renewed on a timer
            out[f"unbudgeted: stored in {stream}"] = value
    for stage in STAGES:
        out[f"{stage} acks (ack floor)"] = after.bus.acked.get(stage, 0) - before.bus.acked.get(stage, 0)
        out[f"{stage} deliveries"] = after.bus.delivered.get(stage, 0) - before.bus.delivered.get(stage, 0)
    wire_acks = _delta(after.wire_acks, before.wire_acks)
    out["acks sent"] = wire_acks.pop("+ACK", 0)
    out["other ack replies (nak, in progress, term)"] = sum(wire_acks.values())
    wire = _delta(after.wire_api, before.wire_api)
    out["ledger KV reads (direct gets)"] = wire.pop(f"DIRECT.GET.{KV_STREAM}", 0)
    out["purges and message deletes"] = wire.pop("STREAM.PURGE", 0) + wire.pop("STREAM.MSG.DELETE", 0)
    for kind, value in sorted(wire.items()):
        timed = kind in ON_A_TIMER
        out[f"{'unbudgeted: ' if timed else ''}JetStream API {kind}"] = value
    out["unbudgeted: /jsz api.total"] = after.bus.api_total - before.bus.api_total
    return out


async def until_quiet(
    p: Pipeline, own: Own, *, settle: float = 4.0, timeout: float = 60.0, interval: float = 0.5
) -> None:
    """Until nothing is pending on the stages' durables and no counted stream and no counted API request
    moved for ``settle`` seconds: the pipeline has done everything the TrainJob's last change asks of it.
    (The partition leases' bucket is renewed on a timer whatever happens, so it is not waited on.)"""
    deadline = time.monotonic() + timeout
    last: tuple[Any, ...] | None = None
    moved: list[str] = []
    since = time.monotonic()
    while True:
        bus = bus_state(p)
        api = api_requests(p)
        api.subtract(own.requests)
        counted = {name: seq for name, seq in bus.last_seq.items() if name in COUNTED_STREAMS}
        state = (tuple(sorted(counted.items())), tuple(sorted((+api).items())))
        now = time.monotonic()
        if state != last or bus.pending:
            moved = sorted(map(str, set(state[0] + state[1]) - set(last[0] + last[1]))) if last else []
            last, since = state, now
        elif now - since >= settle:
            return
        if now >= deadline:
            raise AssertionError(
                f"the pipeline did not go quiet in {timeout:.0f}s (pending {bus.pending}, last moved: {moved})"
            )
        await asyncio.sleep(interval)


# ------------------------------------------------------------------------------------------- budgets


@dataclass(frozen=True)
class Budget:
    """At most ``limit`` of ``figure`` per TrainJob, and the guarantee each one buys."""

    figure: str
    limit: int
    reason: str


def over_budget(costs: Mapping[str, int], budgets: Iterable[Budget]) -> list[str]:
    """Every figure above its budget, and every API request or bus figure that has no budget row at all (a
    new kind of round trip must come with its row and its reason)."""
    table = {b.figure: b for b in budgets}
    problems = [
        f"{b.figure}: {costs.get(b.figure, 0)} > budget {b.limit} ({b.reason})"
        for b in table.values()
        if costs.get(b.figure, 0) > b.limit
    ]
    problems += [
        f"{figure}: {value}, and no budget row for it"
        for figure, value in sorted(costs.items())
        if value and figure not in table and not figure.startswith("unbudgeted:")
    ]
    return problems


def under_budget(costs: Mapping[str, int], budgets: Iterable[Budget]) -> list[str]:
    """Rows whose budget is above what was measured: a saving to lock in by lowering the row."""
    return [
        f"{b.figure}: {costs.get(b.figure, 0)} < budget {b.limit}" for b in budgets if costs.get(b.figure, 0) < b.limit
    ]


def table(costs: Mapping[str, int], budgets: Iterable[Budget]) -> str:
    rows = {b.figure: b.limit for b in budgets}
    width = max(len(k) for k in [*costs, *rows])
    return "\n".join(
        f"  {figure:<{width}}  {costs.get(figure, 0):>4}  budget {rows.get(figure, '-')}"
        for figure in sorted(set(costs) | set(rows))
    )
