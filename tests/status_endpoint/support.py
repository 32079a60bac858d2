"""The status server as a real process on the session's kube-apiserver and NATS, and TrainJobs with pods for it.

Nothing here runs a pod: a TrainJob's chain (JobSet → Job → Pod, each controlled by the one before) is made
on the API server as the controllers would make it, and each pod gets a real projected token from the
TokenRequest API, bound to the pod object, with the audience Trainer's plugin projects. The server reviews
those tokens with the API server, as it does in a cluster.
"""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import ssl
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from kubernetes import client as kube_client
from kubernetes.client import ApiClient

from contracts import streams, subjects
from contracts.progress import ProgressReported, decode_progress
from plumbing import bus, bus_history
from status_server import core
from tjpipe.credentials import STATUS_SERVER, Credentials
from tjpipe.keys.pki import write_serving_pki
from tjpipe.local.crds import apply_objects
from tjpipe.local.identities import _cluster_of, _kubeconfig
from tjpipe.local.kubeapi import LocalKube
from tjpipe.local.procs import ManagedProcess, free_port, http_ok, spawn, wait_until
from tjpipe.local.stack import nats_connect_options
from tjpipe.private_files import write_private_file

GROUP, VERSION = "trainer.kubeflow.org", "v1alpha1"
SERVER_NAMESPACE = "trainjob-pipeline"
SERVER_ACCOUNT = "tjpipe-status-server"
WORKLOAD_ACCOUNT = "trainer"
"""The ServiceAccount the TrainJobs' pods run as, in their own namespace."""

RBAC: list[dict[str, Any]] = [
    {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": SERVER_NAMESPACE}},
    {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": SERVER_ACCOUNT, "namespace": SERVER_NAMESPACE}},
    {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": SERVER_ACCOUNT},
        "rules": [
            {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]},
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]},
            {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["get"]},
            {"apiGroups": ["jobset.x-k8s.io"], "resources": ["jobsets"], "verbs": ["get"]},
            {"apiGroups": [GROUP], "resources": ["trainjobs"], "verbs": ["get"]},
            {"apiGroups": [GROUP], "resources": ["trainjobs/status"], "verbs": ["patch"]},
        ],
    },
    {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": SERVER_ACCOUNT},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": SERVER_ACCOUNT},
        "subjects": [{"kind": "ServiceAccount", "name": SERVER_ACCOUNT, "namespace": SERVER_NAMESPACE}],
    },
]
"""The server's own Kubernetes identity: read the chain, review tokens, write TrainJob status; nothing else."""


@dataclass
class StatusServer:
    process: ManagedProcess
    url: str
    """``https://127.0.0.1:PORT``"""
    ca_file: Path
    metrics_port: int
    interval: float
    argv: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    log_dir: Path = Path()

    def endpoint(self, namespace: str, name: str) -> str:
        return self.url + core.status_path(namespace, name)

    def metric(self, name: str, **labels: str) -> float:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as response:
            text = response.read().decode()
        total = 0.0
        for line in text.splitlines():
            if not line.startswith(name + "{") and line.split(" ")[0] != name:
                continue
            if all(f'{k}="{v}"' in line for k, v in labels.items()):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def stop(self) -> None:
        self.process.stop()

    def kill(self) -> None:
        """SIGKILL, as an OOM or a lost node ends it: no drain, nothing pending written."""
        os.killpg(self.process.popen.pid, signal.SIGKILL)
        self.process.popen.wait(timeout=10)
        self.process.stop()

    def restart(self) -> None:
        self.process = spawn(name="status-server", argv=self.argv, log_dir=self.log_dir, env=self.env)
        wait_until(
            lambda: http_ok(f"http://127.0.0.1:{self.metrics_port}/readyz"),
            timeout=60,
            what="tjpipe status-server",
            process=self.process,
        )


