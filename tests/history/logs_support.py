"""Finished and running TrainJobs whose pod logs a history server of their own keeps, on the session's real
nats-server and kube-apiserver (no node: the apiserver runs no pod, as on the simulated cluster).

In namespace ``namespace``, each TrainJob recorded on the bus as the pipeline records it, and its JobSet and
pods created in the apiserver as JobSet's controller and a node would leave them:

* ``sim`` finished on a simulated cluster: its pod ran (Succeeded) and no container of it has an id;
* ``lost`` finished, its pod's container ran (it has an id) on a node whose kubelet does not answer (a Node
  object whose kubelet port nothing listens on);
* ``gone`` finished, and its JobSet is gone (deleted with its pods);
* ``run`` runs (its page may ask for its logs now);
* ``done`` finished, and its log was kept before this server started (written to the bucket as the log-keeper
  writes it), so a tail, a download and the export have text to show.

Readers: ``viewer`` (may get and list TrainJobs in ``namespace``), ``stranger`` (may in ``other`` only).
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as kube_client

from contracts import logs, streams
from plumbing import bus, object_store
from tjpipe.local.procs import free_port

from .progress_support import _COMPLETE, _publish_event, _running
from .support import Server, get, run_async, start_server

READ_TRAINJOBS = kube_client.V1PolicyRule(
    api_groups=["trainer.kubeflow.org"], resources=["trainjobs"], verbs=["get", "list"]
)
DONE_LOG = "".join(f"step {i}/12 loss {1.0 / i:.3f}\n" for i in range(1, 13)) + "done: loss 0.083\n"
FINISHED = ("sim", "lost", "gone", "done")


@dataclass
class Kept:
    namespace: str
    other: str
    server: Server
    tokens: dict[str, str]
    api: Any

    def logs(self, name: str, who: str = "viewer") -> dict[str, Any]:
        status, body, _ = get(
            f"{self.server.url}/api/v1/namespaces/{self.namespace}/trainjobs/{name}/logs", self.tokens[who]
        )
        assert status == 200, body
        answer: dict[str, Any] = json.loads(body)
        return answer


def uid(namespace: str, name: str) -> str:
    """The uid ``tests/history/support._event`` gives a recorded TrainJob."""
    return f"uid-{namespace}-{name}"


def _jobset(namespace: str, name: str) -> dict[str, Any]:
    template = {"spec": {"template": {"spec": {"containers": [{"name": "node", "image": "trainer:test"}]}}}}
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {
            "name": name,
            "ownerReferences": [
                {
                    "apiVersion": "trainer.kubeflow.org/v1alpha1",
                    "kind": "TrainJob",
                    "name": name,
                    "uid": uid(namespace, name),
                    "controller": True,
                }
            ],
        },
        "spec": {"replicatedJobs": [{"name": "node", "replicas": 1, "template": template}]},
    }


def _pod(
    core: kube_client.CoreV1Api, namespace: str, name: str, jobset_uid: str, *, container_id: str, node: str = ""
) -> None:
    """A pod of the JobSet as a node leaves it once it ran: Succeeded, with (or, on kwok, without) a container id."""
    pod = f"{name}-node-0-0"
    labels = {
        "jobset.sigs.k8s.io/jobset-name": name,
        "jobset.sigs.k8s.io/jobset-uid": jobset_uid,
        "jobset.sigs.k8s.io/replicatedjob-name": "node",
    }
    core.create_namespaced_pod(
        namespace,
        {
            "metadata": {"name": pod, "labels": labels},
            "spec": {"containers": [{"name": "node", "image": "trainer:test"}], **({"nodeName": node} if node else {})},
        },
    )
    container: dict[str, Any] = {
        "name": "node",
        "image": "trainer:test",
        "imageID": "",
        "ready": False,
        "restartCount": 0,
        "state": {"terminated": {"exitCode": 0, "reason": "Completed"}},
    }
    if container_id:
        container["containerID"] = container_id
    core.patch_namespaced_pod_status(
        pod, namespace, {"status": {"phase": "Succeeded", "containerStatuses": [container]}}
    )


def _unreachable_node(core: kube_client.CoreV1Api) -> str:
    """A Node whose kubelet is at a loopback port nothing listens on: the API server cannot reach it for logs."""
    name = f"logs-unreachable-{secrets.token_hex(3)}"
    status = {
        "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": free_port()}},
    }
    core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}, "status": status})
    return name


def _bind(rbac: kube_client.RbacAuthorizationV1Api, namespace: str, account: str) -> None:
    rbac.create_namespaced_role(
        namespace, kube_client.V1Role(metadata=kube_client.V1ObjectMeta(name="trainjob-reader"), rules=[READ_TRAINJOBS])
    )
    rbac.create_namespaced_role_binding(
        namespace,
        kube_client.V1RoleBinding(
            metadata=kube_client.V1ObjectMeta(name="trainjob-reader"),
            role_ref=kube_client.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="Role", name="trainjob-reader"),
            subjects=[kube_client.RbacV1Subject(kind="ServiceAccount", name=account, namespace=namespace)],
        ),
    )


def _token(core: kube_client.CoreV1Api, namespace: str, account: str) -> str:
    core.create_namespaced_service_account(namespace, kube_client.V1ServiceAccount(metadata={"name": account}))
    request = kube_client.AuthenticationV1TokenRequest(
        spec=kube_client.V1TokenRequestSpec(audiences=[], expiration_seconds=3600)
    )
    return str(core.create_namespaced_service_account_token(account, namespace, request).status.token)


async def _keep_done_log(nats_url: str, creds: Path, namespace: str) -> None:
    """``done``'s log and manifest, written as the log-keeper identity writes them."""
    nc = await bus.connect(nats_url, name="test-log-keeper", creds=creds)
    try:
        js = nc.jetstream()
        name = logs.piece_name(
            "", namespace, uid(namespace, "done"), "20261207T060000.000000Z", "done-node-0-0", "node"
        )
        await object_store.put(js, streams.LOGS, name, DONE_LOG.encode())
        piece = logs.LogPiece(
            pod="done-node-0-0",
            container="node",
            object=name,
            bytes=len(DONE_LOG),
            replicated_job="node",
            phase="Succeeded",
        )
        manifest = logs.LogManifest(
            cluster=logs.LOCAL_CLUSTER,
            namespace=namespace,
            name="done",
            uid=uid(namespace, "done"),
            captured_at=time.time(),
            reason="finished",
            pieces=(piece,),
        )
        manifest_name = logs.manifest_name("", namespace, uid(namespace, "done"))
        await object_store.put(js, streams.LOGS, manifest_name, logs.encode_manifest(manifest))
    finally:
        await nc.close()


