"""``tjpipe status-server``: Trainer's TrainJob status endpoint over TLS, recorded in the history, written coalesced.

Why a process of its own and not the admission webhook's: the webhook holds no state and talks to no bus,
so any number of replicas answer the API server and a slow bus can never delay an admission; the status
server needs a NATS identity (it publishes the progress records) and Kubernetes rights the webhook has no
use for (TokenReview, reading pods, Jobs and JobSets, writing TrainJob status). Apart, each runs with only
its own rights, and a flood of progress reports cannot slow admission down.

A request is answered in Trainer's order: 413 for a body over 64 KiB (before anything is read), 403 unless
the caller is a pod of the TrainJob (``auth``), 404 when the TrainJob is gone, 429 with ``Retry-After`` when the
pod or its TrainJob is over its rate (``core.RateLimits``: one pod's flood is answered 429, every other pod and
TrainJob keeps its share), 422 for a body the CRD would refuse (``core.parse_update``), then the update is
published to ``TJ_PROGRESS`` and only once the stream has stored it is the answer 200 with the request echoed.
The TrainJob's ``status.trainerStatus`` is written afterwards by the coalescing writer: the newest update per
TrainJob, at most one write per interval.

Why the writer also reads the history back: a pending write lives in the memory of the replica that took the
update, and a kill, an OOM or a lost node between the answer and the write would leave the TrainJob showing an
older update than the history holds. So at start-up each replica reads the records of the last
``recover_seconds`` and, every ``sweep_seconds`` after, those since its previous sweep: the newest recorded update
of each TrainJob goes through the same writer, which writes it only if the live status is older (one read of
the TrainJob; a replica that finds it written already writes nothing). A replica that takes over another's
TrainJobs (the other died, or its pods now reach this one) thereby writes what the other left pending within one
sweep. 200 means recorded, so this is what "nothing accepted is lost" rests on. With NATS unreachable the
answer is 503 with ``Retry-After``: nothing was kept, and the SDK's call returns False.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import logging
import math
import time

import msgspec
import nats.errors
import nats.js.errors
from aiohttp import web
from nats.js import JetStreamContext
from prometheus_client import Counter

from contracts import streams, subjects
from contracts.messages import ObjectKey, UnsupportedVersion
from contracts.progress import STATUS_FIELD_MANAGER, ProgressReported, decode_progress, encode_progress
from contracts.resources import TRAINJOB
from plumbing import bus_history, retrying
from plumbing.kube import KubeApiError, KubeClient, KubeConfig
from plumbing.observability import REGISTRY
from plumbing.publishing import publish_stored
from plumbing.runner import started
from plumbing.tls_serving import TlsServing
from status_server import core
from status_server.auth import Authorizer, Busy, Caller, Gone, Refused
from status_server.settings import POD_RATE, TRAINJOB_RATE, StatusServerSettings

log = logging.getLogger(__name__)

UPDATES = Counter(
    "tjpipe_status_updates_total",
    "Status updates answered, by outcome: accepted (recorded), empty (no trainerStatus), or the refusal's code",
    ["outcome"],
    registry=REGISTRY,
)
RECOVERED = Counter(
    "tjpipe_status_recovered_total",
    "TrainJobs whose newest recorded update was handed to the writer by a read of the history (start-up, sweep)",
    registry=REGISTRY,
)
WRITES = Counter(
    "tjpipe_status_writes_total",
    "Writes of a TrainJob's status.trainerStatus by outcome: written, stale (a newer one is live), gone, failed",
    ["outcome"],
    registry=REGISTRY,
)

NATS_RETRY_AFTER = 5
"""``Retry-After`` of a 503 while the history is unreachable: the SDK's own interval between updates."""
PRUNE_EVERY = 1000
"""Accepted updates between two prunes of the per-TrainJob tables (finished TrainJobs leave them)."""


