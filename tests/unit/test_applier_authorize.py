"""What a message may write: the message's own check (``applier.authorize``), the TrainJob check
(``applier.trainjobs``), the live-object and create-only checks (``applier.claim_round``,
``applier.api_answers``); the applier's condition (``applier.trainjob_condition``) and poisoned ledger claims
(``applier.poisoned_claims``).

Every message the real planner makes for every golden case must pass; each way of aiming a message at
something no TrainJob justifies must be refused.
"""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
import yaml

from applier import (
    api_answers,
    authorize,
    claim_round,
    errors,
    poisoned_claims,
    trainjob_condition,
    trainjob_watch,
    trainjobs,
)
from contracts import conditions
from contracts import messages as m
from contracts.kube import ObjectMeta, OwnerReference, Secret
from contracts.messages import ApplyMessage
from contracts.trainer import MANAGED_BY_TRAINJOB_CONTROLLER, TrainingRuntime, TrainJob
from planner.core import plan

CASES = Path(__file__).parent.parent / "golden" / "cases"


def _planned(case: Path) -> list[ApplyMessage]:
    docs = [d for d in yaml.safe_load_all((case / "input.yaml").read_text()) if d]
    job = next(d for d in docs if d["kind"] == "TrainJob")
    runtime = next(d for d in docs if d["kind"] in ("TrainingRuntime", "ClusterTrainingRuntime"))
    job.setdefault("metadata", {}).setdefault("uid", "uid-1")
    event = m.TrainJobObserved(
        trainjob=msgspec.convert(job, TrainJob),
        runtime=msgspec.convert(runtime, TrainingRuntime),
        observed_at=1_700_000_000.0,
    )
    return list(plan(event, source_seq=1).applies)


def _all_planned() -> list[ApplyMessage]:
    out: list[ApplyMessage] = []
    for case in sorted(p.parent for p in CASES.glob("*/*/input.yaml")):
        out.extend(_planned(case))
    return out


PLANNED = _all_planned()


def body(message: ApplyMessage) -> bytes:
    return b"{}" if isinstance(message, m.DeleteComponent) else msgspec.json.encode(message.object)


def verdict(message: ApplyMessage) -> errors.Verdict:
    return authorize.authorize_message(message, body(message))


def of_type(kind: type) -> ApplyMessage:
    return next(msg for msg in PLANNED if isinstance(msg, kind))


def test_every_planned_message_is_authorized() -> None:
    kinds = {type(msg) for msg in PLANNED}
    assert {m.ApplyJobSet, m.ApplyConfigMap, m.ApplySecret, m.ApplyTrainJobStatus} <= kinds
    refused = [(msg.target, verdict(msg).why) for msg in PLANNED if not verdict(msg).allowed]
    assert refused == []


def _retarget(message: ApplyMessage, **changes: object) -> ApplyMessage:
    return msgspec.structs.replace(message, target=msgspec.structs.replace(message.target, **changes))


def test_another_namespace_is_refused() -> None:
    jobset = of_type(m.ApplyJobSet)
    assert not verdict(_retarget(jobset, namespace="kube-system")).allowed


def test_a_secret_in_kube_system_is_refused() -> None:
    secret = m.ApplySecret(
        trainjob=m.ObjectKey(namespace="kube-system", name="x"),
        trainjob_uid="u",
        source_seq=1,
        target=m.Target(api_version="v1", kind="Secret", namespace="kube-system", name="evil"),
        object=msgspec.convert({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "evil"}}, Secret),
    )
    result = verdict(secret)
    assert not result.allowed
    assert "owner reference" in result.why


def test_an_unknown_kind_is_refused() -> None:
    cm = of_type(m.ApplyConfigMap)
    assert not verdict(_retarget(cm, api_version="rbac.authorization.k8s.io/v1", kind="ClusterRole")).allowed
    delete = m.DeleteComponent(
        trainjob=cm.trainjob,
        trainjob_uid=cm.trainjob_uid,
        source_seq=1,
        target=m.Target(api_version="v1", kind="Namespace", namespace=cm.trainjob.namespace, name="x"),
    )
    assert not verdict(delete).allowed
    assert verdict(
        msgspec.structs.replace(
            delete, target=msgspec.structs.replace(delete.target, api_version="jobset.x-k8s.io/v1alpha2", kind="JobSet")
        )
    ).allowed


