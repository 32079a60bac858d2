"""The watcher process: informers on TrainJobs, both runtime kinds and JobSets, publishing to JetStream.

Runtimes and JobSets are listed before the first TrainJob event goes out, so that the first observation
of every TrainJob already carries its runtime and JobSet; publishing earlier would send the planner half a
picture. Publishing is awaited per event (the PubAck is what makes an event durable), and a publish that
fails is retried until the bus takes it: an event is never dropped on the floor, because the next
observation of a quiet TrainJob may be a long time coming.

Changes to the components a TrainJob owns are gathered for a moment before its observation goes out. The
applier writes a new TrainJob's snapshot ConfigMap and JobSet within milliseconds of each other, and one
observation holding both costs the planner and applier nothing, where one per change made the planner
send the component the watcher had not seen yet a second time. Nothing is lost by waiting: an observation
is read from the caches when it is published, so it always holds the latest of every change gathered.
TrainJob changes themselves go out at once; they are what a user waits on.

The gathering, the holding back of a half-built TrainJob and the look again at a TrainJob's deadline are
the rules of one keyed, delaying work queue (``plumbing.workqueue``), as a controller-runtime controller
puts every watched change into its work queue: the watcher keeps two of them, one that gathers component
changes into windows and one of scheduled deadline looks. Which component kinds are watched is
``contracts.components``' table; a runtime's change reaches only the TrainJobs that refer to it
(``core.TrainJobsByRuntime``), not a scan of every cached TrainJob.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

import msgspec
import nats.errors
from nats.js import JetStreamContext

from contracts import lifecycle, resources, streams, subjects, trainer
from contracts.components import WATCHED, ComponentKind, Keep
from contracts.deadlines import deadline_of
from contracts.jobset import JobSet
from contracts.kube import ConfigMap, ObjectMeta
from contracts.messages import ObjectKey, RuntimeSource, TrainJobDeleted, TrainJobObserved, encode
from contracts.trainer import TrainingRuntime, TrainJob
from contracts.values import meta, name_of, namespace_of, resource_version_of
from plumbing import bus, bus_setup, publishing, retrying, signing
from plumbing.informer import Cached, Handler, Informer, Key
from plumbing.kube import KubeClient, KubeConfig
from plumbing.observability import (
    EVENTS,
    STAGE_SECONDS,
    TRAINJOBS_ACTIVE,
    TRAINJOBS_DELETED,
    ActiveCounts,
)
from plumbing.runner import started
from plumbing.tasks import cancel_and_wait
from plumbing.workqueue import AsyncDelayingQueue, Item
from watcher import core, pacing, trim
from watcher.settings import WatcherSettings

log = logging.getLogger("watcher")

KEEP_THE_EVENT = dataclasses.replace(
    retrying.BUS_REQUEST, retry_if=lambda exc: not isinstance(exc, nats.errors.MaxPayloadError)
)
"""An event is kept through any failure of the bus (down, slow, the stream full) and published again; not
through a payload over the server's limit: retrying cannot help and would stall every TrainJob behind it."""

GATHER_SECONDS = 0.05
"""How long changes to a TrainJob's components are gathered before its observation is published."""
HALF_BUILT_HOLD_SECONDS = 2.0
"""How long a half-built TrainJob's observation waits for the other half (``core.half_built``)."""

RUNTIME_HOLD_SECONDS = 5.0
"""How long a new TrainJob whose runtime the watcher has not seen yet waits for it. Created together (one
``kubectl apply`` of both), the TrainJob's ADDED can arrive first; published at once, it would be reported
RuntimeNotFound for the moment in between, where Trainer, whose reconcile fails and is retried, says
nothing. A runtime that arrives in time publishes the TrainJob itself (``_runtime_changed``)."""
NEW_TRAINJOB = "TrainJob ADDED"
"""The cause of a new TrainJob's first observation, which alone is held for its runtime."""
JOBSET_MODIFIED = f"{resources.JOBSET.kind} MODIFIED"
"""The cause of a JobSet change, which alone may wait for the status interval (``pacing``)."""
DEADLINE_GRACE_SECONDS = 0.5
"""How long after a TrainJob's deadline the watcher looks at it again, so the deadline has surely passed."""

T = TypeVar("T")


class _Named(msgspec.Struct, frozen=True, kw_only=True):
    """Objects only known by name and owner here (PriorityClasses and owned PodGroups)."""

    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)


def _controlled_by_trainjob(obj: Any) -> bool:
    return core.controlled_by_trainjob(meta(obj).owner_references) is not None


def _named_identity(obj: _Named) -> _Named:
    return _Named(metadata=trim.identity(obj.metadata))


