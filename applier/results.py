"""How an apply message ends, written once: its result recorded on the results stream (with its metrics and
its log line), then the message acknowledged (``finish``), or dead-lettered and terminated (``fail``); and
the TrainJob lifecycle counts a finished message accounts for (``count_lifecycle``).

``applier.service`` decides which; a message handed back for later (``Delivery.retry``) records no result,
since it has not ended.
"""

from __future__ import annotations

import logging
import time

from applier.ledger import Ledger, seen_key
from applier.outcomes import Done
from applier.trainjob_watch import TrainJobFacts
from contracts import streams, subjects
from contracts.messages import ApplyAction, ApplyMessage, ApplyResult, ApplyTrainJobStatus, component_of, encode
from plumbing import bus, publishing
from plumbing.delivery import Delivery
from plumbing.observability import APPLIES, END_TO_END, STAGE_SECONDS, TRAINJOBS_CREATED, count_transitions

log = logging.getLogger("applier")


async def finish(
    delivery: Delivery[ApplyMessage], action: ApplyAction, *, resource_version: str = "", reason: str = ""
) -> None:
    """Done (applied, or nothing to do): the result recorded, then the message acknowledged."""
    await record(delivery, action, resource_version=resource_version, reason=reason)
    await delivery.ack()


async def fail(delivery: Delivery[ApplyMessage], *, kind: str, error: str, result: str) -> None:
    """Never to succeed: a dead letter of ``kind``, a ``failed`` result saying ``result``, and terminated."""
    message = delivery.message
    trainjob = (message.trainjob.namespace, message.trainjob.name)
    await delivery.keep_dead_letter(reason=kind, error=f"{message.target}: {error}", trainjob=trainjob)
    await record(delivery, "failed", reason=result)
    await delivery.terminate()


async def record(
    delivery: Delivery[ApplyMessage], action: ApplyAction, *, resource_version: str = "", reason: str = ""
) -> None:
    """The message's result on the results stream, its metrics and its log line."""
    message, attempts = delivery.message, delivery.attempts
    component = component_of(message)
    duration_ms = delivery.seconds * 1000
    result = ApplyResult(
        trainjob=message.trainjob,
        target=message.target,
        component=component,
        source_seq=message.source_seq,
        action=action,
        attempts=attempts,
        duration_ms=round(duration_ms, 3),
        resource_version=resource_version,
        reason=reason,
        finished_at=time.time(),
        trace_id=message.trace_id,
    )
    APPLIES.labels(kind=message.target.kind, action=action).inc()
    STAGE_SECONDS.labels(stage="applier").observe(duration_ms / 1000)
    if action in ("created", "configured", "unchanged", "deleted") and message.observed_at:
        END_TO_END.labels(kind=message.target.kind).observe(max(0.0, time.time() - message.observed_at))
    subject = subjects.result_subject(message.trainjob.namespace, message.trainjob.name, component)
    outgoing = publishing.Outgoing(subject, encode(result), {bus.TRACE_ID: message.trace_id})
    await publishing.publish(delivery.js, [outgoing], stream=streams.RESULTS.name)
    log.info(
        "%s %s (%d attempt%s, %.1f ms)%s",
        action,
        message.target,
        attempts,
        "" if attempts == 1 else "s",
        duration_ms,
        f": {reason}" if reason else "",
        extra={"trainjob": str(message.trainjob), "trace_id": message.trace_id, "action": action},
    )


async def count_lifecycle(ledger: Ledger, message: ApplyMessage, facts: TrainJobFacts, done: Done) -> None:
    """The ``kubeflow_trainer_*`` counts this message accounts for, each made by exactly one applier.

    Created: the first applier to record the TrainJob's uid in the ledger (compare-and-set) counts it.
    A status change: the applier whose write made it; the write was conditional on the TrainJob version
    the planner saw without the condition, so no other write can make the same change.
    """
    namespace = message.trainjob.namespace
    try:
        if await ledger.first_sight(seen_key(namespace, message.trainjob.name), facts.uid):
            TRAINJOBS_CREATED.labels(namespace, facts.runtime).inc()
    except Exception as exc:  # the bus failed just now: a metric is not worth a redelivery
        log.warning("%s: could not record the TrainJob in the ledger: %s", message.trainjob, exc)
    if isinstance(message, ApplyTrainJobStatus) and done.action in ("created", "configured"):
        count_transitions(message.transitions, namespace=namespace, runtime=facts.runtime)
