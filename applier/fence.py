"""The fenced write: claim the target in the ledger, write it on condition, then record what was written.

Each attempt runs up to a few claim rounds. A round reads the target's ledger record (a claim newer than
the plan is settled in one call to ``applier.claims``, which answers what the round does next), reads the
live target when ``claim_round.reads_live`` says so, and asks ``claim_round.decide`` what to do; this module
only performs the ``Step`` it answers, with what the step carries. Every ledger write is a compare-and-set
on the revision the round read, and a conditional apply carries the resourceVersion it read: whoever loses
either race starts the next round with a fresh read, so of two appliers holding different plans for one
target, the one with the older plan always stands down. Create-only targets (Secrets) go the same way, but
are never read: the ledger alone says whose an existing one is.

Read top to bottom, this file follows one apply: ``Fence.apply_plan`` and what its rounds read, then
``_perform``, which claims the target where the step asks for it, then each step's write as ``_perform``
meets it (a create or an apply ends with the record of what it left, ``Ledger.record_written``); the
delete, which runs no claim rounds, comes last. Every refusal of the API server that no step answers
itself is classified once, in ``apply_plan``: ``errors.TransientError`` or ``errors.PermanentError`` for
the retry tiers around it. Raises ``errors.Unauthorized`` for a target this TrainJob does not control, and
``errors.Held`` while a corrupt claim is within its grace.
"""

from __future__ import annotations

import logging
from typing import Any, assert_never

import msgspec

from applier import api_answers, claim_round, errors, objects, outcomes, secrets, steps
from applier.claims import NewerClaims, is_stale
from applier.ledger import Ledger, ledger_key
from applier.objects import resource_version
from contracts import resources
from contracts.messages import AppliedRecord, ApplySecret, DeleteComponent, ObjectApply
from contracts.values import or_default
from plumbing.kube import KubeApiError, KubeClient

log = logging.getLogger("applier")

CLAIM_ROUNDS = 5
LABEL_FIELD_MANAGER = "trainjob-pipeline-label"
"""The field manager that adds this pipeline's label to objects made before it (``Fence._label``)."""