@pytest.fixture(scope="module")
def kept_logs(
    kube: Any, nats_url: str, nats_credentials: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Kept]:
    api = kube.api_client()
    core, rbac = kube_client.CoreV1Api(api), kube_client.RbacAuthorizationV1Api(api)
    custom = kube_client.CustomObjectsApi(api)
    namespace, other = (f"{prefix}-{secrets.token_hex(3)}" for prefix in ("hist-logs", "hist-elsewhere"))
    for ns in (namespace, other):
        core.create_namespace(kube_client.V1Namespace(metadata=kube_client.V1ObjectMeta(name=ns)))
    tokens = {"viewer": _token(core, namespace, "viewer"), "stranger": _token(core, other, "stranger")}
    _bind(rbac, namespace, "viewer")
    _bind(rbac, other, "stranger")
    node = _unreachable_node(core)
    for name, container_id in (("sim", ""), ("lost", "containerd://4b1d"), ("run", "")):
        made = custom.create_namespaced_custom_object(
            "jobset.x-k8s.io", "v1alpha2", namespace, "jobsets", _jobset(namespace, name)
        )
        _pod(
            core, namespace, name, made["metadata"]["uid"], container_id=container_id, node=node if container_id else ""
        )

    async def fill() -> None:
        nc = await bus.connect(nats_url, name="test-history-logs", creds=nats_credentials.seed_file("admin"))
        try:
            js = nc.jetstream()
            for name in FINISHED:
                await _publish_event(js, namespace, name, None, "1")
                await _publish_event(js, namespace, name, _COMPLETE, "2")
            await _publish_event(js, namespace, "run", _running(1), "1")
            await _publish_event(js, other, "theirs", _running(1), "1")
        finally:
            await nc.close()

    run_async(fill)
    run_async(lambda: _keep_done_log(nats_url, nats_credentials.seed_file("log-keeper"), namespace))
    server = start_server(
        nats_url=nats_url,
        reader_creds=nats_credentials.seed_file("reader"),
        kubeconfig=Path(kube.kubeconfig),
        log_dir=tmp_path_factory.mktemp("history-server-logs"),
        extra=("--auth-cache-seconds", "1", "--logs-creds", str(nats_credentials.seed_file("log-keeper"))),
    )
    world = Kept(namespace=namespace, other=other, server=server, tokens=tokens, api=api)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not all(world.logs(name)["kept"] for name in FINISHED):
            time.sleep(0.3)
        yield world
    finally:
        server.process.stop()
        core.delete_node(node)
        log = server.log.read_text(errors="replace")
        assert not [who for who, token in tokens.items() if token in log], "the server's log holds a token"
