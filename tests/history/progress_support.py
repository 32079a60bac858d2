"""A TrainJob's whole story recorded as the pipeline and the status server record it, a second namespace its
reader may not read, and a history server of their own that calls a job stalled after a few seconds.

``gamma`` is created, runs, reports its training progress (progress, a falling loss, a rising accuracy, an
ETA) and completes with Trainer's reason ``AllJobsCompleted``; one of its status writes was skipped as stale.
``delta`` runs and has reported once: the stalled flag's subject. ``hidden`` lives in another namespace.
Everything is on the session's real nats-server and kube-apiserver; the readers are ServiceAccounts.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as kube_client

from applier.outcomes import STALE_STATUS
from contracts import subjects
from contracts.messages import ApplyResult, ObjectKey, Target, component_of, encode
from contracts.progress import ProgressReported, encode_progress
from contracts.trainer import Metric, TrainerStatus
from planner.core import plan
from plumbing import bus

from .support import Server, _event, run_async, start_server

READ_TRAINJOBS = kube_client.V1PolicyRule(
    api_groups=["trainer.kubeflow.org"], resources=["trainjobs"], verbs=["get", "list"]
)
STALLED_AFTER = 4.0
"""The servers' ``--stalled-after``: short, so a test sees a job go stalled."""

LOSS = (2.31, 1.72, 1.20, 0.86, 0.61, 0.45, 0.37, 0.31)
ACCURACY = (0.11, 0.34, 0.52, 0.66, 0.74, 0.79, 0.82, 0.84)


@dataclass
class Story:
    namespace: str
    other: str
    """A namespace the viewer may not read, holding ``hidden``."""
    server: Server
    tokens: dict[str, str]
    """``viewer`` (may get and list TrainJobs in ``namespace``), ``outsider`` (a ServiceAccount bound nowhere)."""
    nats_url: str
    admin_creds: Path
    reader_creds: Path


def progress_record(namespace: str, name: str, *, pod: str, percent: int, metrics: dict[str, str]) -> bytes:
    now = time.time()
    status = TrainerStatus(
        progress_percentage=percent,
        estimated_remaining_seconds=int((100 - percent) * 3),
        metrics=[Metric(name=k, value=v) for k, v in metrics.items()],
        last_updated_time=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)),
    )
    record = ProgressReported(
        trainjob=ObjectKey(namespace=namespace, name=name),
        trainjob_uid=f"uid-{namespace}-{name}",
        pod=pod,
        service_account="default",
        trainer_status=status,
        received_at=now,
        updated_at=float(int(now)),
    )
    return encode_progress(record)


def _running(nodes: int) -> dict[str, Any]:
    return {"jobsStatus": [{"name": "node", "active": nodes}]}


_COMPLETE = {
    "conditions": [
        {
            "type": "Complete",
            "status": "True",
            "reason": "AllJobsCompleted",
            "message": "jobset completed successfully",
            "lastTransitionTime": "2026-01-01T00:10:00Z",
        }
    ],
    "jobsStatus": [{"name": "node", "active": 0, "succeeded": 2}],
}


async def _publish_event(js: Any, namespace: str, name: str, status: dict[str, Any] | None, rv: str) -> int:
    event = _event(namespace, name, nodes=2, status=status, rv=rv)
    seq: int = (await js.publish(subjects.event_subject(namespace, name), encode(event))).seq
    for message in plan(event, source_seq=seq).applies:
        component = component_of(message)
        await js.publish(subjects.apply_subject(namespace, name, component), encode(message))
        result = ApplyResult(
            trainjob=ObjectKey(namespace=namespace, name=name),
            target=message.target,
            component=component,
            source_seq=seq,
            action="created" if status is None else "unchanged",
            attempts=1,
            duration_ms=7.0,
            finished_at=time.time(),
        )
        await js.publish(subjects.result_subject(namespace, name, component), encode(result))
    return seq


