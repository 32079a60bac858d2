"""Apply messages aimed at objects no TrainJob justifies write nothing, on the real local stack.

The messages here are signed with the planner's own key: they get past the signature check, as a plan
from a compromised or buggy planner would, and only the applier's verification against the live cluster
stands between them and the API server. Each is a way the bus could ask the applier to use its
cluster-wide rights for something no TrainJob justifies: a Secret in ``kube-system``, an existing
ConfigMap controlled by someone else or by nobody, a TrainJob managed by another controller, another
namespace, a kind that is not a component, a status for another TrainJob, the delete of a JobSet the
TrainJob does not control. Each must end in a dead letter with reason ``unauthorized``, be counted in
``tjpipe_unauthorized_total``, and cost the API server zero writes, counted from its own
``apiserver_request_total`` (SSA is verb ``APPLY``), not even an Event. A plan for a TrainJob that does not
exist or has another uid (one deleted while its plans were in flight looks just so), such as a Secret in
``kube-system`` for a TrainJob said to be there, writes nothing either, and ends ``skipped`` in the results,
with no dead letter.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import msgspec
import pytest
from faults.support import (
    JOBSET,
    TRAINER,
    Pipeline,
    condition_of,
    converged,
    dead_letters,
    metric,
    quiet,
    read_write_counts,
    results_of,
    services_ready,
    start_with_metrics,
    trainjob,
    until,
    until_async,
)

from contracts import conditions, subjects
from contracts.jobset import JobSet
from contracts.kube import ConfigMap, Secret
from contracts.messages import (
    ApplyConfigMap,
    ApplyJobSet,
    ApplyMessage,
    ApplySecret,
    ApplyTrainJobStatus,
    DeleteComponent,
    ObjectKey,
    Target,
    component_of,
    encode,
)
from contracts.trainer import TrainJob

pytestmark = [pytest.mark.cluster, pytest.mark.nats, pytest.mark.timeout(240)]


# ------------------------------------------------------------------------------------------- helpers


def owner(name: str, uid: str) -> dict[str, Any]:
    return {
        "apiVersion": TRAINER,
        "kind": "TrainJob",
        "name": name,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def config_map(namespace: str, name: str, owners: list[dict[str, Any]], data: dict[str, str]) -> ConfigMap:
    body = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": namespace, "ownerReferences": owners},
        "data": data,
    }
    return msgspec.convert(body, ConfigMap)


async def publish_signed(p: Pipeline, conn: Any, message: ApplyMessage) -> None:
    """As the planner would publish it: on its subject, signed with the stack's planner key."""
    payload = encode(message)
    subject = subjects.apply_subject(message.trainjob.namespace, message.trainjob.name, component_of(message))
    headers = {"Nats-Msg-Id": f"forged-{uuid.uuid4()}", **p.sign_headers(subject, payload)}
    ack = await conn.jetstream().publish(subject, payload, headers=headers)
    assert ack.seq


# ---------------------------------------------------------------------------------------------- test


