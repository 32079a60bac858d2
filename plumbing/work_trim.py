"""Work streams that keep only unfinished work on a JetStream cluster, where they cannot use interest retention.

On one server a work stream has interest retention: the server drops a message once the partition's
durable and the history stream's source have both acknowledged it. Replicated work streams keep limits
retention (``plumbing.bus_setup.effective_retention`` says why), and a limits stream keeps what is done for its
whole age window, so at its byte limit it stayed full and publishers waited for room no consumer could
make. Here the consuming stage removes what is done itself, with the same rule the server applies under
interest retention: a message goes once its partition's durable has acknowledged it and the history
stream has copied it.

Both facts are read from the servers, never assumed: the durable's ack floor (every message at or below
it is acknowledged) and the work-stream sequence of the newest message the history holds (a source copies
in order, so everything before it is recorded). One filtered purge per partition then removes everything
below the lower of the two. The purge is a replicated stream operation, so it takes no part in whatever
made interest retention lose messages on a cluster, and it is idempotent: two replicas briefly holding the
same partition, or a round repeated after a timeout, remove nothing that is not done.

What it costs: a partition's messages above its oldest unfinished one stay until that one is finished (a
message retried for a long time holds back the trim of its partition, not the others), and each round is
one direct get plus a consumer info and at most one purge for each partition that had work since its last
settled round; a quiet partition costs nothing. A removed message keeps its id in the duplicate window, as
under interest retention.

On one server interest retention does the removing, with one exception, seen under load in
``tests/progress_under_load``: the server kept a message that its partition's durable had acknowledged and
the history had copied (both read back from the server), and a lone server never looks at such a message
again. One of them in a work stream at a small byte limit refused every later publish, for good. So under
interest retention the consumers sweep as well, slowly and almost for free: every ``SWEEP_SECONDS`` one
stream info, and only when the same message has stayed first in the stream for a whole interval (finished
work the server kept, or a backlog) does a replica read its partitions' ack floors and purge, by the rule
above, what is finished and recorded there. Everything before the stream's first message is gone already,
so a partition whose finished work all lies below it costs a consumer info and no purge.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging

from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js import api as js_api

from contracts.streams import HISTORY_OF, ConsumerSpec
from plumbing.bus_history import SOURCE_HEADER
from plumbing.bus_setup import partition_consumer
from plumbing.observability import WORK_TRIMMED

log = logging.getLogger(__name__)

INTERVAL_SECONDS = 2.0
"""Limits retention: how often the partitions that had work are trimmed."""

SWEEP_SECONDS = 15.0
"""Interest retention: how often the stream is looked at for finished work the server kept."""


def recorded_up_to(headers: dict[str, str] | None, work_stream: str) -> int | None:
    """The work-stream sequence of a history message, from the header the server puts on every copy a source
    makes (``<origin stream> <origin sequence> …``); None if it names another stream.

    Servers before 2.10 wrote the origin as ``<stream>:<hash>``; both forms are read.
    """
    fields = ((headers or {}).get(SOURCE_HEADER) or "").split()
    if len(fields) < 2 or fields[0].split(":", 1)[0] != work_stream or not fields[1].isdigit():
        return None
    return int(fields[1])


def purge_below(*, ack_floor: int, recorded: int, trimmed: int) -> int | None:
    """The sequence a partition's purge keeps from (everything below it goes), or None when nothing new is done."""
    done = min(ack_floor, recorded)
    return done + 1 if done > trimmed else None


