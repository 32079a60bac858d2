"""Status-server flood: Trainer v2.3.0's own status server and ``tjpipe status-server`` on the same updates.

Both servers answer the same route for the Kubeflow SDK's ``update_trainjob_status``. Trainer's writes the
TrainJob once per update (server-side apply, manager ``trainer-status``); this project's records every update in
the history and writes the TrainJob at most once per TrainJob per interval. What a flood of reports costs is
therefore measured on both, one after the other, on one kube-apiserver: the same TrainJobs-with-pods shape (a
TrainJob, its JobSet, a Job and its pods, each controlled by the one before), a real projected token per pod (a
TokenRequest bound to the pod object, with the audience
``trainer.kubeflow.org/v1alpha1/namespaces/<ns>/trainjobs/<name>/status``), and the same updates posted over
HTTPS with each server's CA, every pod sending its updates one after the other while all pods send at once.
Each side has TrainJobs of its own (same names, another namespace), so neither side's live ``lastUpdatedTime``
decides what the other writes.

Measured per side: updates accepted per second (200 answers over the flood's wall time), each request's
latency as the client sees it, and the API server's own count of writes to ``trainjobs/status``
(``apiserver_request_total``, verbs APPLY, PATCH and UPDATE) from just before the flood until the writes it
caused are done (Trainer's: the last answer; this project's: one coalescing interval and a margin after it,
for its trailing write).

Trainer's controller manager is built from its module (``toolchain.ensure_trainer_controller``) and run with the
shipped configuration plus ``featureGates: {TrainJobStatus: true}``. Outside a pod its status server needs two
fixed paths: it finds the service-account issuer by reading ``/var/run/secrets/kubernetes.io/serviceaccount/token``
(then OIDC discovery on the API server), and it reads its TLS pair from ``/tmp/k8s-webhook-server/serving-certs``.
And it listens on every interface (``:PORT``). So the whole scenario runs in a child process under
``unshare --mount --net --propagation private``: a network namespace whose only interface is loopback, and a
mount namespace where ``/run`` and ``/tmp`` are fresh tmpfs folders holding that token and that certificate.
Nothing of it is visible on the machine, nothing listens beyond loopback, and it all goes when the child
exits. That needs root; without it the scenario says so and measures nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from bench import stats

Progress = Callable[[str], None]

GROUP, VERSION = "trainer.kubeflow.org", "v1alpha1"
TRAINJOBS, PODS, UPDATES = 2, 10, 10
"""The child's default flood (``python -m bench`` passes its own ``--flood``): 200 updates per side."""
WORKLOAD_ACCOUNT = "trainer"
COALESCE_SECONDS = 5.0
"""``tjpipe status-server``'s default interval, left as shipped."""
CHILD_TIMEOUT_SECONDS = 900.0
REQUEST_TIMEOUT_SECONDS = 60.0
SA_TOKEN_PATH = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")
TRAINER_CERT_DIR = Path("/tmp/k8s-webhook-server/serving-certs")
WRITE_VERBS = ("APPLY", "PATCH", "UPDATE")


def audience(namespace: str, name: str) -> str:
    return f"{GROUP}/{VERSION}/namespaces/{namespace}/trainjobs/{name}/status"


# --------------------------------------------------------------------------------------------- the parent


async def status_flood(
    *, trainjobs: int, pods: int, updates: int, progress: Progress, keep_state: bool = False
) -> dict[str, Any]:
    """Run the flood in a child process in namespaces of its own; its figures, or why there are none."""
    if os.geteuid() != 0 or shutil.which("unshare") is None or shutil.which("ip") is None:
        return {"skipped": "needs root, unshare and ip (private mount and network namespaces for Trainer's server)"}
    argv = [
        "unshare", "--mount", "--net", "--propagation", "private", "--",
        sys.executable, "-m", "bench.status_flood",
        "--trainjobs", str(trainjobs), "--pods", str(pods), "--updates", str(updates),
    ]  # fmt: skip
    if keep_state:
        argv.append("--keep-state")
    child = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, start_new_session=True
    )
    assert child.stdout is not None and child.stderr is not None
    stderr = child.stderr

    async def relay() -> list[str]:
        tail: list[str] = []
        async for raw in stderr:
            line = raw.decode(errors="replace").rstrip()
            if line.startswith("[flood] "):
                progress(line.removeprefix("[flood] "))
            tail = [*tail[-29:], line]
        return tail

    relaying = asyncio.create_task(relay())
    try:
        out = await asyncio.wait_for(child.stdout.read(), timeout=CHILD_TIMEOUT_SECONDS)
        await asyncio.wait_for(child.wait(), timeout=60)
    except TimeoutError:
        await _stop(child)
        return {"error": f"the flood did not finish in {CHILD_TIMEOUT_SECONDS:.0f}s", "log": await relaying}
    finally:
        if child.returncode is None:  # interrupted: the child stops its servers before it goes
            await _stop(child)
    tail = await relaying
    if child.returncode != 0 or not out.strip():
        return {"error": f"the flood's process exited {child.returncode}", "log": tail}
    result: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
    return result