def start_status_server(
    api: ApiClient, *, admin_kubeconfig: Path, nats_url: str, creds: Credentials, root: Path, interval: float
) -> StatusServer:
    """``tjpipe status-server`` on loopback as its own ServiceAccount and its own NATS identity, with a fresh CA."""
    apply_objects(api, RBAC, field_manager="tjpipe-test")
    root.mkdir(parents=True, exist_ok=True)
    token = kube_client.CoreV1Api(api).create_namespaced_service_account_token(
        SERVER_ACCOUNT,
        SERVER_NAMESPACE,
        kube_client.AuthenticationV1TokenRequest(
            spec=kube_client.V1TokenRequestSpec(audiences=[], expiration_seconds=3600)
        ),
    )
    write_private_file(root / "status-server.token", token.status.token)
    write_private_file(
        root / "status-server.kubeconfig",
        _kubeconfig(_cluster_of(admin_kubeconfig), SERVER_ACCOUNT, "status-server.token"),
    )
    cert_dir = root / "tls"
    write_serving_pki(cert_dir, ca_name="tjpipe-status-ca", common_name="tjpipe-status-server")
    port, metrics_port = free_port(), free_port()
    argv = [
        sys.executable, "-m", "tjpipe", "status-server",
        "--host", "127.0.0.1", "--port", str(port),
        "--tls-cert", str(cert_dir / "tls.crt"), "--tls-key", str(cert_dir / "tls.key"),
        "--coalesce-seconds", str(interval),
        "--metrics-port", str(metrics_port), "--log-format", "json",
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "NATS_CREDS", "NATS_URL")}
    env |= {
        "KUBECONFIG": str(root / "status-server.kubeconfig"),
        "NATS_URL": nats_url,
        "NATS_CREDS": str(creds.seed_file(STATUS_SERVER)),
        "PYTHONUNBUFFERED": "1",
    }
    process = spawn(name="status-server", argv=argv, log_dir=root / "logs", env=env)
    server = StatusServer(
        process=process,
        url=f"https://127.0.0.1:{port}",
        ca_file=cert_dir / "ca.crt",
        metrics_port=metrics_port,
        interval=interval,
        argv=argv,
        env=env,
        log_dir=root / "logs",
    )
    wait_until(
        lambda: http_ok(f"http://127.0.0.1:{metrics_port}/readyz"),
        timeout=60,
        what="tjpipe status-server",
        process=process,
    )
    return server


# ------------------------------------------------------------------------------------------- TrainJobs


@dataclass
class Pod:
    name: str
    uid: str


@dataclass
class TrainJobWithPods:
    namespace: str
    name: str
    uid: str
    pods: list[Pod]


def _owner(api_version: str, kind: str, obj: dict[str, Any]) -> dict[str, Any]:
    meta = obj["metadata"]
    return {
        "apiVersion": api_version, "kind": kind, "name": meta["name"], "uid": meta["uid"],
        "controller": True, "blockOwnerDeletion": True,
    }  # fmt: skip


def ensure_workload_account(api: ApiClient, namespace: str) -> None:
    apply_objects(
        api,
        [
            {
                "apiVersion": "v1",
                "kind": "ServiceAccount",
                "metadata": {"name": WORKLOAD_ACCOUNT, "namespace": namespace},
            }
        ],
        field_manager="tjpipe-test",
    )