class WorkTrim:
    """Removes, for the partitions this replica works on, what is acknowledged and recorded."""

    def __init__(
        self,
        nc: NATS,
        js: JetStreamContext,
        spec: ConsumerSpec,
        *,
        interval: float = INTERVAL_SECONDS,
        sweep_interval: float = SWEEP_SECONDS,
    ):
        self.nc = nc
        self.js = js
        self.spec = spec
        self.history = HISTORY_OF[spec.stream]
        self.interval = interval
        self.sweep_interval = sweep_interval
        self._held: set[int] = set()
        self._unsettled: set[int] = set()
        self._trimmed: dict[int, int] = {}
        """partition → the highest sequence already purged from it."""
        self._first_seen: int | None = None
        """The stream's first sequence at the last sweep (None: it was empty)."""

    def acquired(self, partition: int) -> None:
        """The partition is this replica's now: what an earlier holder finished may still be there."""
        self._held.add(partition)
        self.touched(partition)

    def touched(self, partition: int) -> None:
        """The partition had work (or was just taken over): trim it until a round finds it settled."""
        self._unsettled.add(partition)

    def forget(self, partition: int) -> None:
        self._held.discard(partition)
        self._unsettled.discard(partition)

    async def needed(self) -> bool:
        """Whether every round must trim (limits retention), rather than only sweep for what the server kept."""
        info = await self.js.stream_info(self.spec.stream)
        return info.config.retention == js_api.RetentionPolicy.LIMITS

    async def recorded(self) -> int | None:
        """The work-stream sequence up to which the history holds every message; None if it holds none yet."""
        request = json.dumps({"last_by_subj": ">"}).encode()
        reply = await self.nc.request(f"$JS.API.DIRECT.GET.{self.history}", request, timeout=5)
        if reply.headers and reply.headers.get("Status"):  # 404: an empty history, nothing recorded yet
            return None
        return recorded_up_to(reply.headers, self.spec.stream)

    async def round(self) -> None:
        if not self._unsettled:
            return
        recorded = await self.recorded()
        if recorded is None:
            return
        for partition in sorted(self._unsettled):
            _, settled = await self._trim(partition, recorded)
            if settled:
                self._unsettled.discard(partition)

    async def sweep(self) -> int:
        """Under interest retention: once the same message has stayed first in the stream for a whole sweep
        interval, purge what is finished and recorded in this replica's partitions; how many messages went."""
        state = (await self.js.stream_info(self.spec.stream)).state
        first = state.first_seq if state.messages else None
        stayed = first is not None and first == self._first_seen
        self._first_seen = first
        if first is None or not stayed or not self._held:
            return 0
        recorded = await self.recorded()
        if recorded is None:
            return 0
        purged = 0
        for partition in sorted(self._held):
            removed, _ = await self._trim(partition, recorded, gone_below=first)
            purged += removed
        if purged:
            log.warning(
                "%s kept %d message(s) from sequence %d on that their partition's durable had acknowledged and "
                "%s had recorded; removed them",
                self.spec.stream,
                purged,
                first,
                self.history,
            )
        return purged

    async def _trim(self, partition: int, recorded: int, *, gone_below: int = 0) -> tuple[int, bool]:
        """Purge what is done in one partition: how many messages went, and whether nothing is left to do there
        until new work arrives. Nothing below ``gone_below`` is in the stream any more."""
        consumer = partition_consumer(self.spec, partition)
        info = await self.js.consumer_info(self.spec.stream, consumer.durable)
        ack_floor = info.ack_floor.stream_seq if info.ack_floor and info.ack_floor.stream_seq else 0
        trimmed = max(self._trimmed.get(partition, 0), gone_below - 1)
        keep_from = purge_below(ack_floor=ack_floor, recorded=recorded, trimmed=trimmed)
        purged = 0
        if keep_from is not None:
            request = json.dumps({"filter": consumer.filter_subject, "seq": keep_from}).encode()
            reply = json.loads(
                (await self.nc.request(f"$JS.API.STREAM.PURGE.{self.spec.stream}", request, timeout=5)).data
            )
            if "error" in reply:
                log.warning(
                    "trimming %s of %s was refused: %s", consumer.filter_subject, self.spec.stream, reply["error"]
                )
                return 0, False
            self._trimmed[partition] = keep_from - 1
            purged = int(reply.get("purged") or 0)
            WORK_TRIMMED.labels(stream=self.spec.stream).inc(purged)
        return purged, not info.num_pending and not info.num_ack_pending and recorded >= ack_floor

    def _wait(self, limits: bool | None) -> float:
        """Between rounds: a limits-retention stream is trimmed often, an interest one only swept."""
        return self.interval if limits else self.sweep_interval

    async def run(self, stop: asyncio.Event) -> None:
        limits: bool | None = None
        last_failure = ""
        while not stop.is_set():
            try:
                if limits is None:
                    limits = await self.needed()
                    if limits:
                        log.info(
                            "%s has limits retention (a JetStream cluster): its consumers remove what is finished "
                            "and recorded",
                            self.spec.stream,
                        )
                await (self.round() if limits else self.sweep())
            except Exception as exc:  # a leader election, a timeout: the partitions stay unsettled, tried next round
                # Said once per kind of failure: a purge this identity may not make (an authorization from
                # before trimming) times out every round, and the stream then fills as under limits alone.
                failure = f"{type(exc).__name__}: {exc}"
                (log.debug if failure == last_failure else log.warning)(
                    "trimming %s failed (%s); trying again every %.0fs", self.spec.stream, failure, self._wait(limits)
                )
                last_failure = failure
            else:
                last_failure = ""
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self._wait(limits))
