"""How an apply message ends, written once: ``Endings.end`` ends it the one way what became of its work says (an
``Outcome``, which ``applier.service`` returns). Handed back to JetStream with a delay (``Delivery.retry``),
which records no result, since it has not ended; or, first, what the end accounts for (a finished message:
the status pacing told of a write, a condition that no longer holds cleared from the TrainJob, the TrainJob
lifecycle counts; a failed one: a Warning Event on the TrainJob and the API server's refusal as a
condition), then its result recorded on the results stream (with its metrics and its log line), then the
message acknowledged, or, a failure, dead-lettered and terminated.

The same decide-then-perform shape as the fenced write (``claim_round.decide`` answers a step, ``applier.fence``
performs it): the service decides what became of a message, this module alone ends it, and ``result_of`` says
what its result is.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from applier import errors, trainjob_condition
from applier.ledger import Ledger, seen_key
from applier.outcomes import Done
from applier.pacing import StatusPacing
from applier.trainjob_watch import TrainJobFacts
from applier.trainjobs import TrainJobs
from contracts import streams, subjects
from contracts.messages import (
    ApplyAction,
    ApplyMessage,
    ApplyResult,
    ApplyTrainJobStatus,
    DeleteComponent,
    component_of,
    encode,
)
from plumbing import bus, publishing, retrying
from plumbing.delivery import Delivery
from plumbing.observability import (
    APPLIES,
    END_TO_END,
    STAGE_SECONDS,
    TRAINJOBS_CREATED,
    UNAUTHORIZED,
    count_transitions,
)

log = logging.getLogger("applier")


@dataclass(frozen=True)
class Applied:
    """An attempt that got as far as a ``Done`` (applied, or nothing to do), with the TrainJob it verified."""

    done: Done
    facts: TrainJobFacts


Outcome = (
    Applied
    | Done
    | errors.TrainJobGone
    | errors.Unauthorized
    | errors.Held
    | errors.TransientError
    | errors.PermanentError
    | LookupError
)
"""What became of one message's work: done (``Applied``; ``Done`` when it was skipped before any attempt), or
how it did not get done (the error; ``LookupError`` for a kind the resource table does not know)."""


@dataclass(frozen=True)
class Result:
    """How a message that ends is recorded: its result's action, reason and resourceVersion; and for a failure,
    the kind of dead letter it is kept as, and the error the dead letter says."""

    action: ApplyAction
    reason: str = ""
    resource_version: str = ""
    dead_letter: str = ""
    error: str = ""


def result_of(outcome: Applied | Done | errors.TrainJobGone | errors.Unauthorized | Exception) -> Result:
    """The result a message ends with, from what became of its work (a message handed back has none)."""
    if isinstance(outcome, Applied):
        outcome = outcome.done
    if isinstance(outcome, Done):
        return Result(outcome.action, reason=outcome.reason, resource_version=outcome.resource_version)
    if isinstance(outcome, errors.TrainJobGone):
        return Result("skipped", reason=f"{outcome.why}: nothing to do")
    if isinstance(outcome, errors.Unauthorized):
        return Result("failed", reason=f"unauthorized: {outcome.why}", dead_letter="unauthorized", error=outcome.why)
    error = outcome.reason if isinstance(outcome, errors.PermanentError) else str(outcome)
    return Result("failed", reason=error, dead_letter="permanent", error=error)


class Endings:
    """Ends each message the one way its ``Outcome`` says, and does what that end accounts for."""

    def __init__(self, ledger: Ledger, trainjobs: TrainJobs, pacing: StatusPacing) -> None:
        self.ledger = ledger
        self.trainjobs = trainjobs
        self.pacing = pacing

    async def end(self, delivery: Delivery[ApplyMessage], outcome: Outcome) -> None:
        """Handed back with a delay, or: what the end accounts for, the result recorded, then the message
        acknowledged, or (a failure) dead-lettered and terminated."""
        message = delivery.message
        if isinstance(outcome, errors.SettlingRefusal) and delivery.deliveries >= errors.SETTLING_DELIVERIES:
            outcome = outcome.permanent  # a refusal the cluster did not clear by now never will
        if isinstance(outcome, errors.Held | errors.TransientError):
            delay = later(delivery, outcome)
            await delivery.retry(delay)
            return
        result = result_of(outcome)
        if isinstance(outcome, Applied):
            await self._applied(message, outcome)
        elif isinstance(outcome, errors.PermanentError):
            await self._tell(message, outcome)
        elif isinstance(outcome, errors.Unauthorized):
            UNAUTHORIZED.labels(kind=message.target.kind).inc()
        if result.dead_letter:
            trainjob = (message.trainjob.namespace, message.trainjob.name)
            await delivery.keep_dead_letter(
                reason=result.dead_letter, error=f"{message.target}: {result.error}", trainjob=trainjob
            )
        await record(delivery, result)
        if result.dead_letter:
            await delivery.terminate()
        else:
            await delivery.ack()

    async def _applied(self, message: ApplyMessage, applied: Applied) -> None:
        """What a finished message accounts for: the pacing told of a status write, a condition about its
        component cleared from the TrainJob, and the ``kubeflow_trainer_*`` counts, each made by exactly one
        applier.

        Created: the first applier to record the TrainJob's uid in the ledger (compare-and-set) counts it.
        A status change: the applier whose write made it; the write was conditional on the TrainJob version
        the planner saw without the condition, so no other write can make the same change.
        """
        done, facts = applied.done, applied.facts
        if done.action in ("created", "configured"):
            self.pacing.wrote(message)
        if done.action in ("created", "configured", "unchanged") and trainjob_condition.condition_names(
            message, facts.applier_condition
        ):
            await self.trainjobs.tell(message, trainjob_condition.ClearCondition())
        namespace = message.trainjob.namespace
        try:
            if await self.ledger.first_sight(seen_key(namespace, message.trainjob.name), facts.uid):
                TRAINJOBS_CREATED.labels(namespace, facts.runtime).inc()
        except Exception as exc:  # the bus failed just now: a metric is not worth a redelivery
            log.warning("%s: could not record the TrainJob in the ledger: %s", message.trainjob, exc)
        if isinstance(message, ApplyTrainJobStatus) and done.action in ("created", "configured"):
            count_transitions(message.transitions, namespace=namespace, runtime=facts.runtime)

    async def _tell(self, message: ApplyMessage, exc: errors.PermanentError) -> None:
        """Why a message failed for good, told on the TrainJob: a Warning Event, and the API server's refusal of
        a component (e.g. a webhook's 422) as the applier's condition."""
        await self.trainjobs.explain(message, exc.reason)
        if exc.api_reason and not isinstance(message, ApplyTrainJobStatus | DeleteComponent):
            change = trainjob_condition.SetCondition(reason=exc.api_reason, text=exc.api_message or exc.reason)
            await self.trainjobs.tell(message, change)


def later(delivery: Delivery[ApplyMessage], exc: errors.Held | errors.TransientError) -> float:
    """When a message not done for now is delivered again: when what it waits for resolves (``Held``), or,
    having failed for now, after a delay that grows per delivery."""
    if isinstance(exc, errors.Held):
        return exc.delay
    message = delivery.message
    delay = retrying.TRANSIENT_REDELIVERY.delay(delivery.deliveries)
    log.warning(
        "%s: %s; handing back to JetStream for %.0fs",
        message.target,
        exc.reason,
        delay,
        extra={"trainjob": str(message.trainjob), "trace_id": message.trace_id},
    )
    return delay


async def record(delivery: Delivery[ApplyMessage], result: Result) -> None:
    """The message's result on the results stream, its metrics and its log line."""
    message, attempts, action, reason = delivery.message, delivery.attempts, result.action, result.reason
    component = component_of(message)
    duration_ms = delivery.seconds * 1000
    published = ApplyResult(
        trainjob=message.trainjob,
        target=message.target,
        component=component,
        source_seq=message.source_seq,
        action=action,
        attempts=attempts,
        duration_ms=round(duration_ms, 3),
        resource_version=result.resource_version,
        reason=reason,
        finished_at=time.time(),
        trace_id=message.trace_id,
    )
    APPLIES.labels(kind=message.target.kind, action=action).inc()
    STAGE_SECONDS.labels(stage="applier").observe(duration_ms / 1000)
    if action in ("created", "configured", "unchanged", "deleted") and message.observed_at:
        END_TO_END.labels(kind=message.target.kind).observe(max(0.0, time.time() - message.observed_at))
    subject = subjects.result_subject(message.trainjob.namespace, message.trainjob.name, component)
    outgoing = publishing.Outgoing(subject, encode(published), {bus.TRACE_ID: message.trace_id})
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