async def test_messages_no_trainjob_justifies_write_nothing_and_are_dead_lettered(pipeline: Pipeline) -> None:
    p = pipeline
    ns = p.namespace
    ports = start_with_metrics(p)
    admin = await p.connect()
    planner_id = await p.connect("planner")
    try:
        js = admin.jetstream()
        await services_ready(js)
        real = p.create(trainjob("t-real", num_nodes=1))
        real_uid = real["metadata"]["uid"]
        kueue = p.create(trainjob("t-kueue", num_nodes=1, extra_spec={"managedBy": "kueue.x-k8s.io/multikueue"}))
        await until(lambda: converged(p, ["t-real"]), timeout=60, what="t-real's JobSet")
        real_jobset = p.get(JOBSET, "JobSet", "t-real")
        # Objects in the TrainJob's namespace it does not control: one controlled by someone else, one by nobody,
        # and a JobSet of its own name pattern with no owner at all.
        stranger = {"apiVersion": "apps/v1", "kind": "Deployment", "name": "other", "uid": str(uuid.uuid4())}
        foreign_cm = p.create(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "foreign-cm", "ownerReferences": [{**stranger, "controller": True}]},
                "data": {"k": "v"},
            }
        )
        plain_cm = p.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "plain-cm"}, "data": {}})
        orphan: dict[str, Any] = {
            "apiVersion": JOBSET,
            "kind": "JobSet",
            "metadata": {"name": "orphan-js"},
            "spec": {"replicatedJobs": real_jobset["spec"]["replicatedJobs"]},
        }
        for rjob in orphan["spec"]["replicatedJobs"]:
            rjob.pop("status", None)
        orphan_js = p.create(orphan)
        await quiet(p, js)
        before = read_write_counts(p.kube)
        kueue_before = p.get(TRAINER, "TrainJob", "t-kueue")

        job_key = ObjectKey(namespace=ns, name="t-real")
        common: dict[str, Any] = {"trainjob": job_key, "trainjob_uid": real_uid, "source_seq": 1, "source_version": 1}

        def jobset_message(namespace: str, name: str, uid: str, *, key: ObjectKey = job_key) -> ApplyJobSet:
            body = {
                "apiVersion": JOBSET,
                "kind": "JobSet",
                "metadata": {"name": name, "namespace": namespace, "ownerReferences": [owner(key.name, uid)]},
                "spec": {"replicatedJobs": real_jobset["spec"]["replicatedJobs"]},
            }
            return ApplyJobSet(
                **{**common, "trainjob": key, "trainjob_uid": uid},
                target=Target(api_version=JOBSET, kind="JobSet", namespace=namespace, name=name),
                object=msgspec.convert(body, JobSet),
            )

        def cm_message(name: str, **extra: Any) -> ApplyConfigMap:
            return ApplyConfigMap(
                **common,
                **extra,
                target=Target(api_version="v1", kind="ConfigMap", namespace=ns, name=name),
                object=config_map(ns, name, [owner("t-real", real_uid)], {"taken": "over"}),
            )

        evil_secret = msgspec.convert(
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {
                    "name": "evil",
                    "namespace": "kube-system",
                    "ownerReferences": [owner("t-real", real_uid)],
                },
                "stringData": {"token": "x"},
            },
            Secret,
        )
        failed_status = msgspec.convert(
            {
                "apiVersion": TRAINER,
                "kind": "TrainJob",
                "metadata": {"name": "t-kueue", "namespace": ns},
                "status": {
                    "conditions": [
                        {
                            "type": "Failed",
                            "status": "True",
                            "reason": "Forged",
                            "message": "x",
                            "lastTransitionTime": "2026-01-01T00:00:00Z",
                        }
                    ]
                },
            },
            TrainJob,
        )
        cases: dict[str, ApplyMessage] = {
            "a Secret in kube-system": ApplySecret(
                **common,
                target=Target(api_version="v1", kind="Secret", namespace="kube-system", name="evil"),
                object=evil_secret,
            ),
            "a Secret in kube-system, for a TrainJob said to be there": ApplySecret(
                **{**common, "trainjob": ObjectKey(namespace="kube-system", name="t-real")},
                target=Target(api_version="v1", kind="Secret", namespace="kube-system", name="evil"),
                object=evil_secret,
            ),
            "a ConfigMap controlled by someone else": cm_message("foreign-cm"),
            "a ConfigMap controlled by nobody": cm_message("plain-cm"),
            "a TrainJob that does not exist": jobset_message(
                ns, "t-ghost", str(uuid.uuid4()), key=ObjectKey(namespace=ns, name="t-ghost")
            ),
            "the TrainJob's name with another uid": jobset_message(ns, "t-real", str(uuid.uuid4())),
            "a TrainJob managed by another controller": jobset_message(
                ns, "t-kueue", kueue["metadata"]["uid"], key=ObjectKey(namespace=ns, name="t-kueue")
            ),
            "another namespace": jobset_message("default", "t-real", real_uid),
            "a kind that is not a component": ApplyConfigMap(
                **common,
                target=Target(api_version="rbac.authorization.k8s.io/v1", kind="Role", namespace=ns, name="t-real"),
                object=msgspec.structs.replace(
                    config_map(ns, "t-real", [owner("t-real", real_uid)], {}),
                    api_version="rbac.authorization.k8s.io/v1",
                    kind="Role",
                ),
            ),
            "a status for another TrainJob": ApplyTrainJobStatus(
                **common,
                target=Target(api_version=TRAINER, kind="TrainJob", namespace=ns, name="t-kueue", subresource="status"),
                object=failed_status,
            ),
            "the delete of a JobSet it does not control": DeleteComponent(
                **common,
                target=Target(api_version=JOBSET, kind="JobSet", namespace=ns, name="orphan-js"),
                reason="forged",
            ),
            "the delete of a Namespace": DeleteComponent(
                **common,
                target=Target(api_version="v1", kind="Namespace", namespace=ns, name=ns),
                reason="forged",
            ),
        }
        # A plan for a TrainJob that does not exist cannot be told from one for a TrainJob deleted while it was
        # in flight: it writes nothing, and ends skipped instead of as a dead letter.
        gone_labels = (
            "a TrainJob that does not exist",
            "the TrainJob's name with another uid",
            "a Secret in kube-system, for a TrainJob said to be there",
        )
        gone = {label: cases.pop(label) for label in gone_labels}
        for message in [*cases.values(), *gone.values()]:
            await publish_signed(p, planner_id, message)

        async def all_dead() -> bool:
            return len(await dead_letters(js, ns, "kube-system")) >= len(cases)

        await until_async(all_dead, timeout=60, what=f"{len(cases)} dead letters")
        await quiet(p, js)
        writes = (read_write_counts(p.kube) - before).all_writes()
        assert writes == {}, writes

        got = await dead_letters(js, ns, "kube-system")
        assert len(got) == len(cases), [(dl.reason, dl.error) for dl in got]
        assert {(dl.stage, dl.reason) for dl in got} == {("applier", "unauthorized")}, [dl.error for dl in got]
        unauthorized = metric(ports["applier"], "tjpipe_unauthorized_total")
        assert sum(unauthorized.values()) == len(cases), unauthorized
        results = [*await results_of(js, ns), *await results_of(js, "kube-system")]
        skipped = [r for r in results if "does not exist" in r.reason or "the message names" in r.reason]
        assert len(skipped) == len(gone), [(r.action, r.target, r.reason) for r in results]
        assert {r.action for r in skipped} == {"skipped"}, [(r.action, r.reason) for r in skipped]

        # Nothing came of them.
        assert (
            p.get("v1", "ConfigMap", "foreign-cm")["metadata"]["resourceVersion"]
            == foreign_cm["metadata"]["resourceVersion"]
        )
        assert (
            p.get("v1", "ConfigMap", "plain-cm")["metadata"]["resourceVersion"]
            == plain_cm["metadata"]["resourceVersion"]
        )
        assert p.get(JOBSET, "JobSet", "orphan-js")["metadata"]["uid"] == orphan_js["metadata"]["uid"]
        assert p.get(TRAINER, "TrainJob", "t-kueue") == kueue_before
        assert p.get_or_none(JOBSET, "JobSet", "t-ghost") is None
        assert condition_of(p.get(TRAINER, "TrainJob", "t-real"), conditions.CONDITION_COMPONENTS_APPLIED) is None

        # A plan that says the target was absent moments ago is not taken at its word either: the object is
        # read, and one the TrainJob does not control is left alone.
        before = read_write_counts(p.kube)
        await publish_signed(p, planner_id, cm_message("plain-cm", observed_absent=True, observed_at=time.time()))

        async def one_more() -> bool:
            return len(await dead_letters(js, ns, "kube-system")) > len(cases)

        await until_async(one_more, timeout=30, what="the dead letter of a write to an object seen absent")
        await quiet(p, js)
        assert (read_write_counts(p.kube) - before).all_writes() == {}
        assert {dl.reason for dl in await dead_letters(js, ns, "kube-system")} == {"unauthorized"}
        assert (
            p.get("v1", "ConfigMap", "plain-cm")["metadata"]["resourceVersion"]
            == plain_cm["metadata"]["resourceVersion"]
        )
        # And the pipeline went on: the real TrainJob still converges after all that.
        assert converged(p, ["t-real"])
    finally:
        for conn in (admin, planner_id):
            await conn.close()
