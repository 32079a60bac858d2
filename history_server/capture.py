"""Keeping a TrainJob's pod logs in the logs bucket: when it finishes, and when its page asks while it runs.

Why the history server captures: it already follows every TrainJob's state on the bus (its index), so it
knows when one finished without watching the cluster, and a request from a TrainJob's page reaches it with
the caller's token, which it authorizes as it does every read. Why with identities of its own for this: the
logs are read from the cluster with the server's ServiceAccount, whose RBAC adds exactly ``pods`` list,
``pods/log`` get and ``jobsets`` get to the reviews it already makes; they are written to the bucket as the
``log-keeper`` NATS identity, which may publish new objects there and do nothing else (not even read them).
The server reads them back as ``reader``. Without ``--logs-creds`` it captures nothing and serves what the
bucket holds.

What is read is decided by the live cluster alone (``history_server.logs``): the event that says a
TrainJob finished names only the TrainJob, and the pods are those of the JobSet the API server says that
TrainJob owns now. A capture that finds nothing to read (the JobSet gone, the pods deleted, the kubelet
away) is stored too, as a manifest that says what is missing and why.

Two replicas of the server may both see a TrainJob finish: each first looks for a finished capture of that
uid and skips it when there is one; in the moment both capture at once, the second manifest replaces the
first and the first's objects stay until the bucket's age limit.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import msgspec

from contracts import logs
from contracts.jobset import LABEL_JOBSET_NAME
from contracts.resources import JOBSET, Resource
from contracts.streams import LOGS, BucketSpec
from history_server import logs as core
from plumbing import object_store
from plumbing.kube import KubeApiError
from plumbing.retrying import LOG_CAPTURE

if TYPE_CHECKING:
    from nats.js import JetStreamContext

    from history_server.index import Summary
    from plumbing.kube import KubeClient

log = logging.getLogger("history_server.logs")

POD = Resource(api_version="v1", kind="Pod", plural="pods")
FINISHED = frozenset({"Complete", "Failed", "Deleted"})
"""States after which a TrainJob's logs are kept (Deleted: to say what is missing when it ended unseen)."""
CATCH_UP_SECONDS = 900.0
"""At start, TrainJobs that finished this long ago at most are captured; older ones were before this server."""
CONCURRENT = 4
"""Captures at once: each reads its pods' logs one after another."""
REQUEST_EVERY = 30.0
"""Seconds between two captures a page asks for, per TrainJob: each reads every pod's log again."""
NEWEST_LINES = 20000
"""Lines of a long log's end asked for, to keep its newest part."""