async def record_story(js: Any, namespace: str, other: str) -> None:
    await _publish_event(js, namespace, "gamma", None, "1")
    await asyncio.sleep(0.4)
    running = await _publish_event(js, namespace, "gamma", _running(2), "2")
    for i, (loss, accuracy) in enumerate(zip(LOSS, ACCURACY, strict=True)):
        await asyncio.sleep(0.25)
        metrics = {"loss": f"{loss}", "accuracy": f"{accuracy}"}
        if i == 0:
            metrics["phase"] = "=warmup"  # not a number: left out of the chart, and no formula in a spreadsheet
        data = progress_record(namespace, "gamma", pod="gamma-node-0-0", percent=(i + 1) * 12, metrics=metrics)
        await js.publish(subjects.progress_subject(namespace, "gamma"), data)
    # A status planned from an older observation, refused by the applier as stale: left as it was, not a success.
    stale = ApplyResult(
        trainjob=ObjectKey(namespace=namespace, name="gamma"),
        target=Target(
            api_version="trainer.kubeflow.org/v1alpha1",
            kind="TrainJob",
            namespace=namespace,
            name="gamma",
            subresource="status",
        ),
        component="trainjob-status",
        source_seq=running,
        action="skipped",
        attempts=1,
        duration_ms=3.0,
        reason=STALE_STATUS,
        finished_at=time.time(),
    )
    await js.publish(subjects.result_subject(namespace, "gamma", "trainjob-status"), encode(stale))
    await asyncio.sleep(0.3)
    await _publish_event(js, namespace, "gamma", _COMPLETE, "3")

    await _publish_event(js, namespace, "delta", _running(1), "1")
    await _publish_event(js, other, "hidden", _running(1), "1")
    data = progress_record(other, "hidden", pod="hidden-node-0-0", percent=50, metrics={"loss": "0.5"})
    await js.publish(subjects.progress_subject(other, "hidden"), data)


async def publish_progress(nats_url: str, creds: Path, namespace: str, name: str, **fields: Any) -> None:
    nc = await bus.connect(nats_url, name="test-progress", creds=creds)
    try:
        await nc.jetstream().publish(
            subjects.progress_subject(namespace, name), progress_record(namespace, name, **fields)
        )
    finally:
        await nc.close()


def _bind_viewer(rbac: kube_client.RbacAuthorizationV1Api, namespace: str) -> None:
    subject = kube_client.RbacV1Subject(kind="ServiceAccount", name="viewer", namespace=namespace)
    bind(rbac, namespace, "trainjob-reader", READ_TRAINJOBS, subject)


def bind(
    rbac: kube_client.RbacAuthorizationV1Api, namespace: str, name: str, rule: Any, subject: kube_client.RbacV1Subject
) -> None:
    """A Role ``name`` in ``namespace`` with ``rule``, bound to ``subject``."""
    rbac.create_namespaced_role(
        namespace, kube_client.V1Role(metadata=kube_client.V1ObjectMeta(name=name), rules=[rule])
    )
    rbac.create_namespaced_role_binding(
        namespace,
        kube_client.V1RoleBinding(
            metadata=kube_client.V1ObjectMeta(name=name),
            role_ref=kube_client.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="Role", name=name),
            subjects=[subject],
        ),
    )


def _namespace(core: kube_client.CoreV1Api, prefix: str) -> str:
    name = f"{prefix}-{secrets.token_hex(3)}"
    core.create_namespace(kube_client.V1Namespace(metadata=kube_client.V1ObjectMeta(name=name)))
    return name


@pytest.fixture(scope="module")
def story(kube: Any, nats_url: str, nats_credentials: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Story]:
    api = kube.api_client()
    core, rbac = kube_client.CoreV1Api(api), kube_client.RbacAuthorizationV1Api(api)
    namespace, other = _namespace(core, "hist-p"), _namespace(core, "hist-q")
    admin = nats_credentials.seed_file("admin")

    async def fill() -> None:
        nc = await bus.connect(nats_url, name="test-history-progress", creds=admin)
        try:
            await record_story(nc.jetstream(), namespace, other)
        finally:
            await nc.close()

    run_async(fill)
    tokens = {}
    for who in ("viewer", "outsider"):
        core.create_namespaced_service_account(namespace, kube_client.V1ServiceAccount(metadata={"name": who}))
        request = kube_client.AuthenticationV1TokenRequest(
            spec=kube_client.V1TokenRequestSpec(audiences=[], expiration_seconds=3600)
        )
        tokens[who] = core.create_namespaced_service_account_token(who, namespace, request).status.token
    _bind_viewer(rbac, namespace)
    server = start_server(
        nats_url=nats_url,
        reader_creds=nats_credentials.seed_file("reader"),
        kubeconfig=Path(kube.kubeconfig),
        log_dir=tmp_path_factory.mktemp("history-server-progress"),
        extra=("--auth-cache-seconds", "1", "--stalled-after", str(STALLED_AFTER)),
    )
    try:
        yield Story(
            namespace=namespace,
            other=other,
            server=server,
            tokens=tokens,
            nats_url=nats_url,
            admin_creds=admin,
            reader_creds=nats_credentials.seed_file("reader"),
        )
    finally:
        server.process.stop()
        log = server.log.read_text(errors="replace")
        assert not [who for who, token in tokens.items() if token in log], "the server's log holds a token"