async def _stop(child: asyncio.subprocess.Process) -> None:
    """SIGTERM first: the child then stops the servers it started (each in a session of its own, so killing the
    child alone would leave them running); SIGKILL if it has not gone after a minute."""
    if child.returncode is not None:
        return
    child.terminate()
    try:
        await asyncio.wait_for(child.wait(), timeout=60)
    except TimeoutError:
        child.kill()
        await child.wait()


# ---------------------------------------------------------------------------------------------- the child


def _say(line: str) -> None:
    print(f"[flood] {line}", file=sys.stderr, flush=True)


def _enter_private_namespaces() -> None:
    """Loopback up; fresh ``/run`` and ``/tmp`` seen by this process and its children only."""
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    for folder in ("/run", "/tmp"):
        subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=1777", "tmpfs", folder], check=True)


@dataclass
class _Job:
    namespace: str
    name: str
    pods: list[tuple[str, str]]
    """(pod name, uid)"""
    tokens: list[str]


def _owner(api_version: str, kind: str, obj: dict[str, Any]) -> dict[str, Any]:
    meta = obj["metadata"]
    return {
        "apiVersion": api_version, "kind": kind, "name": meta["name"], "uid": meta["uid"],
        "controller": True, "blockOwnerDeletion": True,
    }  # fmt: skip