class LogKeeper:
    """Captures (``writer``: the log-keeper identity) and reads (``reader``) one cluster's kept logs."""

    def __init__(
        self,
        *,
        kube: KubeClient | None,
        reader: JetStreamContext,
        writer: JetStreamContext | None,
        cluster: str = "",
        spec: BucketSpec = LOGS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.kube = kube
        self.reader = reader
        self.writer = writer
        self.cluster = cluster
        self.spec = spec
        self.clock = clock
        self._since = clock() - CATCH_UP_SECONDS
        self._attempted: dict[str, float] = {}
        """uid → when its capture at finish began; forgotten after ``CATCH_UP_SECONDS``, when no pass can match
        the TrainJob's finish any more."""
        self._tasks: set[asyncio.Task[None]] = set()
        self._requested: dict[str, float] = {}
        self._running: dict[str, asyncio.Task[logs.LogManifest]] = {}
        self._slots = asyncio.Semaphore(CONCURRENT)
        self.captures = 0

    @property
    def captures_logs(self) -> bool:
        return self.writer is not None and self.kube is not None

    # ------------------------------------------------------------------------------------------ reading

    async def manifest(self, namespace: str, uid: str) -> logs.LogManifest | None:
        found = await object_store.get(self.reader, self.spec, logs.manifest_name(self.cluster, namespace, uid))
        if found is None or not found.complete:
            return None
        return logs.decode_manifest(found.data)

    async def text(self, piece: logs.LogPiece) -> object_store.Read | None:
        return await object_store.get(self.reader, self.spec, piece.object)

    # ---------------------------------------------------------------------------------------- capturing

    def notice(self, summaries: Iterable[Summary]) -> None:
        """After each pass over the streams: capture every TrainJob that finished since the last pass."""
        if not self.captures_logs:
            return
        since, self._since = self._since, self.clock()
        self._attempted = {u: t for u, t in self._attempted.items() if self._since - t < CATCH_UP_SECONDS}
        for s in summaries:
            if s.state_since >= since - 5.0 and s.state in FINISHED and s.uid and s.uid not in self._attempted:
                self._attempted[s.uid] = self._since
                task = asyncio.get_running_loop().create_task(self._finished(s.namespace, s.name, s.uid))
                self._tasks.add(task)  # the loop keeps a weak reference only
                task.add_done_callback(self._tasks.discard)

    async def _finished(self, namespace: str, name: str, uid: str) -> None:
        async def attempt() -> None:
            kept = await self.manifest(namespace, uid)
            if kept is None or kept.reason != "finished":
                await self.capture(namespace, name, uid, reason="finished")

        def retried(error: BaseException, wait: float) -> None:
            log.info("keeping the logs of TrainJob %s/%s: %s; again in %.1f s", namespace, name, error, wait)

        try:
            await LOG_CAPTURE.call(attempt, retried)
        except Exception as exc:  # the bus or the API server away for longer: said once, the page shows no capture
            log.warning("could not keep the logs of TrainJob %s/%s: %s: %s", namespace, name, type(exc).__name__, exc)

    def wait_before_request(self, uid: str) -> float:
        """Seconds before a page may ask for this TrainJob's logs again (0: now); counts the asking when 0."""
        now = self.clock()
        self._requested = {u: t for u, t in self._requested.items() if now - t < REQUEST_EVERY}
        if uid in self._requested:
            return REQUEST_EVERY - (now - self._requested[uid])
        self._requested[uid] = now
        return 0.0

    async def capture(self, namespace: str, name: str, uid: str, *, reason: str) -> logs.LogManifest:
        """Capture now, or join the capture of this uid already under way."""
        running = self._running.get(uid)
        if running is None:
            running = asyncio.get_running_loop().create_task(self._capture(namespace, name, uid, reason))
            self._running[uid] = running
            running.add_done_callback(lambda _: self._running.pop(uid, None))
        return await asyncio.shield(running)

    async def _capture(self, namespace: str, name: str, uid: str, reason: str) -> logs.LogManifest:
        assert self.writer is not None and self.kube is not None
        async with self._slots:
            now = self.clock()
            stamp = dt.datetime.fromtimestamp(now, tz=dt.UTC).strftime("%Y%m%dT%H%M%S.%fZ")
            pods, gone = await self._pods(namespace, name, uid)
            chosen = core.plan(pods) if gone is None else core.Plan((), (gone,), False)
            pieces: list[logs.LogPiece] = []
            missing = list(chosen.missing)
            for target in chosen.targets:
                try:
                    data, truncated = await self._read(namespace, target)
                except KubeApiError as exc:
                    missing.append(core.missing_after_error(target, exc.status, exc.message))
                    continue
                text, redacted = core.redact(data.decode("utf-8", errors="replace"))
                body = text.encode()
                object_name = logs.piece_name(self.cluster, namespace, uid, stamp, target.pod, target.container)
                await object_store.put(self.writer, self.spec, object_name, body, description=f"{namespace}/{name}")
                pieces.append(
                    logs.LogPiece(
                        pod=target.pod,
                        container=target.container,
                        object=object_name,
                        bytes=len(body),
                        replicated_job=target.replicated_job,
                        truncated=truncated,
                        redacted=redacted,
                        phase=target.phase,
                    )
                )
            if chosen.no_containers:
                missing.append(logs.MissingLog(why=logs.NO_CONTAINERS, detail="the pods ran on simulated nodes"))
            manifest = logs.LogManifest(
                cluster=self.cluster or logs.LOCAL_CLUSTER,
                namespace=namespace,
                name=name,
                uid=uid,
                captured_at=now,
                reason=reason,
                pieces=tuple(pieces),
                missing=tuple(missing),
                no_containers=chosen.no_containers,
            )
            await object_store.put(
                self.writer, self.spec, logs.manifest_name(self.cluster, namespace, uid), logs.encode_manifest(manifest)
            )
            self.captures += 1
            log.info(
                "kept the logs of TrainJob %s/%s (%s): %d container(s), %d missing",
                namespace,
                name,
                reason,
                len(pieces),
                len(missing),
            )
            return manifest

    async def _pods(self, namespace: str, name: str, uid: str) -> tuple[list[dict[str, Any]], logs.MissingLog | None]:
        """The live pods of the TrainJob's JobSet, or why there are none to ask."""
        assert self.kube is not None
        try:
            body = await self.kube.get(JOBSET, namespace=namespace, name=name)
            if body is None:
                gone = "the TrainJob's JobSet is gone, and its pods with it"
                return [], logs.MissingLog(why=logs.NO_JOBSET, detail=gone)
            jobset = json.loads(body)
            if not core.owned_by(jobset, uid):
                detail = f"JobSet {namespace}/{name} is not this TrainJob's (another TrainJob of the same name owns it)"
                return [], logs.MissingLog(why=logs.NO_JOBSET, detail=detail)
            pods: list[dict[str, Any]] = []
            selector = f"{LABEL_JOBSET_NAME}={name}"
            async for page in self.kube.list_pages(POD, namespace=namespace, label_selector=selector):
                pods += [p for p in (msgspec.json.decode(raw) for raw in page.items) if core.of_jobset(p, jobset)]
            return pods, None
        except KubeApiError as exc:
            if exc.status not in (401, 403):
                raise  # the API server away: the capture is tried again
            detail = core.redact(f"{exc.status} {exc.message}")[0][:300]
            return [], logs.MissingLog(why=logs.REFUSED, detail=detail)

    async def _read(self, namespace: str, target: core.Target) -> tuple[bytes, bool]:
        assert self.kube is not None
        path = POD.path(namespace=namespace, name=target.pod, subresource="log")
        params = {"container": target.container, "limitBytes": str(core.MOST_BYTES + 1)}
        head = (await self.kube.request("GET", path, params=params, timeout=60)).body
        if len(head) <= core.MOST_BYTES:
            return head, False
        newest = await self.kube.request(
            "GET", path, params={"container": target.container, "tailLines": str(NEWEST_LINES)}, timeout=60
        )
        return core.shortened(head, newest.body), True
