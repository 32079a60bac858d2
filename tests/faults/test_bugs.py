"""Regression tests for the bugs the fault tests found, one test each, all fixed.

Each test states the behaviour the pipeline promises: an unmapped kind and an oversized message are
dead-lettered, not looped on; a huge TrainJob neither kills the watch nor stalls the watcher; a bus
timeout while publishing a plan is retried, not dead-lettered; server defaults are not mistaken for
changes JobSet would refuse; a missing CRD is named as such; and a repeated observation costs no status
write.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any

import msgspec
import nats
import nats.js.api
import pytest

from contracts import streams, subjects
from contracts.messages import TrainJobObserved, decode_dead_letter, encode
from plumbing import bus_setup
from plumbing.signing import Keyring

from .support import (
    JOBSET,
    TRAINER,
    Pipeline,
    condition_of,
    converged,
    quiet,
    services_ready,
    stream_messages,
    trainjob,
    until,
)
from .test_malformed import valid_apply

pytestmark = [pytest.mark.cluster, pytest.mark.nats, pytest.mark.timeout(90)]


async def _dead_letter_for(js: Any, subject: str, *, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for raw in await stream_messages(js, streams.DLQ.name, f"{subjects.DLQ_PREFIX}.>"):
            letter = decode_dead_letter(raw.data)
            if letter.subject == subject:
                return letter
        await asyncio.sleep(0.5)
    return None


async def test_apply_for_an_unmapped_kind_is_dead_lettered(pipeline: Pipeline) -> None:
    p = pipeline
    p.start_all()
    nc = await p.connect()
    try:
        js = nc.jetstream()
        await services_ready(js)
        message = valid_apply(p.namespace, "x-widget")
        message["target"] = {
            "api_version": "example.com/v1",
            "kind": "Widget",
            "namespace": p.namespace,
            "name": "x-widget",
        }
        subject = subjects.apply_subject(p.namespace, "x-widget", "jobset")
        data = json.dumps(message).encode()
        await js.publish(subject, data, headers=p.sign_headers(subject, data))
        letter = await _dead_letter_for(js, subject, timeout=12)
        assert letter is not None, "no dead letter: " + p.processes["applier"].log_tail(5)
        assert (letter.stage, letter.reason) == ("applier", "unauthorized")  # not a component kind
    finally:
        await nc.close()


async def test_payload_just_under_the_server_max_is_dead_lettered(pipeline: Pipeline) -> None:
    p = pipeline
    p.start_all()
    nc = await p.connect()
    try:
        js = nc.jetstream()
        await services_ready(js)
        max_payload = nc.max_payload
        payload = b"[" + b"1," * ((max_payload - 4096) // 2) + b"1]"  # valid JSON, not an event, < max_payload
        assert len(payload) < max_payload
        event_subject = subjects.event_subject(p.namespace, "x-huge-event")
        apply_subject = subjects.apply_subject(p.namespace, "x-huge-apply", "jobset")
        await js.publish(event_subject, payload, headers=p.sign_headers(event_subject, payload))
        await js.publish(apply_subject, payload, headers=p.sign_headers(apply_subject, payload))
        letters = [
            await _dead_letter_for(js, event_subject, timeout=10),
            await _dead_letter_for(js, apply_subject, timeout=2),
        ]
        assert all(letters), f"dead letters: {[bool(x) for x in letters]} (event, apply)"
        assert [x.reason for x in letters] == ["undecodable", "undecodable"]
    finally:
        await nc.close()


async def test_a_large_trainjob_on_the_watch_does_not_kill_the_trainjob_informer(pipeline: Pipeline) -> None:
    p = pipeline
    p.start_all()
    nc = await p.connect()
    try:
        js = nc.jetstream()
        await services_ready(js)
        # Probes until one goes through with no watch failure since it was added: then the TrainJob informer
        # is past its list and on a watch that the fresh apiserver's watch cache no longer interrupts (429
        # "storage is (re)initializing" makes the informer relist, and a list has no line limit, so the large
        # TrainJob must come by the watch for this test to test anything). Bounded: a watch that keeps
        # failing is a failure here, not a skip.
        for attempt in range(1, 11):
            probe = f"x-probe-{attempt}"
            p.create(trainjob(probe, num_nodes=1))
            await until(lambda probe=probe: converged(p, [probe]), timeout=30, what=f"{probe}")
            await asyncio.sleep(1.0)
            if "TrainJob watch failed" not in p.log_text("watcher").split(f"{probe} (TrainJob ADDED)")[-1]:
                break
        else:
            raise AssertionError("the watcher's TrainJob watch kept failing through 10 probes")
        p.create(trainjob("x-large", trainer={"numNodes": 1, "args": ["a" * 700_000]}))  # < NATS max_payload
        await asyncio.sleep(1.0)
        p.create(trainjob("x-after-large", num_nodes=2))
        await until(
            lambda: converged(p, ["x-after-large"]), timeout=15, what="the TrainJob created after the large one"
        )
    finally:
        await nc.close()


async def test_a_trainjob_larger_than_max_payload_does_not_stall_the_watcher(pipeline: Pipeline) -> None:
    p = pipeline
    nc = await p.connect()
    try:
        chunk = "a" * 400_000  # one string may not exceed 1 MiB; together they do
        p.create(trainjob("x-big", trainer={"numNodes": 1, "args": [chunk, chunk, chunk]}))
        assert nc.max_payload < 1_200_000
        p.start_all()  # the big TrainJob is in the watcher's first list
        js = nc.jetstream()
        await services_ready(js)
        p.create(trainjob("x-after-big", num_nodes=2))
        await until(lambda: converged(p, ["x-after-big"]), timeout=15, what="the TrainJob created after the big one")
    finally:
        await nc.close()


class _PubAckTimesOut:
    """The planner's JetStream context, except that every apply publish times out once (a lost PubAck)."""

    def __init__(self, js: Any) -> None:
        self._js = js
        self.failed = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._js, name)

    async def publish_async(self, subject: str, payload: bytes = b"", **kwargs: Any) -> Any:
        if subject.startswith(subjects.APPLY_PREFIX + ".") and not self.failed:
            self.failed += 1
            future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            future.set_exception(TimeoutError())
            return future
        return await self._js.publish_async(subject, payload, **kwargs)