def _retryable(exc: BaseException) -> bool:
    if isinstance(exc, KubeApiError):
        return exc.status in (0, 409, 429) or exc.status >= 500
    return False


_WRITE_RETRY = dataclasses.replace(retrying.TRANSIENT_API_ERROR, retry_if=_retryable).with_limits(
    attempts=6, maximum=5.0
)
"""A status write that failed for now (a conflict with another writer, a 429 or 5xx): read again and write
again, a few times; then the update is put back and written at the TrainJob's next interval."""


class StatusServer:
    def __init__(
        self,
        kube: KubeClient,
        js: JetStreamContext,
        *,
        coalesce_seconds: float,
        max_token_reviews: int = core.MAX_REVIEWS,
        max_clock_skew: float = core.MAX_CLOCK_SKEW,
        pod_rate: core.Rate = POD_RATE,
        trainjob_rate: core.Rate = TRAINJOB_RATE,
    ) -> None:
        self.kube = kube
        self.max_clock_skew = max_clock_skew
        self.rates = {"pod": pod_rate, "trainjob": trainjob_rate}
        self.limits = core.RateLimits()
        self.js = js
        self.authorizer = Authorizer(kube, max_reviews=max_token_reviews)
        self.coalescer = core.Coalescer(interval=coalesce_seconds)
        self._writers: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._uids: dict[tuple[str, str], str] = {}
        self._offers = 0

    def app(self) -> web.Application:
        app = web.Application(client_max_size=core.MAX_BODY)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        return app

    async def _handle(self, request: web.Request) -> web.Response:
        key = core.route(request.path)
        if key is None or request.method != "POST":
            return _failure(404, "NotFound", "Not found")
        namespace, name = key
        if request.content_length is not None and request.content_length > core.MAX_BODY:
            return _failure(413, "RequestEntityTooLarge", "Payload too large")  # before anything is read
        try:
            caller = await self.authorizer.authorize(
                core.bearer_token(request.headers.get("Authorization", "")), namespace, name
            )
        except Refused as exc:
            log.info("refused a status update for %s/%s: %s", namespace, name, exc)
            return _failure(403, "Forbidden", "Forbidden")
        except Busy:
            return _failure(429, "TooManyRequests", "Too many requests; try again", retry_after=1)
        except Gone:
            return _failure(404, "NotFound", "Train job not found")
        except KubeApiError as exc:
            log.warning("cannot check a status update for %s/%s: %s", namespace, name, exc)
            return _failure(500, "InternalError", "Internal error")
        wait = self.limits.take(
            [
                (("pod", caller.pod_uid), self.rates["pod"]),
                (("trainjob", caller.trainjob_uid), self.rates["trainjob"]),
            ],
            time.monotonic(),
        )
        if wait:
            log.info("rate-limited a status update for %s/%s from pod %s", namespace, name, caller.pod)
            return _failure(429, "TooManyRequests", "Too many requests; try again", retry_after=wait)
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return _failure(413, "RequestEntityTooLarge", "Payload too large")
        try:
            update = core.parse_update(body, received_at=time.time(), max_skew=self.max_clock_skew)
        except core.Invalid as exc:
            return _failure(422, "Invalid", str(exc))
        if update is None:
            UPDATES.labels("empty").inc()
            return web.Response(body=core.echo(None), content_type="application/json")
        try:
            await self._record(namespace, name, caller, update)
        except (TimeoutError, nats.errors.Error, nats.js.errors.Error) as exc:
            log.warning("cannot record a status update for %s/%s: %s", namespace, name, exc)
            return _failure(
                503,
                "ServiceUnavailable",
                "The progress history is not reachable; try again",
                retry_after=NATS_RETRY_AFTER,
            )
        UPDATES.labels("accepted").inc()
        self._offer((namespace, name), caller, update)
        return web.Response(body=core.echo(update), content_type="application/json")

    async def _record(self, namespace: str, name: str, caller: Caller, update: core.Update) -> None:
        record = ProgressReported(
            trainjob=ObjectKey(namespace=namespace, name=name),
            trainjob_uid=caller.trainjob_uid,
            pod=caller.pod,
            pod_uid=caller.pod_uid,
            service_account=caller.service_account,
            trainer_status=update.status,
            received_at=time.time(),
            updated_at=update.updated_at,
        )
        data = encode_progress(record)
        # One pod's one update is one record, whoever repeats it: the id is the pod and the update's content.
        identity = hashlib.sha256(caller.pod_uid.encode() + b"\0" + core.echo(update)).hexdigest()
        await publish_stored(
            self.js,
            subjects.progress_subject(namespace, name),
            data,
            stream=streams.PROGRESS.name,
            headers={"Nats-Msg-Id": f"progress-{identity}"},
        )

    # ------------------------------------------------------------------------------------- the writer

    def _offer(self, key: tuple[str, str], caller: Caller, update: core.Update) -> None:
        self._offers += 1
        if self._offers % PRUNE_EVERY == 0:
            self.coalescer.prune(time.monotonic())
            self.limits.prune(time.monotonic(), self.rates)
            for done in [k for k, task in self._writers.items() if task.done()]:
                del self._writers[done]
                if done not in self.coalescer.jobs:
                    self._uids.pop(done, None)
        if self._uids.get(key) != caller.trainjob_uid:
            self.coalescer.forget(key)  # a new TrainJob of an old name starts afresh
            self._uids[key] = caller.trainjob_uid
        if not self.coalescer.offer(key, update):
            WRITES.labels("stale").inc()
            return
        self._start_writer(key)

    def _start_writer(self, key: tuple[str, str]) -> None:
        running = self._writers.get(key)
        if running is None or running.done():
            self._writers[key] = asyncio.create_task(self._write_loop(key), name=f"status {key[0]}/{key[1]}")

    async def _write_loop(self, key: tuple[str, str]) -> None:
        while (due := self.coalescer.due(key, time.monotonic())) is not None:
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            update = self.coalescer.take(key)
            if update is None:
                continue
            try:
                await self._write(key, update)
            except KubeApiError as exc:
                WRITES.labels("failed").inc()
                if _retryable(exc):  # the API server is away or busy: the update waits for the next interval
                    log.warning("could not write the status of TrainJob %s/%s: %s; trying again", *key, exc)
                    self.coalescer.put_back(key, update)
                else:  # refused as it is (never expected: the body was checked): kept in the history only
                    log.error("the API server refused the status of TrainJob %s/%s: %s", *key, exc)
            self.coalescer.written(key, time.monotonic())

    async def _write(self, key: tuple[str, str], update: core.Update) -> None:
        namespace, name = key
        async for attempt in _WRITE_RETRY.retrying():
            with attempt:
                raw = await self.kube.get(TRAINJOB, namespace=namespace, name=name)
                if raw is None:
                    WRITES.labels("gone").inc()
                    return
                live = core.decode_trainjob(raw)
                if live.metadata.uid != self._uids.get(key) or live.metadata.deletion_timestamp:
                    WRITES.labels("gone").inc()
                    return
                live_second = live.trainer_status_second()
                if live_second is not None and live_second >= update.second:  # newer means a later second
                    WRITES.labels("stale").inc()
                    return
                body = core.apply_body(
                    namespace,
                    name,
                    uid=live.metadata.uid,
                    resource_version=live.metadata.resource_version,
                    status=update.status,
                )
                await self.kube.apply(
                    TRAINJOB,
                    namespace=namespace,
                    name=name,
                    body=body,
                    field_manager=STATUS_FIELD_MANAGER,
                    subresource="status",
                )
                WRITES.labels("written").inc()

    # ------------------------------------------------------------------------------------ the recovery

    async def recover(self, since: float) -> int:
        """Write, through the coalescer, the newest update recorded since ``since`` (Unix seconds) of each
        TrainJob this process does not already hold a newer one of; how many TrainJobs were handed to the writer.
        The writer reads each live TrainJob and writes only over an older status of the same uid."""
        stored = await bus_history.read_stream(
            self.js, streams.PROGRESS.name, f"{subjects.PROGRESS_PREFIX}.>", start_time=since
        )
        records = []
        for message in stored:
            try:
                record = decode_progress(message.data)
            except (msgspec.MsgspecError, UnsupportedVersion):
                continue  # a newer release's record: that release's replicas write it
            records.append(record)
        handed = 0
        for key, recorded in core.newest_recorded(records).items():
            known = self._uids.get(key)
            if known is not None and known != recorded.trainjob_uid:
                continue  # this process already serves a newer TrainJob of that name
            self._uids[key] = recorded.trainjob_uid
            if self.coalescer.offer(key, recorded.update):
                handed += 1
                RECOVERED.inc()
                self._start_writer(key)
        return handed

    async def sweep(self, *, recover_seconds: float, sweep_seconds: float, stop: asyncio.Event) -> None:
        """Recover at start-up, then every ``sweep_seconds``; a sweep that fails (NATS away) is tried again at the
        next, from where the last good one started."""
        since = time.time() - recover_seconds
        while not stop.is_set():
            started_at = time.time()
            try:
                handed = await self.recover(since)
            except (TimeoutError, nats.errors.Error, nats.js.errors.Error) as exc:
                log.warning("cannot read the progress history back: %s; trying again in %.0fs", exc, sweep_seconds)
            else:
                if handed:
                    log.info("%d TrainJobs had a recorded update newer than this process knew; writing them", handed)
                # overlap by two intervals: an update recorded just before this sweep may not have been written yet
                since = started_at - 2 * self.coalescer.interval - sweep_seconds
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=sweep_seconds)

    async def drain(self, timeout: float) -> None:
        """Let the pending writes go out (each at its time), up to ``timeout``; then stop the writers."""
        tasks = [t for t in self._writers.values() if not t.done()]
        if tasks:
            await asyncio.wait(tasks, timeout=timeout)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _failure(code: int, reason: str, message: str, *, retry_after: float | None = None) -> web.Response:
    UPDATES.labels(str(code)).inc()
    headers = {"Retry-After": str(max(1, math.ceil(retry_after)))} if retry_after is not None else None
    return web.Response(
        status=code, body=core.status_body(code, reason, message), content_type="application/json", headers=headers
    )


