"""Retention and Run again on real servers: three namespaces, a policy that keeps one of them a few seconds,
the users who may (and may not) read and create TrainJobs there, and a history server that purges.

- ``mine``: the cluster's default policy (an hour). ``finished`` completed (Run again's subject), ``running``
  still runs, ``deleted`` completed and was deleted (readable until its policy expires it).
- ``short``: kept ``SHORT`` seconds after a TrainJob ended. ``lives`` runs (never expired by the policy);
  the tests end and delete TrainJobs of their own there and watch them go.
- ``theirs``: another team's namespace.

Users are ServiceAccounts of ``mine``: ``runner`` may get, list and create TrainJobs in ``mine`` and read
``short``; ``viewer`` may get and list in ``mine`` only; ``outsider`` may get, list and create in ``theirs``.
Everything is the session's real nats-server and kube-apiserver; the server purges as ``history-keeper``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as kube_client

from contracts import subjects
from contracts.messages import DeadLetter, ObjectKey, TrainJobDeleted, encode
from plumbing import bus

from .progress_support import _COMPLETE, _namespace, _publish_event, _running, bind, progress_record
from .support import Server, run_async, start_server

SHORT = 8.0
"""Seconds the ``short`` namespace keeps a TrainJob after it ended."""
RUN = kube_client.V1PolicyRule(
    api_groups=["trainer.kubeflow.org"], resources=["trainjobs"], verbs=["get", "list", "create"]
)
READ = kube_client.V1PolicyRule(api_groups=["trainer.kubeflow.org"], resources=["trainjobs"], verbs=["get", "list"])


@dataclass
class Kept:
    mine: str
    short: str
    theirs: str
    server: Server
    tokens: dict[str, str]
    """``runner``, ``viewer``, ``outsider``."""
    nats_url: str
    admin_creds: Path
    keeper_creds: Path
    kubeconfig: Path
    api: Any


async def finish(js: Any, namespace: str, name: str, *, delete: bool) -> None:
    """A TrainJob's whole record: created, running with a progress report and a dead letter, complete, and
    perhaps deleted."""
    await _publish_event(js, namespace, name, None, "1")
    await _publish_event(js, namespace, name, _running(2), "2")
    letter = DeadLetter(
        stage="applier",
        reason="permanent",
        error="JobSet.jobset.x-k8s.io is invalid",
        subject=subjects.apply_subject(namespace, name, "jobset"),
        payload=b"{}",
        dead_at=time.time(),
    )
    await js.publish(subjects.dlq_subject("applier", namespace, name), encode(letter))
    data = progress_record(namespace, name, pod=f"{name}-node-0-0", percent=100, metrics={"loss": "0.25"})
    await js.publish(subjects.progress_subject(namespace, name), data)
    await _publish_event(js, namespace, name, _COMPLETE, "3")
    if delete:
        gone = TrainJobDeleted(key=ObjectKey(namespace=namespace, name=name), uid="u", observed_at=time.time())
        await js.publish(subjects.event_subject(namespace, name), encode(gone))


async def publish(nats_url: str, creds: Path, namespace: str, name: str, *, delete: bool) -> None:
    nc = await bus.connect(nats_url, name="test-retention", creds=creds)
    try:
        await finish(nc.jetstream(), namespace, name, delete=delete)
    finally:
        await nc.close()


def _bind(rbac: kube_client.RbacAuthorizationV1Api, namespace: str, rule: Any, sa: tuple[str, str]) -> None:
    subject = kube_client.RbacV1Subject(kind="ServiceAccount", namespace=sa[0], name=sa[1])
    bind(rbac, namespace, f"trainjobs-{sa[1]}", rule, subject)


@pytest.fixture(scope="module")
def kept(kube: Any, nats_url: str, nats_credentials: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kept]:
    api = kube.api_client()
    core, rbac = kube_client.CoreV1Api(api), kube_client.RbacAuthorizationV1Api(api)
    mine, short, theirs = _namespace(core, "keep-m"), _namespace(core, "keep-s"), _namespace(core, "keep-t")
    admin = nats_credentials.seed_file("admin")

    async def fill() -> None:
        nc = await bus.connect(nats_url, name="test-retention", creds=admin)
        try:
            js = nc.jetstream()
            await finish(js, mine, "finished", delete=False)
            await finish(js, mine, "deleted", delete=True)
            await _publish_event(js, mine, "running", _running(2), "1")
            await _publish_event(js, short, "lives", _running(2), "1")
            await finish(js, theirs, "other", delete=False)
        finally:
            await nc.close()

    run_async(fill)
    tokens = {}
    for who in ("runner", "viewer", "outsider"):
        core.create_namespaced_service_account(mine, kube_client.V1ServiceAccount(metadata={"name": who}))
        request = kube_client.AuthenticationV1TokenRequest(
            spec=kube_client.V1TokenRequestSpec(audiences=[], expiration_seconds=3600)
        )
        tokens[who] = core.create_namespaced_service_account_token(who, mine, request).status.token
    _bind(rbac, mine, RUN, (mine, "runner"))
    _bind(rbac, short, READ, (mine, "runner"))
    _bind(rbac, mine, READ, (mine, "viewer"))
    _bind(rbac, theirs, RUN, (mine, "outsider"))
    folder = tmp_path_factory.mktemp("history-retention")
    policy = folder / "retention.yaml"
    policy.write_text(f"default:\n  keepFor: 1h\nnamespaces:\n  {short}:\n    keepFor: {SHORT:.0f}s\n")
    keeper = nats_credentials.seed_file("history-keeper")
    server = start_server(
        nats_url=nats_url,
        reader_creds=nats_credentials.seed_file("reader"),
        kubeconfig=Path(kube.kubeconfig),
        log_dir=folder,
        extra=("--auth-cache-seconds", "1", "--retention-policy", str(policy), "--retention-creds", str(keeper)),
    )
    try:
        yield Kept(
            mine=mine,
            short=short,
            theirs=theirs,
            server=server,
            tokens=tokens,
            nats_url=nats_url,
            admin_creds=admin,
            keeper_creds=keeper,
            kubeconfig=Path(kube.kubeconfig),
            api=api,
        )
    finally:
        server.process.stop()
        log = server.log.read_text(errors="replace")
        assert not [who for who, token in tokens.items() if token in log], "the server's log holds a token"