def test_a_message_type_cannot_carry_another_kind() -> None:
    cm = of_type(m.ApplyConfigMap)
    assert not verdict(_retarget(cm, kind="Secret")).allowed  # object says ConfigMap, target says Secret


def test_the_object_must_name_the_target() -> None:
    cm = of_type(m.ApplyConfigMap)
    assert not verdict(_retarget(cm, name="someone-elses")).allowed


def _with_owners(message: ApplyMessage, owners: list[dict[str, object]]) -> ApplyMessage:
    assert not isinstance(message, m.DeleteComponent)
    assert isinstance(message.object.metadata, ObjectMeta)
    meta = msgspec.structs.replace(
        message.object.metadata, owner_references=[msgspec.convert(o, OwnerReference) for o in owners]
    )
    return msgspec.structs.replace(message, object=msgspec.structs.replace(message.object, metadata=meta))


def test_exactly_one_controller_reference_to_the_trainjob() -> None:
    jobset = of_type(m.ApplyJobSet)
    good = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "name": jobset.trainjob.name,
        "uid": jobset.trainjob_uid,
        "controller": True,
    }
    assert verdict(_with_owners(jobset, [good])).allowed
    assert not verdict(_with_owners(jobset, [])).allowed
    assert not verdict(_with_owners(jobset, [good, {**good, "uid": "other", "controller": False}])).allowed
    assert not verdict(_with_owners(jobset, [{**good, "controller": False}])).allowed
    assert not verdict(_with_owners(jobset, [{**good, "uid": "other"}])).allowed
    assert not verdict(_with_owners(jobset, [{**good, "name": "other"}])).allowed
    assert not verdict(_with_owners(jobset, [{**good, "kind": "Deployment", "apiVersion": "apps/v1"}])).allowed


def test_status_is_for_the_named_trainjob_only() -> None:
    status = of_type(m.ApplyTrainJobStatus)
    assert verdict(status).allowed
    other = msgspec.structs.replace(status, trainjob=m.ObjectKey(namespace=status.trainjob.namespace, name="other"))
    assert not verdict(other).allowed
    assert not verdict(_retarget(status, subresource=None)).allowed


def test_a_foreign_field_manager_is_refused() -> None:
    assert not verdict(msgspec.structs.replace(of_type(m.ApplyJobSet), field_manager="kube-controller-manager")).allowed


def test_trainjob_checks() -> None:
    msg = of_type(m.ApplyJobSet)
    ok = trainjob_watch.TrainJobFacts(uid=msg.trainjob_uid)
    assert trainjobs.authorize_trainjob(msg, ok).allowed
    assert trainjobs.authorize_trainjob(
        msg, trainjob_watch.TrainJobFacts(uid=msg.trainjob_uid, managed_by=MANAGED_BY_TRAINJOB_CONTROLLER)
    ).allowed
    assert not trainjobs.authorize_trainjob(msg, None).allowed
    assert not trainjobs.authorize_trainjob(msg, trainjob_watch.TrainJobFacts(uid="other")).allowed
    foreign = trainjob_watch.TrainJobFacts(uid=msg.trainjob_uid, managed_by="kueue.x-k8s.io/multikueue")
    assert "kueue" in trainjobs.authorize_trainjob(msg, foreign).why


def test_trainjob_facts_from_the_live_object() -> None:
    raw = msgspec.json.encode(
        {
            "metadata": {"uid": "u1", "resourceVersion": "42"},
            "spec": {"managedBy": "x"},
            "status": {"conditions": [{"type": conditions.CONDITION_COMPONENTS_APPLIED, "message": "JobSet j: no"}]},
        }
    )
    assert trainjob_watch.trainjob_facts(raw) == trainjob_watch.TrainJobFacts(
        uid="u1", managed_by="x", resource_version="42", applier_condition="JobSet j: no"
    )
    assert trainjob_watch.trainjob_facts(None) is None


@pytest.mark.parametrize(
    ("owners", "allowed"),
    [
        ([{"uid": "uid-1", "controller": True}], True),
        ([{"uid": "uid-1", "controller": False}], False),
        ([{"uid": "other", "controller": True, "kind": "Deployment", "name": "d"}], False),
        ([], False),
    ],
)
def test_an_existing_object_is_written_only_when_controlled(owners: list[dict[str, object]], allowed: bool) -> None:
    msg = msgspec.structs.replace(of_type(m.ApplyJobSet), trainjob_uid="uid-1")
    live = msgspec.json.encode({"metadata": {"ownerReferences": owners}})
    assert claim_round.authorize_live(msg, live).allowed is allowed
    assert claim_round.authorize_live(msg, None).allowed