async def test_planner_publish_timeout_is_retried_not_dead_lettered(pipeline: Pipeline) -> None:
    from planner.service import Planner, PlannerSettings

    p = pipeline
    nc = await p.connect()
    try:
        js = nc.jetstream()
        await bus_setup.ensure_streams(js, streams.ALL_STREAMS)
        job = trainjob("x-timeout", num_nodes=2)
        job["metadata"].update(namespace=p.namespace, uid=str(uuid.uuid4()), resourceVersion="42")
        event = msgspec.convert(
            {"type": "trainjob.observed", "trainjob": job, "observed_at": time.time()}, TrainJobObserved
        )
        subject = subjects.event_subject(p.namespace, "x-timeout")
        await js.publish(subject, encode(event), headers=p.sign_headers(subject, encode(event)))
        sub = await js.pull_subscribe(
            subject, durable="x-timeout", stream=streams.EVENTS.name, config=nats.js.api.ConsumerConfig(ack_wait=3.0)
        )
        (msg,) = await sub.fetch(1, timeout=5)
        planner = Planner(
            PlannerSettings(nats_url=p.nats.url),
            _PubAckTimesOut(js),  # type: ignore[arg-type]
            signer=p.stack.keys.signer("planner"),
            trusted_events=Keyring.from_path(p.stack.keys.trusted_events, setting="trusted events"),
        )
        await planner.handle_batch([msg])  # what a partition's pull loop does with a fetched batch
        # Expected: no dead letter, and the event comes back to be planned again.
        assert await _dead_letter_for(js, subject, timeout=1) is None, "a transient publish failure was dead-lettered"
        again = await sub.fetch(1, timeout=8)
        assert again and again[0].metadata.num_delivered == 2
    finally:
        await nc.close()