async def run_status_server(settings: StatusServerSettings, stop: asyncio.Event) -> None:
    tls = TlsServing(settings.tls_cert, settings.tls_key)
    async with started(
        "tjpipe-status-server",
        settings,
        kube=lambda: KubeClient(KubeConfig.load(settings.kubeconfig, context=settings.kube_context)),
    ) as service:
        server = StatusServer(
            service.kube_client(),
            service.js,
            coalesce_seconds=settings.coalesce_seconds,
            max_token_reviews=settings.max_token_reviews,
            max_clock_skew=settings.max_clock_skew,
            pod_rate=settings.pod_rate,
            trainjob_rate=settings.trainjob_rate,
        )
        sweeper = asyncio.create_task(
            server.sweep(recover_seconds=settings.recover_seconds, sweep_seconds=settings.sweep_seconds, stop=stop),
            name="status history sweep",
        )
        try:
            await tls.serve(
                server.app(),
                host=settings.host,
                port=settings.port,
                health=service.health,
                stop=stop,
                cert_check_seconds=settings.cert_check_seconds,
                serving=(
                    "serving TrainJob status updates, written at most every "
                    f"{settings.coalesce_seconds:.1f}s per TrainJob,"
                ),
            )
        finally:
            sweeper.cancel()
            await asyncio.gather(sweeper, return_exceptions=True)
            with contextlib.suppress(Exception):
                await server.drain(timeout=settings.coalesce_seconds + 2)