def test_condition_bodies() -> None:
    msg = of_type(m.ApplyJobSet)
    body_ = msgspec.json.decode(
        trainjob_condition.applier_condition(msg, reason="Invalid", text="x" * 5000, now="2026-01-01T00:00:00Z")
    )
    assert body_["metadata"] == {
        "name": msg.trainjob.name,
        "namespace": msg.trainjob.namespace,
        "uid": msg.trainjob_uid,
    }
    (cond,) = body_["status"]["conditions"]
    assert cond["type"] == conditions.CONDITION_COMPONENTS_APPLIED and cond["status"] == "False"
    assert cond["reason"] == "Invalid"
    assert cond["message"].startswith(f"JobSet {msg.target.name}: x")
    assert len(cond["message"]) == conditions.CONDITION_MESSAGE_LIMIT
    assert trainjob_condition.condition_names(msg, cond["message"])
    assert not trainjob_condition.condition_names(msg, "ConfigMap x: y")
    assert "status" not in msgspec.json.decode(trainjob_condition.applier_condition_cleared(msg))
    assert trainjob_condition.condition_reason("") == trainjob_condition.FALLBACK_REASON
    assert trainjob_condition.condition_reason("422") == trainjob_condition.FALLBACK_REASON
    assert trainjob_condition.condition_reason("Forbidden") == "Forbidden"


def test_permanent_errors_carry_the_api_reason() -> None:
    err = errors.classify(422, "Invalid", "metadata.name: too long")
    assert isinstance(err, errors.PermanentError)
    assert (err.api_reason, err.api_message) == ("Invalid", "metadata.name: too long")


def test_claims_beyond_the_cluster() -> None:
    record = m.AppliedRecord(source_version=10**12, source_seq=1, digest="", state="applied")
    assert poisoned_claims.claim_beyond_cluster(record, cluster_revision="100")
    # A genuine claim can be newer than the target and the TrainJob (a snapshot ConfigMap, a runtime or a
    # JobSet status made it), never newer than the cluster's revision.
    fair = msgspec.structs.replace(record, source_version=100)
    assert not poisoned_claims.claim_beyond_cluster(fair, cluster_revision="100")
    assert not poisoned_claims.claim_beyond_cluster(fair, cluster_revision="150")
    assert not poisoned_claims.claim_beyond_cluster(record, cluster_revision="")
    assert poisoned_claims.stale_claim_action(100.0, 100.0 + 329, grace_seconds=330) == "hold"
    assert poisoned_claims.stale_claim_action(100.0, 100.0 + 330, grace_seconds=330) == "overwrite"


def _record(created_for: str) -> m.AppliedRecord:
    return m.AppliedRecord(source_version=1, source_seq=1, digest="d", state="applied", created_for=created_for)


def test_whose_an_existing_secret_is_comes_from_the_ledger_alone() -> None:
    """The applier may not read Secrets: a create answered 409 is judged by what the ledger says it created."""
    secret = of_type(m.ApplySecret)
    assert type(secret) in claim_round.CREATE_ONLY
    assert api_answers.existing(secret, _record(secret.trainjob_uid)) == "ours"
    assert api_answers.existing(secret, _record("an-earlier-trainjob")) == "another-trainjob"
    assert api_answers.existing(secret, _record("")) == "unrecorded"  # e.g. a record from before created_for existed
    assert api_answers.existing(secret, None) == "unrecorded"


def test_a_secret_is_not_deletable() -> None:
    """A delete reads its target first (is it the TrainJob's?), and no read of a Secret is allowed."""
    secret = of_type(m.ApplySecret)
    delete = m.DeleteComponent(
        trainjob=secret.trainjob,
        trainjob_uid=secret.trainjob_uid,
        source_seq=1,
        source_version=1,
        target=secret.target,
        reason="test",
    )
    assert not verdict(delete).allowed
    assert verdict(msgspec.structs.replace(delete, target=of_type(m.ApplyJobSet).target)).allowed