async def test_a_suspended_trainjob_that_never_changed_has_no_immutable_fields_condition(pipeline: Pipeline) -> None:
    p = pipeline
    p.start_all()
    nc = await p.connect()
    try:
        js = nc.jetstream()
        await services_ready(js)
        p.create(trainjob("x-suspended", num_nodes=2, suspend=True))
        await until(lambda: p.get_or_none(JOBSET, "JobSet", "x-suspended"), timeout=30, what="the JobSet")
        await quiet(p, js)
        job = p.get(TRAINER, "TrainJob", "x-suspended")
        assert condition_of(job, "Suspended") is not None
        assert condition_of(job, "ResourcesCreated") is None, condition_of(job, "ResourcesCreated")
    finally:
        await nc.close()


async def test_an_apply_for_a_kind_whose_crd_is_missing_says_so(pipeline: Pipeline) -> None:
    from .test_malformed import refused_applies

    p = pipeline
    p.start_all()
    nc = await p.connect()
    try:
        js = nc.jetstream()
        await services_ready(js)
        victim = p.create(trainjob("h-victim", num_nodes=1, suspend=True))  # the TrainJob that justifies it
        label, subject, payload, _, _ = refused_applies(p.namespace, victim["metadata"]["uid"])[0]
        assert label == "apply: CRD not installed"
        await js.publish(subject, payload, headers=p.sign_headers(subject, payload))
        letter = await _dead_letter_for(js, subject, timeout=15)
        assert letter is not None
        assert "is the CRD installed?" in letter.error and "PodGroup" in letter.error, letter.error
    finally:
        await nc.close()


async def test_two_observations_of_the_same_version_cost_one_status_write(pipeline: Pipeline) -> None:
    from contracts.messages import decode_event, decode_result
    from planner.core import plan

    from .support import events_filter, results_filter

    p = pipeline
    p.start_all()
    nc = await p.connect()
    try:
        js = nc.jetstream()
        await services_ready(js)
        p.create(trainjob("x-same", num_nodes=1, runtime="x-no-such-runtime"))

        def not_found() -> dict[str, Any] | None:
            cond = condition_of(p.get(TRAINER, "TrainJob", "x-same"), "ResourcesCreated")
            return cond if cond and cond["reason"] == "RuntimeNotFound" else None

        before_cond = await until(not_found, timeout=30, what="RuntimeNotFound")
        w0 = await quiet(p, js)
        first = (await stream_messages(js, streams.EVENTS.name, events_filter(p.namespace, "x-same")))[0]
        event = decode_event(first.data)
        assert isinstance(event, TrainJobObserved)
        # The same TrainJob at the same resourceVersion, observed 7 s later for another cause.
        later = msgspec.structs.replace(event, observed_at=event.observed_at + 7, cause="ConfigMap ADDED")
        headers = {"Nats-Msg-Id": f"x-same-{uuid.uuid4()}", **p.sign_headers(first.subject, encode(later))}
        ack = await js.publish(first.subject, encode(later), headers=headers)
        expected = len(plan(later, source_seq=ack.seq).applies)
        assert expected >= 1

        async def done() -> bool:
            results = [
                decode_result(m.data)
                for m in await stream_messages(js, streams.RESULTS.name, results_filter(p.namespace, "x-same"))
            ]
            return sum(1 for r in results if r.source_seq == ack.seq) >= expected

        deadline = time.monotonic() + 20
        while not await done():
            assert time.monotonic() < deadline, "no results for the second observation"
            await asyncio.sleep(0.3)
        w1 = await quiet(p, js)
        after_cond = condition_of(p.get(TRAINER, "TrainJob", "x-same"), "ResourcesCreated")
        assert (w1 - w0).writes("trainjobs", "status") == 0, (w1 - w0).summary()
        assert after_cond == before_cond, (before_cond, after_cond)
    finally:
        await nc.close()