def _make_jobs(api: Any, namespace: str, *, trainjobs: int, pods: int) -> list[_Job]:
    """TrainJobs with their JobSet, Job and pods as the controllers make them, and a bound token per pod."""
    from kubernetes import client as k

    from tjpipe.local.crds import apply_objects

    apply_objects(
        api,
        [
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
            {"apiVersion": "v1", "kind": "ServiceAccount",
             "metadata": {"name": WORKLOAD_ACCOUNT, "namespace": namespace}},
        ],
        field_manager="tjpipe-bench",
    )  # fmt: skip
    # The client's models are typed; the objects here are plain manifests, as the API server takes them.
    custom: Any = k.CustomObjectsApi(api)
    batch: Any = k.BatchV1Api(api)
    core: Any = k.CoreV1Api(api)
    container = {"name": "node", "image": "example.invalid/trainer:1"}
    jobs: list[_Job] = []
    for j in range(trainjobs):
        name = f"flood-{j}"
        trainjob = custom.create_namespaced_custom_object(
            GROUP, VERSION, namespace, "trainjobs",
            {"apiVersion": f"{GROUP}/{VERSION}", "kind": "TrainJob", "metadata": {"name": name},
             "spec": {"runtimeRef": {"name": "torch-distributed"}, "suspend": True}},
        )  # fmt: skip
        jobset = custom.create_namespaced_custom_object(
            "jobset.x-k8s.io", "v1alpha2", namespace, "jobsets",
            {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
             "metadata": {"name": name, "ownerReferences": [_owner(f"{GROUP}/{VERSION}", "TrainJob", trainjob)]},
             "spec": {"replicatedJobs": [{"name": "node", "replicas": 1, "template": {"spec": {"template": {
                 "spec": {"restartPolicy": "Never", "containers": [container]}}}}}]}},
        )  # fmt: skip
        job = batch.create_namespaced_job(
            namespace,
            {"apiVersion": "batch/v1", "kind": "Job",
             "metadata": {"name": f"{name}-node-0",
                          "ownerReferences": [_owner("jobset.x-k8s.io/v1alpha2", "JobSet", jobset)]},
             "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [container]}}}},
        ).to_dict()  # fmt: skip
        made: list[tuple[str, str]] = []
        tokens: list[str] = []
        for i in range(pods):
            pod = core.create_namespaced_pod(
                namespace,
                {"apiVersion": "v1", "kind": "Pod",
                 "metadata": {"name": f"{name}-node-0-{i}", "ownerReferences": [_owner("batch/v1", "Job", job)]},
                 "spec": {"serviceAccountName": WORKLOAD_ACCOUNT, "automountServiceAccountToken": False,
                          "restartPolicy": "Never", "containers": [container]}},
            )  # fmt: skip
            made.append((pod.metadata.name, pod.metadata.uid))
            spec = k.V1TokenRequestSpec(
                audiences=[audience(namespace, name)],
                expiration_seconds=3600,
                bound_object_ref=k.V1BoundObjectReference(
                    api_version="v1", kind="Pod", name=pod.metadata.name, uid=pod.metadata.uid
                ),
            )
            answer = core.create_namespaced_service_account_token(
                WORKLOAD_ACCOUNT, namespace, k.AuthenticationV1TokenRequest(spec=spec)
            )
            tokens.append(answer.status.token)
        jobs.append(_Job(namespace=namespace, name=name, pods=made, tokens=tokens))
    return jobs


def _account_token(api: Any, account: str, namespace: str) -> str:
    """A ServiceAccount's token for the API server itself (TokenRequest, an hour, bound to nothing)."""
    from kubernetes import client as k

    core: Any = k.CoreV1Api(api)
    answer = core.create_namespaced_service_account_token(
        account,
        namespace,
        k.AuthenticationV1TokenRequest(spec=k.V1TokenRequestSpec(audiences=[], expiration_seconds=3600)),
    )
    token: str = answer.status.token
    return token


def _showing_newest(api: Any, jobs: list[_Job], newest: str) -> int:
    """How many of ``jobs`` show the flood's newest update in ``status.trainerStatus`` once it is over."""
    from kubernetes import client as k

    custom: Any = k.CustomObjectsApi(api)
    shown = 0
    for job in jobs:
        obj = custom.get_namespaced_custom_object(GROUP, VERSION, job.namespace, "trainjobs", job.name)
        status = (obj.get("status") or {}).get("trainerStatus") or {}
        shown += status.get("lastUpdatedTime") == newest
    return shown


def _status_writes(server: str, token: str, ca_file: Path) -> dict[str, float]:
    """The API server's count of requests on ``trainjobs/status`` so far, by verb."""
    request = urllib.request.Request(f"{server}/metrics", headers={"Authorization": f"Bearer {token}"})
    context = ssl.create_default_context(cafile=str(ca_file))
    with urllib.request.urlopen(request, timeout=30, context=context) as response:
        text = response.read().decode()
    counts: dict[str, float] = {}
    for labels, value in stats.samples(text, "apiserver_request_total"):
        if labels.get("resource") == "trainjobs" and labels.get("subresource") == "status":
            counts[labels["verb"]] = counts.get(labels["verb"], 0.0) + value
    return counts


def _rfc3339(seconds: float) -> str:
    return dt.datetime.fromtimestamp(seconds, tz=dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


async def _flood(url: str, ca_file: Path, jobs: list[_Job], *, updates: int) -> dict[str, Any]:
    """Every pod posts ``updates`` updates one after the other, all pods at once; answers and latencies."""
    from status_server import core

    context = ssl.create_default_context(cafile=str(ca_file))
    base = time.time()
    latencies: list[float] = []
    codes: dict[str, int] = {}
    pods = sum(len(job.pods) for job in jobs)
    connector = aiohttp.TCPConnector(ssl=context, limit=pods)
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_SECONDS)

    async def pod(session: aiohttp.ClientSession, job: _Job, i: int) -> None:
        endpoint = url + core.status_path(job.namespace, job.name)
        headers = {"Authorization": f"Bearer {job.tokens[i]}", "Content-Type": "application/json"}
        for k in range(updates):
            body = {
                "trainerStatus": {
                    "progressPercentage": min(100, (k + 1) * 100 // updates),
                    "estimatedRemainingSeconds": (updates - k - 1) * 5,
                    "metrics": [{"name": "loss", "value": f"{2.0 / (k + 1):.4f}"}],
                    # one second apart on the training code's clock: the SDK sends at most one per 5 s
                    "lastUpdatedTime": _rfc3339(base + k),
                }
            }
            started = time.monotonic()
            try:
                async with session.post(endpoint, json=body, headers=headers) as response:
                    await response.read()
                    code = str(response.status)
            except (aiohttp.ClientError, TimeoutError) as exc:
                code = type(exc).__name__
            latencies.append(time.monotonic() - started)
            codes[code] = codes.get(code, 0) + 1

    started = time.monotonic()
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        await asyncio.gather(*(pod(session, job, i) for job in jobs for i in range(len(job.pods))))
    seconds = time.monotonic() - started
    accepted = codes.get("200", 0)
    return {
        "sent": len(latencies),
        "accepted": accepted,
        "answers": dict(sorted(codes.items())),
        "flood_s": seconds,
        "accepted_per_s": stats.rate(accepted, seconds),
        "newest_sent": _rfc3339(base + updates - 1),
        "latency_s": stats.summarize(latencies),
    }


def _wait_tls(port: int, *, timeout: float, alive: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + timeout
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    while time.monotonic() < deadline:
        if not alive():
            raise RuntimeError(f"{what} exited before it listened")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=2) as raw, context.wrap_socket(raw):
                return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"{what} did not listen on {port} within {timeout:.0f}s")


def _side(
    label: str, flood: dict[str, Any], before: dict[str, float], after: dict[str, float], **more: Any
) -> dict[str, Any]:
    verbs = {v: after.get(v, 0.0) - before.get(v, 0.0) for v in sorted(set(after) | set(before))}
    writes = sum(verbs.get(v, 0.0) for v in WRITE_VERBS)
    return {
        "label": label,
        **flood,
        "status_requests": {v: n for v, n in verbs.items() if n},
        "status_writes": writes,
        "writes_per_update": stats.ratio(writes, flood["accepted"]) if flood["accepted"] else None,
        **more,
    }


def run_child(*, trainjobs: int, pods: int, updates: int, keep_state: bool) -> dict[str, Any]:

    from tjpipe.credentials import STATUS_SERVER, generate_credentials, server_authorization
    from tjpipe.keys.pki import write_serving_pki
    from tjpipe.local import toolchain
    from tjpipe.local.crds import crd_manifests, install_crds
    from tjpipe.local.identities import install_identities
    from tjpipe.local.kubeapi import start_kube
    from tjpipe.local.natsd import start_nats
    from tjpipe.local.procs import free_port, http_ok, spawn, wait_until
    from tjpipe.local.stack import setup_bus_as_admin
    from tjpipe.local.trainer_controller import TrainerController

    root = Path(tempfile.mkdtemp(prefix="tjpipe-bench-flood-"))
    toolchain.ensure_trainer_controller(progress=_say)
    kube = start_kube(work_dir=root / "kube", log_dir=root / "logs", kubeconfig_path=root / "kubeconfig", progress=_say)
    result: dict[str, Any] = {
        "trainjobs": trainjobs,
        "pods_per_trainjob": pods,
        "updates_per_pod": updates,
        "coalesce_s": COALESCE_SECONDS,
    }
    local = None
    try:
        with kube.api_client() as api:
            install_crds(api, crd_manifests(progress=_say))
            trainer_jobs = _make_jobs(api, "flood-trainer", trainjobs=trainjobs, pods=pods)
            pipeline_jobs = _make_jobs(api, "flood-pipeline", trainjobs=trainjobs, pods=pods)
            issuer_token = _account_token(api, WORKLOAD_ACCOUNT, "flood-trainer")
        _say(f"{2 * trainjobs} TrainJobs with {pods} pods each and a bound token per pod")

        # Trainer's side: its issuer token and serving certificate where it looks, in this mount namespace only.
        SA_TOKEN_PATH.parent.mkdir(parents=True, exist_ok=True)
        SA_TOKEN_PATH.write_text(issuer_token)
        write_serving_pki(TRAINER_CERT_DIR, ca_name="tjpipe-bench-trainer-status-ca", common_name="trainer-status")
        port = free_port()
        trainer = TrainerController(
            kubeconfig=kube.kubeconfig,
            state_dir=root / "trainer",
            progress=_say,
            register_webhooks=False,
            feature_gates={"TrainJobStatus": True},
            status_server_port=port,
        )
        trainer.start()
        try:
            _wait_tls(port, timeout=60, alive=trainer.is_running, what="Trainer's status server")
            time.sleep(2)  # the controller's first reconciles of the suspended TrainJobs settle
            _say(f"Trainer's status server on :{port}; flooding it")
            before = _status_writes(kube.server, kube.token, kube.ca_file)
            flood = asyncio.run(
                _flood(f"https://127.0.0.1:{port}", TRAINER_CERT_DIR / "ca.crt", trainer_jobs, updates=updates)
            )
            time.sleep(2)
            after = _status_writes(kube.server, kube.token, kube.ca_file)
            with kube.api_client() as api:
                shown = _showing_newest(api, trainer_jobs, flood["newest_sent"])
            result["trainer"] = _side(f"Trainer v{toolchain.TRAINER_VERSION}", flood, before, after, newest_shown=shown)
        finally:
            trainer.stop(unregister_webhooks=False)

        # This project's side, on the same API server, as its own ServiceAccount and NATS identity.
        creds = generate_credentials(root / "creds")
        local = start_nats(store_dir=root / "nats", log_dir=root / "logs", authorization=server_authorization(creds))
        setup_bus_as_admin(local.url, creds, environ={}, tls_from_env=False)
        with kube.api_client() as api:  # deploy/'s identities: the status server as its own ServiceAccount
            kubeconfig = install_identities(
                api, admin_kubeconfig=kube.kubeconfig, folder=root / "identities"
            ).for_service("status-server")
        if kubeconfig is None:
            raise RuntimeError("deploy/ gives the status server no ServiceAccount")
        cert_dir = root / "status-tls"
        write_serving_pki(cert_dir, ca_name="tjpipe-bench-status-ca", common_name="tjpipe-status-server")
        port, metrics_port = free_port(), free_port()
        env = {key: v for key, v in os.environ.items() if key not in ("KUBECONFIG", "NATS_CREDS", "NATS_URL")}
        env |= {
            "KUBECONFIG": str(kubeconfig),
            "NATS_URL": local.url,
            "NATS_CREDS": str(creds.seed_file(STATUS_SERVER)),
        }
        server = spawn(
            name="status-server",
            argv=[
                sys.executable, "-m", "tjpipe", "status-server",
                "--host", "127.0.0.1", "--port", str(port),
                "--tls-cert", str(cert_dir / "tls.crt"), "--tls-key", str(cert_dir / "tls.key"),
                "--coalesce-seconds", str(COALESCE_SECONDS), "--metrics-port", str(metrics_port),
            ],
            log_dir=root / "logs",
            env=env,
        )  # fmt: skip
        try:
            wait_until(
                lambda: http_ok(f"http://127.0.0.1:{metrics_port}/readyz"),
                timeout=60,
                what="tjpipe status-server",
                process=server,
            )
            _say(f"tjpipe status-server on 127.0.0.1:{port}; flooding it")
            before = _status_writes(kube.server, kube.token, kube.ca_file)
            flood = asyncio.run(
                _flood(f"https://127.0.0.1:{port}", cert_dir / "ca.crt", pipeline_jobs, updates=updates)
            )
            time.sleep(COALESCE_SECONDS + 3)  # the trailing coalesced write of each TrainJob
            after = _status_writes(kube.server, kube.token, kube.ca_file)
            with kube.api_client() as api:
                shown = _showing_newest(api, pipeline_jobs, flood["newest_sent"])
            result["pipeline"] = _side("this project", flood, before, after, newest_shown=shown)
        finally:
            server.stop()
    finally:
        if local is not None:
            local.stop()
        kube.stop()
        if not keep_state:
            shutil.rmtree(root, ignore_errors=True)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.status_flood", description=__doc__.splitlines()[0])
    parser.add_argument("--trainjobs", type=int, default=TRAINJOBS)
    parser.add_argument("--pods", type=int, default=PODS)
    parser.add_argument("--updates", type=int, default=UPDATES)
    parser.add_argument(
        "--keep-state", action="store_true", help="keep the state folder until exit (it is on a private tmpfs)"
    )
    args = parser.parse_args(argv)
    # SIGTERM (the parent's timeout) unwinds like an error, so every server started is stopped on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    _enter_private_namespaces()
    result = run_child(trainjobs=args.trainjobs, pods=args.pods, updates=args.updates, keep_state=args.keep_state)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