class Watcher:
    def __init__(
        self, settings: WatcherSettings, kube: KubeClient, js: JetStreamContext, *, signer: signing.Signer
    ) -> None:
        self.settings = settings
        self.kube = kube
        self.js = js
        self.signer = signer
        self._active: dict[Key, tuple[str, str] | None] = {}
        """Each cached TrainJob's active label (namespace, runtime), ``None`` when finished or not ours."""
        TRAINJOBS_ACTIVE.track(self._active_counts)
        namespaces: tuple[str | None, ...] = settings.namespaces or (None,)
        self.trainjobs = [
            Informer(
                kube,
                resources.TRAINJOB,
                TrainJob,
                self._on_trainjob,
                namespace=ns,
                trim=trim.trainjob,
                own_writes=core.own_status_write,
            )
            for ns in namespaces
        ]
        self.runtimes = [
            Informer(kube, resources.TRAINING_RUNTIME, TrainingRuntime, self._on_runtime, namespace=ns)
            for ns in namespaces
        ]
        self.cluster_runtimes = Informer(
            kube, resources.CLUSTER_TRAINING_RUNTIME, TrainingRuntime, self._on_cluster_runtime
        )
        # One informer per watched component kind (contracts.components) and namespace. A JobSet and a
        # runtime snapshot ConfigMap are carried in observations and kept as trim says; of every other kind,
        # which matters only as "still there, still ours", name and owners are kept. ConfigMaps are read
        # whole (only this pipeline's arrive, by their label): metadata only plus a GET per snapshot would
        # cost one more request per TrainJob, and one per TrainJob at every watcher start.
        self._listed_first: list[Informer[Any]] = []
        self.jobsets = self._component_informers("jobset", JobSet, trim.jobset, namespaces)
        self.config_maps = self._component_informers("runtime-snapshot", ConfigMap, trim.config_map, namespaces)
        self.owned = self._component_informers("identity", _Named, _named_identity, namespaces)
        self.priority_classes = Informer(kube, resources.PRIORITY_CLASS, _Named, self._ignore, trim=_named_identity)
        self._background: set[asyncio.Task[None]] = set()
        self._by_runtime = core.TrainJobsByRuntime()
        self._echoes = core.EchoGuard()
        """Which versions of each TrainJob observations went out at, to tell a safe echo (``core.EchoGuard``)."""
        self._gathered: AsyncDelayingQueue[Key, str] = AsyncDelayingQueue(window=GATHER_SECONDS)
        """TrainJobs whose components changed, with the changes, gathered to be observed once."""
        self._drift: dict[Key, set[str]] = {}
        """Per TrainJob, the changes to components its events do not carry, until an observation names them
        in its message id (``core.drift_mark``)."""
        self._counts = pacing.CountsPacing(settings.status_interval_seconds)
        """A running JobSet's changes of its Jobs' counts alone wait for the status interval (``pacing``)."""
        self._deadlines: AsyncDelayingQueue[Key, float] = AsyncDelayingQueue()
        """When to look at a TrainJob again because its deadline passes; each deadline once."""

    def _component_informers(
        self, keep: Keep, decode_as: type[T], trim_to: Callable[[T], T], namespaces: tuple[str | None, ...]
    ) -> list[Informer[T]]:
        informers: list[Informer[T]] = []
        for kind in WATCHED:
            if kind.watch is None or kind.watch.keep != keep:
                continue
            for ns in namespaces if kind.resource.namespaced else (None,):
                informer = Informer(
                    self.kube,
                    kind.resource,
                    decode_as,
                    self._on_component(kind),
                    namespace=ns,
                    keep=_controlled_by_trainjob if kind.watch.controlled_only else None,
                    trim=trim_to,
                    label_selector=kind.watch.label_selector,
                )
                informers.append(informer)
                if kind.watch.listed_first:
                    self._listed_first.append(informer)
        return informers

    # ------------------------------------------------------------------------------------------ lookups

    def _trainjob(self, key: Key) -> Cached[TrainJob] | None:
        for inf in self.trainjobs:
            if (hit := inf.cache.get(key)) is not None:
                return hit
        return None

    def _jobset(self, key: Key) -> JobSet | None:
        for inf in self.jobsets:
            hit = inf.cache.get(key)
            if hit is not None and core.controlling_trainjob(jobset := hit.obj) == key[1]:
                return jobset
        return None

    def _snapshot(self, job: TrainJob) -> ConfigMap | None:
        key = (namespace_of(job), core.snapshot_name_of(job))
        for inf in self.config_maps:
            if (hit := inf.cache.get(key)) is not None:
                return hit.obj
        return None

    def _priority_class_names(self) -> tuple[str, ...] | None:
        if not self.priority_classes.synced.is_set():
            return None
        return tuple(sorted(name for _, name in self.priority_classes.cache))

    def _runtime(self, job: TrainJob) -> tuple[TrainingRuntime | None, str]:
        ref = core.runtime_key_of(job)
        if ref is None:
            return None, ""
        kind, namespace, name = ref
        if kind == trainer.CLUSTER_TRAINING_RUNTIME_KIND:
            hit = self.cluster_runtimes.cache.get(("", name))
        else:
            hit = None
            for inf in self.runtimes:
                hit = hit or inf.cache.get((namespace, name))
        return (hit.obj if hit else None), kind

    # ----------------------------------------------------------------------------------------- handlers

    async def _on_trainjob(self, kind: str, key: Key, cached: Cached[TrainJob] | None) -> None:
        if cached is None:
            return
        job = cached.obj
        if kind == "DELETED":
            self._active.pop(key, None)
            self._by_runtime.discard(key)
            self._deadlines.forget(key)
            self._echoes.forget(key)
            self._counts.forget(key)
            self._drift.pop(key, None)
            event = TrainJobDeleted(
                key=ObjectKey(namespace=key[0], name=key[1]),
                uid=cached.uid,
                observed_at=time.time(),
                trace_id=uuid.uuid4().hex,
            )
            # Every watcher replica publishes the deletion under the same message id, and the stream takes
            # only the first: the replica whose publish was not a duplicate counts it.
            if await self._publish(key, encode(event), f"{cached.uid}/deleted", "TrainJob DELETED") and (
                lifecycle.is_ours(job)
            ):
                TRAINJOBS_DELETED.labels(key[0], lifecycle.runtime_label(job)).inc()
            return
        self._active[key] = core.active_label(job)
        self._by_runtime.put(key, core.runtime_key_of(job))
        # Our own status write: recorded in the history like any change (the job's states are read from
        # there), and planned from its status alone unless the planner's decision may have moved meanwhile.
        echo = kind == "MODIFIED" and cached.own_write and self._echoes.may_skip(key)
        if kind == "ADDED" and self._awaits_runtime(job):
            self._gather(key, NEW_TRAINJOB)  # held for its runtime (RUNTIME_HOLD_SECONDS)
            return
        await self.publish_observation(job, cause=f"TrainJob {kind}", echo=echo)

    def _awaits_runtime(self, job: TrainJob) -> bool:
        """A runtime is named, and neither it nor the TrainJob's runtime snapshot is in the caches."""
        return core.runtime_key_of(job) is not None and self._runtime(job)[0] is None and self._snapshot(job) is None

    def _active_counts(self) -> ActiveCounts | None:
        """Active TrainJobs by namespace and runtime; ``None`` until every TrainJob informer has listed."""
        if not all(inf.synced.is_set() for inf in self.trainjobs):
            return None
        return core.active_counts(self._active.values())

    def _on_component(self, component: ComponentKind) -> Handler[Any]:
        cause_kind = component.resource.kind

        async def changed(kind: str, key: Key, cached: Cached[Any] | None) -> None:
            """A component a TrainJob controls changed or went away: plan its owner again (drift repair)."""
            if cached is None or kind == "RESYNC":
                return
            owner = core.controlled_by_trainjob(meta(cached.obj).owner_references)
            if owner:
                mark = core.drift_mark(cause_kind, kind, key[1], resource_version_of(cached.obj))
                if mark is not None and self._trainjob((key[0], owner)) is not None:
                    self._drift.setdefault((key[0], owner), set()).add(mark)
                self._gather((key[0], owner), f"{cause_kind} {kind}")

        return changed

    def _gather(self, job_key: Key, cause: str) -> None:
        if self._trainjob(job_key) is None:
            return  # not (yet) a TrainJob we know: its own ADDED will carry the component
        self._gathered.add(job_key, cause)

    async def _publish_gathered(self) -> None:
        while True:
            gathered = await self._gathered.get()
            now = time.monotonic()
            ready: list[tuple[Key, TrainJob, str]] = []
            for item in gathered:
                current = self._trainjob(item.key)
                if current is None:
                    self._gathered.done(item.key)
                elif self._hold(item, current.obj, now):
                    self._gathered.done(item.key, again=True)  # look again after the next window
                elif set(item.reasons) == {JOBSET_MODIFIED} and (wait := self._counts_wait(item.key, now)) != 0:
                    # only the JobSet changed: its counts wait for their turn, or it went out already (< 0)
                    self._gathered.done(item.key, delay=wait if wait > 0 else None)
                else:
                    ready.append((item.key, current.obj, " + ".join(item.reasons)))
            try:
                # Sent together, acknowledged together: one write to the bus for the window, not one per TrainJob.
                await asyncio.gather(*(self.publish_observation(job, cause=cause) for _, job, cause in ready))
            finally:
                for job_key, _, _ in ready:
                    self._gathered.done(job_key)

    def _counts_wait(self, key: Key, now: float) -> float:
        """For a TrainJob whose JobSet alone changed: seconds its observation waits for the status interval
        (``pacing``), 0 to go out now, or -1 when the last observation already carried this JobSet."""
        jobset = self._jobset(key)
        if self._counts.carried(key, jobset):
            return -1.0
        return self._counts.wait(key, jobset, now)

    def _hold(self, item: Item[Key, str], job: TrainJob, now: float) -> bool:
        # Presence in the caches is enough for this guess, and costs no decoding (the observation decodes them).
        job_key = item.key
        snapshot_key = (job_key[0], core.snapshot_name(job_key[1]))
        half = core.half_built(
            list(item.reasons),
            has_snapshot=any(snapshot_key in inf.cache for inf in self.config_maps),
            has_jobset=any(job_key in inf.cache for inf in self.jobsets),
        )
        since = item.requeued_since if item.requeued_since is not None else now
        if half and now - since < HALF_BUILT_HOLD_SECONDS:
            return True
        return NEW_TRAINJOB in item.reasons and now - since < RUNTIME_HOLD_SECONDS and self._awaits_runtime(job)

    async def _ignore(self, kind: str, key: Key, cached: Cached[_Named] | None) -> None:
        return None

    async def _on_runtime(self, kind: str, key: Key, cached: Cached[TrainingRuntime] | None) -> None:
        await self._runtime_changed(trainer.TRAINING_RUNTIME_KIND, key, kind)

    async def _on_cluster_runtime(self, kind: str, key: Key, cached: Cached[TrainingRuntime] | None) -> None:
        await self._runtime_changed(trainer.CLUSTER_TRAINING_RUNTIME_KIND, key, kind)

    async def _runtime_changed(self, runtime_kind: str, key: Key, kind: str) -> None:
        """A runtime change matters to TrainJobs that have not started: suspended ones, or ones with no JobSet."""
        if kind == "RESYNC" or not all(inf.synced.is_set() for inf in self.trainjobs):
            return
        wanted = (runtime_kind, key[0], key[1])
        for job_key in self._by_runtime.trainjobs(wanted):
            cached = self._trainjob(job_key)
            if cached is None:
                continue
            job = cached.obj
            if core.runtime_key_of(job) != wanted:
                continue  # its runtimeRef changed: its own event, on its way, is read from the cache
            if core.is_suspended(job) or self._jobset(job_key) is None:
                await self.publish_observation(job, cause=f"{runtime_kind} {kind}")

    # ---------------------------------------------------------------------------------------- publishing

    async def publish_observation(self, job: TrainJob, *, cause: str, echo: bool = False) -> None:
        key = (namespace_of(job), name_of(job))
        self._echoes.published(key, resource_version_of(job), cause)
        runtime, runtime_kind = self._runtime(job)
        snapshot = self._snapshot(job)
        source: RuntimeSource = "live" if runtime is not None else "none"
        error = ""
        if snapshot is not None:
            runtime, error = core.runtime_from_snapshot(job, snapshot)
            source = "snapshot" if runtime is not None else "none"
        jobset = self._jobset(key)
        self._counts.published(key, jobset, echo=echo, now=time.monotonic())
        trace_id = uuid.uuid4().hex
        event = TrainJobObserved(
            trainjob=job,
            runtime=runtime,
            runtime_source=source,
            runtime_error=error,
            jobset=jobset,
            priority_classes=self._priority_class_names(),
            observed_at=time.time(),
            cause=cause,
            trace_id=trace_id,
            echo=echo,
        )
        msg_id = self._echoes.message_id(
            key,
            core.message_id(
                job,
                runtime=runtime,
                jobset=jobset,
                runtime_kind=runtime_kind,
                snapshot=snapshot,
                drift=self._drift.pop(key, ()),
            ),
            echo=echo,
        )
        if cause == core.DEADLINE_CAUSE:
            # Nothing about the objects changed, only the clock: without this the stream drops it as a repeat.
            msg_id += f";deadline={deadline_of(job)}"
        await self._publish(key, encode(event), msg_id, cause, trace_id=trace_id)
        self._schedule_deadline(job)

    def _schedule_deadline(self, job: TrainJob) -> None:
        """Look at the job again the moment its active deadline passes; nothing else would cause an event."""
        key = (namespace_of(job), name_of(job))
        deadline = deadline_of(job)
        if deadline is None:
            self._deadlines.cancel(key)
            return
        self._deadlines.schedule(key, deadline, delay=max(0.0, deadline - time.time()) + DEADLINE_GRACE_SECONDS)

    async def _report_deadlines(self) -> None:
        while True:
            for item in await self._deadlines.get():
                self._deadlines.done(item.key)
                current = self._trainjob(item.key)
                if current is not None:
                    task = asyncio.create_task(self.publish_observation(current.obj, cause=core.DEADLINE_CAUSE))
                    self._background.add(task)
                    task.add_done_callback(self._background.discard)

    async def _publish(self, key: Key, payload: bytes, msg_id: str, cause: str, *, trace_id: str = "") -> bool:
        """Publish until the stream takes it; whether it was new to the stream (not a duplicate, not too large)."""
        headers = {bus.MSG_ID: msg_id}
        if trace_id:
            headers[bus.TRACE_ID] = trace_id
        subject = subjects.event_subject(key[0], key[1])
        started = time.perf_counter()

        def retried(exc: BaseException, wait: float) -> None:
            if not publishing.is_refused(exc):  # a refusal is logged by publishing itself
                log.warning("publish of %s/%s failed (%s); retrying in %.1fs", key[0], key[1], exc, wait)

        try:
            (ack,) = await publishing.publish(
                self.js,
                [publishing.Outgoing(subject, payload, headers)],
                stream=streams.EVENTS.name,
                signer=self.signer,
                retry=KEEP_THE_EVENT,
                on_retry=retried,
            )
        except nats.errors.MaxPayloadError as exc:
            EVENTS.labels(cause=cause.split()[0], outcome="too-large").inc()
            log.error(
                "%s/%s: the event is %d bytes, over the server's max payload (%s); not published",
                key[0],
                key[1],
                len(payload),
                exc,
                extra={"trainjob": f"{key[0]}/{key[1]}"},
            )
            return False
        EVENTS.labels(cause=cause.split()[0], outcome="duplicate" if ack.duplicate else "published").inc()
        STAGE_SECONDS.labels(stage="watcher").observe(time.perf_counter() - started)
        log.info(
            "published %s/%s (%s)%s",
            key[0],
            key[1],
            cause,
            " [duplicate]" if ack.duplicate else "",
            extra={"trainjob": f"{key[0]}/{key[1]}", "trace_id": trace_id, "seq": ack.seq},
        )
        return not ack.duplicate

    # ----------------------------------------------------------------------------------------------- run

    async def run(self, stop: asyncio.Event) -> None:
        first: list[Informer[Any]] = [*self.runtimes, self.cluster_runtimes, *self._listed_first, self.priority_classes]
        # Kinds that only trigger re-plans are not waited for (Watch.listed_first).
        components: list[Informer[Any]] = [*self.jobsets, *self.config_maps, *self.owned]
        later = [inf for inf in components if inf not in first]
        tasks = [asyncio.create_task(inf.run()) for inf in (*first, *later)]
        tasks.append(asyncio.create_task(self._publish_gathered()))
        tasks.append(asyncio.create_task(self._report_deadlines()))
        try:
            for inf in first:
                await inf.synced.wait()
            tasks += [asyncio.create_task(inf.run()) for inf in self.trainjobs]
            tasks.append(asyncio.create_task(self._resync_loop()))
            log.info("watcher running", extra={"namespaces": list(self.settings.namespaces) or ["*"]})
            await stop.wait()
        finally:
            await cancel_and_wait(*tasks)

    async def _resync_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.resync_seconds)
            for inf in self.trainjobs:
                await inf.resync()


async def run_watcher(settings: WatcherSettings, stop: asyncio.Event) -> None:
    signer = signing.Signer.from_file(settings.signing_key, setting=settings.signing_key_setting)
    log.info("signing events with key %s", signer.key_id)
    async with started(
        "tjpipe-watcher",
        settings,
        kube=lambda: KubeClient(KubeConfig.load(settings.kubeconfig, context=settings.kube_context)),
    ) as service:
        await bus_setup.bind_stream(service.js, streams.EVENTS.name)
        watcher = Watcher(settings, service.kube_client(), service.js, signer=signer)
        service.health.add_check("synced", lambda: all(inf.synced.is_set() for inf in watcher.trainjobs))
        await service.health.start()
        await watcher.run(stop)