class Fence:
    def __init__(self, kube: KubeClient, ledger: Ledger, claims: NewerClaims) -> None:
        self.kube = kube
        self.ledger = ledger
        self.claims = claims

    async def apply_plan(
        self, message: ObjectApply, resource: resources.Resource, planned: bytes, *, known_version: str = ""
    ) -> outcomes.Done:
        """One fenced apply (or create) of ``message``; ``planned`` is its encoded object, without generated
        key material, which is never part of the digest; ``known_version`` is the TrainJob's resourceVersion
        as the applier's watch last saw it (``claim_round.status_by_version``), ``""`` when not known."""
        try:
            return await self._rounds(message, resource, planned, known_version=known_version)
        except KubeApiError as exc:
            raise errors.from_api(exc) from exc

    async def _rounds(
        self, message: ObjectApply, resource: resources.Resource, planned: bytes, *, known_version: str
    ) -> outcomes.Done:
        lkey = ledger_key(message.target)
        for round_ in range(CLAIM_ROUNDS):
            read = await self._round_reads(message, resource, lkey, round_, known_version=known_version)
            if read is None:
                continue  # look again, with the claim replaced (or someone else's newer one)
            if isinstance(read, outcomes.Done):
                return read
            record, revision, live = read
            step = claim_round.decide(
                message, record, live, planned=planned, stamp=self.claims.stamp(), known_version=known_version
            )
            done = await self._perform(step, message, resource, lkey, revision)
            if done is not None:
                return done
        if type(message) in claim_round.CREATE_ONLY:
            raise errors.TransientError("the ledger record kept changing under concurrent writers")
        raise errors.TransientError("the target kept changing under concurrent writers")

    async def _round_reads(
        self, message: ObjectApply, resource: resources.Resource, lkey: str, round_: int, *, known_version: str
    ) -> tuple[AppliedRecord | None, int, bytes | None] | outcomes.Done | None:
        """What one claim round reads: the target's ledger record and revision, and the live target when
        ``claim_round.reads_live`` says so. ``Done`` when the plan is stale; ``None`` when a newer claim that
        could not stand was just replaced: look again."""
        # After a lost compare-and-set, remembering is what went wrong: ask the server.
        if round_ == 0:
            record, revision = await self.ledger.read(lkey, assume_absent=True)
        else:
            record, revision = await self.ledger.read_fresh(lkey)
        if record is not None and is_stale(record, message):
            if await self.claims.settle(message, lkey, record, revision) == "stale":
                return outcomes.Done(action="skipped", reason=outcomes.STALE_PLAN)
            return None
        target = message.target
        reads = claim_round.reads_live(message, record, known_version=known_version)
        live = await self.kube.get(resource, namespace=target.namespace, name=target.name) if reads else None
        return record, revision, live

    async def _perform(
        self, step: steps.Step, message: ObjectApply, resource: resources.Resource, lkey: str, revision: int
    ) -> outcomes.Done | None:
        """Carry out one round's step; ``None``: a compare-and-set or a conditional write lost, look again."""
        if isinstance(step, steps.Refuse):
            raise errors.Unauthorized(step.why)
        if isinstance(step, steps.Advance):
            if await self.ledger.write(lkey, step.record, revision=revision) is None:
                return None
            return outcomes.Done(
                action="unchanged", resource_version=step.resource_version, reason=outcomes.ALREADY_APPLIED
            )
        if isinstance(step, steps.Leave):
            if step.label is None:
                return outcomes.Done(action="skipped", resource_version=step.resource_version, reason=step.reason)
            labelled = await self._label(message, resource, step.label)
            return outcomes.Done(action="skipped", resource_version=labelled, reason=step.reason)
        if isinstance(step, steps.Adopt):
            return await self._adopt(step, message, resource, lkey, revision)
        if isinstance(step, steps.Write) and message.target.subresource:
            # A status is written on condition of the TrainJob version it was planned from, which orders
            # two plans of it whatever the ledger says: no claim first, only the record of what was written.
            return await self._write(step, message, resource, lkey, revision)
        # Each of the other steps claims the target first; whoever claimed it meanwhile makes this round lose.
        claimed = await self.ledger.write(lkey, step.claim, revision=revision)
        if claimed is None:
            return None
        if isinstance(step, steps.SkipStatus):
            return outcomes.Done(action="skipped", resource_version=step.resource_version, reason=outcomes.STALE_STATUS)
        if isinstance(step, steps.Create):
            return await self._create(step, message, resource, lkey, claimed)
        if isinstance(step, steps.Write):
            return await self._write(step, message, resource, lkey, claimed)
        assert_never(step)

    async def _label(self, message: ObjectApply, resource: resources.Resource, patch: bytes) -> str:
        """Label an existing ``if-absent`` object (see ``claim_round.owned_label_patch``), or one Trainer made that
        otherwise holds the plan (``live_holds.held_state``); its new resourceVersion.

        A JSON merge patch under a field manager of its own, so the label is all it claims: an apply as
        ``trainer`` with nothing but the label would drop every other field ``trainer`` owns.
        """
        target = message.target
        resp = await self.kube.merge_patch(
            resource, namespace=target.namespace, name=target.name, body=patch, field_manager=LABEL_FIELD_MANAGER
        )
        log.info("%s: labelled an existing object, which is kept as it is otherwise", target)
        return resource_version(resp.body)

    async def _adopt(
        self, step: steps.Adopt, message: ObjectApply, resource: resources.Resource, lkey: str, revision: int
    ) -> outcomes.Done | None:
        """Record a live object that already is the plan; write nothing but the label one Trainer made lacks."""
        record = step.record
        if step.label:
            labelled = await self._label(message, resource, claim_round.OWNED_LABEL_PATCH)
            record = msgspec.structs.replace(record, resource_version=labelled)
        if await self.ledger.write(lkey, record, revision=revision) is None:
            return None
        return outcomes.Done(action="unchanged", resource_version=record.resource_version, reason=outcomes.ALREADY_HELD)

    async def _create(
        self, step: steps.Create, message: ObjectApply, resource: resources.Resource, lkey: str, claimed: int
    ) -> outcomes.Done:
        """Create a create-only target as claimed. Only a 201 makes it this TrainJob's: a create answered 409
        is judged by the record as it was before the claim (``api_answers.existing``)."""
        target = message.target
        body = apply_body(message)
        try:
            resp = await self.kube.create(
                resource, namespace=target.namespace, body=body, field_manager=message.field_manager
            )
        except KubeApiError as exc:
            if exc.status != 409 or exc.reason != "AlreadyExists":
                raise
            whose = api_answers.existing(message, step.known)
            if whose == "another-trainjob":
                raise errors.Unauthorized(
                    f"existing {target} was created for another TrainJob (uid {step.claim.created_for}),"
                    f" not for {message.trainjob}"
                ) from exc
            record = msgspec.structs.replace(step.claim, state="applied")
            reason = outcomes.ALREADY_CREATED if whose == "ours" else api_answers.UNRECORDED
            done = outcomes.Done(action="skipped", reason=reason)
        else:
            after = resource_version(resp.body)
            record = msgspec.structs.replace(
                step.claim, state="applied", resource_version=after, created_for=message.trainjob_uid
            )
            done = outcomes.Done(action="created", resource_version=after)
        await self.ledger.record_written(lkey, record, revision=claimed)
        return done

    async def _write(
        self, step: steps.Write, message: ObjectApply, resource: resources.Resource, lkey: str, claimed: int
    ) -> outcomes.Done | None:
        """Apply the plan as claimed (``claimed``: the claim's revision; for a status, the revision the round
        read), and record what the apply left."""
        target = message.target
        body = apply_body(message, resource_version=step.precondition)
        try:
            resp = await self.kube.apply(
                resource,
                namespace=target.namespace,
                name=target.name,
                body=body,
                field_manager=message.field_manager,
                force=message.force,
                subresource=target.subresource,
            )
        except KubeApiError as exc:
            return await self._after_refusal(exc, message, resource, precondition=step.precondition, before=step.before)
        after = resource_version(resp.body)
        done = msgspec.structs.replace(
            step.claim,
            state="applied",
            resource_version=after,
            managed=claim_round.managed_digest(
                resp.body, manager=message.field_manager, subresource=target.subresource
            ),
        )
        await self.ledger.record_written(lkey, done, revision=claimed, claimed=not target.subresource)
        return outcomes.Done(
            action=api_answers.outcome(resp.status, before=step.before, after=after), resource_version=after
        )

    async def _after_refusal(
        self, exc: KubeApiError, message: ObjectApply, resource: resources.Resource, *, precondition: str, before: str
    ) -> outcomes.Done | None:
        """Do what ``api_answers.refused_write`` decides for a refused apply; ``None``: the next claim round."""
        refusal = api_answers.refused_write(exc.status, message, precondition=precondition)
        if refusal == "stale-status":
            return outcomes.Done(action="skipped", resource_version=before, reason=outcomes.STALE_STATUS)
        if refusal == "look-again":
            return None
        if refusal == "skip-if-created-concurrently":
            target = message.target
            raw = await self.kube.get(resource, namespace=target.namespace, name=target.name)
            if raw is not None:
                rv = objects.read(raw).metadata.resourceVersion
                return outcomes.Done(action="skipped", resource_version=rv, reason=outcomes.CREATED_CONCURRENTLY)
        raise exc

    async def delete(self, message: DeleteComponent, resource: resources.Resource) -> outcomes.Done:
        """Delete a component the plan no longer has, if this TrainJob controls it; fenced like an apply."""
        target = message.target
        lkey = ledger_key(target)
        record, revision = await self.ledger.read_fresh(lkey)
        if record is not None and is_stale(record, message):
            settled = await self.claims.settle(message, lkey, record, revision)
            if settled == "stale":
                return outcomes.Done(action="skipped", reason=outcomes.STALE_PLAN)
            if settled == "changed":
                raise errors.TransientError("the ledger record changed while a newer claim was being replaced")
        try:
            raw = await self.kube.get(resource, namespace=target.namespace, name=target.name)
            if raw is None:
                return outcomes.Done(action="skipped", reason="already gone")
            verdict = claim_round.authorize_live(message, raw)
            if not verdict.allowed:
                raise errors.Unauthorized(verdict.why)
            await self.kube.delete(resource, namespace=target.namespace, name=target.name)
        except KubeApiError as exc:
            raise errors.from_api(exc) from exc
        return outcomes.Done(action="deleted", reason=message.reason)


def apply_body(message: ObjectApply, *, resource_version: str = "") -> bytes:
    """The apply body: generated key material is made here, now; never stored, published or logged.

    With ``resource_version`` the apply is conditional: the API server refuses it (409) if the object
    changed since that version was read.
    """
    obj: Any = message.object
    if isinstance(message, ApplySecret) and message.generate is not None:
        data = dict(or_default(message.object.data, {}))
        data.update(secrets.generated_data(message.generate, trainjob_name=message.trainjob.name))
        obj = msgspec.structs.replace(message.object, data=data)
    if resource_version:
        meta = msgspec.structs.replace(obj.metadata, resource_version=resource_version)
        obj = msgspec.structs.replace(obj, metadata=meta)
    return msgspec.json.encode(obj)