def make_trainjob(api: ApiClient, namespace: str, name: str, *, pods: int = 1) -> TrainJobWithPods:
    """A TrainJob, its JobSet, one Job and ``pods`` pods, each controlled by the one before, as the controllers
    make them; the pods never run."""
    ensure_workload_account(api, namespace)
    custom = kube_client.CustomObjectsApi(api)
    trainjob = custom.create_namespaced_custom_object(
        GROUP, VERSION, namespace, "trainjobs",
        {"apiVersion": f"{GROUP}/{VERSION}", "kind": "TrainJob", "metadata": {"name": name},
         "spec": {"runtimeRef": {"name": "torch-distributed"}}},
    )  # fmt: skip
    container = {"name": "node", "image": "example.invalid/trainer:1"}
    jobset = custom.create_namespaced_custom_object(
        "jobset.x-k8s.io", "v1alpha2", namespace, "jobsets",
        {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
         "metadata": {"name": name, "ownerReferences": [_owner(f"{GROUP}/{VERSION}", "TrainJob", trainjob)]},
         "spec": {"replicatedJobs": [{"name": "node", "replicas": 1, "template": {"spec": {"template": {"spec": {
             "restartPolicy": "Never", "containers": [container]}}}}}]}},
    )  # fmt: skip
    job = kube_client.BatchV1Api(api).create_namespaced_job(
        namespace,
        {"apiVersion": "batch/v1", "kind": "Job",
         "metadata": {"name": f"{name}-node-0",
                      "ownerReferences": [_owner("jobset.x-k8s.io/v1alpha2", "JobSet", jobset)]},
         "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [container]}}}},
    ).to_dict()  # fmt: skip
    made: list[Pod] = []
    core_api = kube_client.CoreV1Api(api)
    for i in range(pods):
        pod = core_api.create_namespaced_pod(
            namespace,
            {"apiVersion": "v1", "kind": "Pod",
             "metadata": {"name": f"{name}-node-0-{i}", "labels": {"jobset.sigs.k8s.io/jobset-name": name},
                          "ownerReferences": [_owner("batch/v1", "Job", job)]},
             "spec": {"serviceAccountName": WORKLOAD_ACCOUNT, "automountServiceAccountToken": False,
                      "restartPolicy": "Never", "containers": [container]}},
        )  # fmt: skip
        made.append(Pod(name=pod.metadata.name, uid=pod.metadata.uid))
    return TrainJobWithPods(namespace=namespace, name=name, uid=trainjob["metadata"]["uid"], pods=made)


def pod_token(
    api: ApiClient, namespace: str, *, pod: Pod | None, audience: str, account: str = WORKLOAD_ACCOUNT
) -> str:
    """A token from the TokenRequest API as the kubelet projects it: for ``account``, with ``audience``, bound to
    ``pod`` (``None``: bound to nothing, what anyone allowed to ``create serviceaccounts/token`` can get)."""
    spec = kube_client.V1TokenRequestSpec(audiences=[audience], expiration_seconds=3600)
    if pod is not None:
        spec.bound_object_ref = kube_client.V1BoundObjectReference(
            api_version="v1", kind="Pod", name=pod.name, uid=pod.uid
        )
    response = kube_client.CoreV1Api(api).create_namespaced_service_account_token(
        account, namespace, kube_client.AuthenticationV1TokenRequest(spec=spec)
    )
    token: str = response.status.token
    return token


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def resigned(token: str, signing_key: Path, **claims: Any) -> str:
    """``token`` with some claims changed, signed again with the API server's own service-account key: a token
    the API server itself could have issued (an expired one, say)."""
    header, payload, _ = token.split(".")
    body = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    body.update(claims)
    key = serialization.load_pem_private_key(signing_key.read_bytes(), password=None)
    assert isinstance(key, rsa.RSAPrivateKey)
    signed = f"{header}.{_b64(json.dumps(body, separators=(',', ':')).encode())}"
    signature = key.sign(signed.encode(), padding.PKCS1v15(), hashes.SHA256())
    return f"{signed}.{_b64(signature)}"


# ------------------------------------------------------------------------------------------- requests


def post(
    server: StatusServer, namespace: str, name: str, *, token: str | None, body: bytes | dict[str, Any]
) -> tuple[int, dict[str, Any]]:
    """POST an update over TLS (the server's CA); the status code and the decoded answer."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(server.endpoint(namespace, name), data=data, method="POST")
    request.add_header("Content-Type", "application/json")
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    context = ssl.create_default_context(cafile=str(server.ca_file))
    try:
        with urllib.request.urlopen(request, timeout=15, context=context) as response:
            return response.status, json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        try:
            return exc.code, json.loads(raw or b"{}")
        except ValueError:
            return exc.code, {"raw": raw.decode(errors="replace")}


def update(progress: int | None = 10, *, at: float | None = None, **more: Any) -> dict[str, Any]:
    status: dict[str, Any] = {"lastUpdatedTime": _rfc3339(time.time() if at is None else at)}
    if progress is not None:
        status["progressPercentage"] = progress
    status.update(more)
    return {"trainerStatus": status}


def _rfc3339(seconds: float) -> str:
    import datetime as dt

    return dt.datetime.fromtimestamp(seconds, tz=dt.UTC).isoformat()


def trainer_status(api: ApiClient, namespace: str, name: str) -> tuple[dict[str, Any] | None, list[str]]:
    """The TrainJob's ``status.trainerStatus`` and the managers that own fields under it."""
    obj = kube_client.CustomObjectsApi(api).get_namespaced_custom_object(GROUP, VERSION, namespace, "trainjobs", name)
    managers = [
        entry["manager"]
        for entry in obj["metadata"].get("managedFields") or []
        if re.search(r'"f:trainerStatus"', json.dumps(entry.get("fieldsV1") or {}))
    ]
    return (obj.get("status") or {}).get("trainerStatus"), managers


def records(nats_url: str, creds: Credentials | None, namespace: str, name: str) -> list[ProgressReported]:
    """The TrainJob's progress records, read back from ``TJ_PROGRESS`` as the read-only ``reader`` identity."""
    import asyncio

    async def read() -> list[ProgressReported]:
        nc = await bus.connect(nats_url, name="test-reader", **nats_connect_options(creds, "reader"))
        try:
            stored = await bus_history.read_stream(
                nc.jetstream(), streams.PROGRESS.name, subjects.trainjob_progress_filter(namespace, name)
            )
        finally:
            await nc.close()
        return [decode_progress(m.data) for m in stored]

    return asyncio.run(read())


def token_reviews(kube: LocalKube) -> int:
    """TokenReviews the API server answered so far (any code), from its own ``apiserver_request_total``."""
    tls = ssl.create_default_context(cafile=str(kube.ca_file))
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=tls))
    request = urllib.request.Request(f"{kube.server}/metrics", headers={"Authorization": f"Bearer {kube.token}"})
    with opener.open(request, timeout=10) as response:
        text = response.read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith("apiserver_request_total{") and 'resource="tokenreviews"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return int(total)


def unsigned(token: str, **claims: Any) -> str:
    """``token``'s payload with ``claims`` changed, under a header of ``alg: none`` and no signature: what anyone
    can write without a key."""
    _, payload, _ = token.split(".")
    body = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    body.update(claims)
    header = _b64(json.dumps({"alg": "none", "typ": "JWT"}).encode())
    return f"{header}.{_b64(json.dumps(body).encode())}."
