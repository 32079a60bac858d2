"""Key material on the real local stack: what the watcher may read, and the Flux key the applier makes.

The watcher's ConfigMap informers run against the real API server through a client that records every
request and the bytes that came back: each list and watch must carry the pipeline's label selector, so no
ConfigMap of anyone else reaches the process, and the watcher asks for no Secret at all (a role that may
list Secrets reads their data, whatever the client asks for).

A Flux TrainJob then runs through the three services. Its CURVE Secret is created once, with a random
key in Trainer's certificate format (not the one Trainer derives from the TrainJob's UID, which every
event on the bus carries), is labelled, and is never written again: later plans only create it, and the
API server answers that it exists. A Secret and a runtime snapshot left behind by Trainer (unlabelled, the
key derived from the UID) are kept as they are, data and all: the snapshot gets the pipeline's label, once;
the Secret is neither read nor changed. No key appears on the bus or in a log. Write counts come from the
API server's own ``apiserver_request_total`` (SSA is verb ``APPLY``, a create ``POST``).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import inspect
import uuid
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography.hazmat.primitives.asymmetric import x25519
from faults.support import (
    TRAINER,
    Pipeline,
    WriteCounts,
    close_pipeline,
    condition_of,
    converged,
    open_pipeline,
    quiet,
    results_of,
    stream_messages,
    trainjob,
    until,
    until_async,
)
from kubernetes import client as kube_client
from unit.builders import replicated_job

from applier.outcomes import ALREADY_CREATED
from applier.secrets import curve_certificate, z85_decode
from contracts import labels, resources, streams
from plumbing.kube import (
    METADATA_ACCEPT,
    KubeApiError,
    KubeClient,
    KubeConfig,
    RawWatchEvent,
    Response,
)
from watcher.service import Watcher, WatcherSettings

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]

OWNED = {labels.MANAGED_BY_LABEL: labels.MANAGED_BY}
RBAC = Path(__file__).parents[2] / "deploy" / "base" / "rbac.yaml"


# ------------------------------------------------------------------------ what the watcher asks for


class RecordingKube(KubeClient):
    """The real client, keeping each list/watch request's path, parameters and Accept, and each answer."""

    def __init__(self, config: KubeConfig) -> None:
        super().__init__(config)
        self.requests: list[tuple[str, str, dict[str, str], str]] = []  # (verb, path, params, accept)
        self.bodies: dict[str, list[bytes]] = {}

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        body: bytes | None = None,
        content_type: str | None = None,
        timeout: float | None = None,
        accept: str | None = None,
    ) -> Response:
        self.requests.append((method, path, dict(params or {}), accept or "application/json"))
        response = await super().request(
            method, path, params=params, body=body, content_type=content_type, timeout=timeout, accept=accept
        )
        self.bodies.setdefault(path, []).append(response.body)
        return response

    async def watch(self, resource: Any, **kwargs: Any) -> AsyncIterator[RawWatchEvent]:
        path = resource.path(namespace=kwargs.get("namespace"))
        params = {"labelSelector": kwargs["label_selector"]} if kwargs.get("label_selector") else {}
        accept = METADATA_ACCEPT if kwargs.get("metadata_only") else "application/json"
        self.requests.append(("WATCH", path, params, accept))
        async for event in super().watch(resource, **kwargs):
            self.bodies.setdefault("WATCH " + path, []).append(bytes(event.object))
            yield event


def _watcher(kube: KubeClient, namespace: str) -> Watcher:
    """The watcher's own informer set-up; nothing is published (no TrainJob is known, so nothing is gathered)."""
    settings = WatcherSettings(nats_url="nats://unused", namespaces=(namespace,))
    extra: dict[str, Any] = {"signer": None} if "signer" in inspect.signature(Watcher).parameters else {}
    return Watcher(settings, kube, None, **extra)  # type: ignore[arg-type]


def _owner(uid: str) -> dict[str, Any]:
    return {"apiVersion": TRAINER, "kind": "TrainJob", "name": "tj", "uid": uid, "controller": True}


def _object(kind: str, name: str, namespace: str, *, labelled: bool, data: dict[str, str]) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "ownerReferences": [_owner(str(uuid.uuid4()))]}
    if labelled:
        meta["labels"] = dict(OWNED)
    return {"apiVersion": "v1", "kind": kind, "metadata": meta, "data": data}


async def test_the_watcher_asks_only_for_labelled_configmaps_and_never_for_secrets(kube: Any, namespace: str) -> None:
    marker = base64.b64encode(b"do-not-read-" + uuid.uuid4().hex.encode()).decode()
    text_marker = "config-do-not-read-" + uuid.uuid4().hex
    with kube.api_client() as api:
        core = kube_client.CoreV1Api(api)
        for labelled in (True, False):
            suffix = "ours" if labelled else "theirs"
            core.create_namespaced_secret(
                namespace, _object("Secret", f"s-{suffix}", namespace, labelled=labelled, data={"k": marker})
            )
            core.create_namespaced_config_map(
                namespace,
                _object("ConfigMap", f"cm-{suffix}", namespace, labelled=labelled, data={"k": text_marker}),
            )

    async with RecordingKube(KubeConfig.load(str(kube.kubeconfig))) as client:
        watcher = _watcher(client, namespace)
        informers = [*watcher.config_maps, *watcher.owned]
        assert len(watcher.config_maps) == 1
        assert all(inf.resource is not resources.SECRET for inf in informers)
        tasks = [asyncio.create_task(inf.run()) for inf in informers]
        try:
            await asyncio.wait_for(watcher.config_maps[0].synced.wait(), 30)
            # Changes after the list arrive through the watch, filtered the same way.
            with kube.api_client() as api:
                core = kube_client.CoreV1Api(api)
                for labelled in (True, False):
                    suffix = "ours" if labelled else "theirs"
                    core.create_namespaced_config_map(
                        namespace,
                        _object("ConfigMap", f"cm2-{suffix}", namespace, labelled=labelled, data={"k": text_marker}),
                    )
            await until(
                lambda: set(watcher.config_maps[0].cache) == {(namespace, "cm-ours"), (namespace, "cm2-ours")},
                timeout=20,
                what="the watch to catch up",
            )
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    config_map_path = resources.CONFIG_MAP.path(namespace=namespace)
    seen = {(verb, path): (params, accept) for verb, path, params, accept in client.requests}
    for verb in ("GET", "WATCH"):
        params, _ = seen[(verb, config_map_path)]
        assert params.get("labelSelector") == labels.OWNED_SELECTOR, verb
    assert not [path for _, path, _, _ in client.requests if "/secrets" in path]

    everything = b"".join(b for bodies in client.bodies.values() for b in bodies)
    assert marker.encode() not in everything
    assert b"theirs" not in everything
    assert text_marker.encode() in everything  # ConfigMaps are read whole, but only the pipeline's own


async def test_the_watcher_runs_on_its_narrowed_role_and_may_not_read_a_secret(kube: Any, namespace: str) -> None:
    """Every watcher informer syncs with only deploy/base/rbac.yaml's watcher role (list and watch, no get,
    no Secrets), and a GET of a Secret or ConfigMap and a list of Secrets are refused."""
    if kube.local is None:
        pytest.skip("creates ClusterRoles and a ServiceAccount token: local apiserver only")
    rbac = [d for d in yaml.safe_load_all(RBAC.read_text()) if d]
    watcher_rbac = [d for d in rbac if d["metadata"]["name"] == "tjpipe-watcher"]
    assert {d["kind"] for d in watcher_rbac} == {"ServiceAccount", "ClusterRole", "ClusterRoleBinding"}
    sa_namespace = watcher_rbac[-1]["subjects"][0]["namespace"]
    with kube.api_client() as api:
        core = kube_client.CoreV1Api(api)
        authz = kube_client.RbacAuthorizationV1Api(api)
        if sa_namespace not in {n.metadata.name for n in core.list_namespace().items}:
            core.create_namespace({"metadata": {"name": sa_namespace}})
        # Other tests on the shared apiserver may have created the same objects from the same file.
        name = "tjpipe-watcher"
        for doc in watcher_rbac:
            if doc["kind"] == "ServiceAccount":
                _create_or_replace(
                    lambda d=doc: core.create_namespaced_service_account(sa_namespace, d),
                    lambda d=doc: core.replace_namespaced_service_account(name, sa_namespace, d),
                )
            elif doc["kind"] == "ClusterRole":
                _create_or_replace(
                    lambda d=doc: authz.create_cluster_role(d), lambda d=doc: authz.replace_cluster_role(name, d)
                )
            else:
                _create_or_replace(
                    lambda d=doc: authz.create_cluster_role_binding(d),
                    lambda d=doc: authz.replace_cluster_role_binding(name, d),
                )
        core.create_namespaced_secret(
            namespace, _object("Secret", "s-ours", namespace, labelled=True, data={"k": "eA=="})
        )
        token = core.create_namespaced_service_account_token(
            "tjpipe-watcher", sa_namespace, {"spec": {"expirationSeconds": 600}}
        ).status.token
    try:
        admin = KubeConfig.load(str(kube.kubeconfig))
        as_watcher = KubeConfig(server=admin.server, token=token, ca_file=admin.ca_file)
        async with KubeClient(as_watcher) as client:
            watcher = _watcher(client, namespace)
            informers = [
                *watcher.trainjobs,
                *watcher.jobsets,
                *watcher.runtimes,
                watcher.cluster_runtimes,
                *watcher.config_maps,
                *watcher.owned,
                watcher.priority_classes,
            ]
            tasks = [asyncio.create_task(inf.run()) for inf in informers]
            try:
                for inf in informers:
                    await asyncio.wait_for(inf.synced.wait(), 30)
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
            # No get, on anything, and nothing at all on Secrets.
            with pytest.raises(KubeApiError) as refused:
                await client.get(resources.SECRET, namespace=namespace, name="s-ours")
            assert refused.value.status == 403
            with pytest.raises(KubeApiError) as refused:
                await client.get(resources.CONFIG_MAP, namespace=namespace, name="any")
            assert refused.value.status == 403
            for params in (None, {"watch": "true"}):
                with pytest.raises(KubeApiError) as refused:
                    await client.request("GET", resources.SECRET.path(namespace=namespace), params=params)
                assert refused.value.status == 403
    finally:
        with kube.api_client() as api:
            authz = kube_client.RbacAuthorizationV1Api(api)
            authz.delete_cluster_role_binding("tjpipe-watcher")
            authz.delete_cluster_role("tjpipe-watcher")
            kube_client.CoreV1Api(api).delete_namespaced_service_account("tjpipe-watcher", sa_namespace)


# ---------------------------------------------------------------------------------- the Flux Secret


def flux_runtime(name: str) -> dict[str, Any]:
    """A ClusterTrainingRuntime with a Flux policy, shaped like Trainer's ``flux-distributed`` example."""
    return {
        "apiVersion": TRAINER,
        "kind": "ClusterTrainingRuntime",
        "metadata": {"name": name, "labels": {"trainer.kubeflow.org/webhook-validation": "disabled"}},
        "spec": {
            "mlPolicy": {"numNodes": 1, "flux": {"numProcPerNode": 1}},
            "template": {
                "spec": {
                    "replicatedJobs": [
                        replicated_job(
                            "node",
                            [{"name": "node", "image": "example.com/lammps:1", "command": ["lmp"]}],
                            ancestor="trainer",
                            replicas=1,
                        )
                    ]
                }
            },
        },
    }


def trainers_certificate(name: str, uid: str) -> bytes:
    """What Trainer v2.3.0 writes into ``<name>-flux-curve``: the key is the SHA-256 of the UID."""
    key = x25519.X25519PrivateKey.from_private_bytes(hashlib.sha256(uid.encode()).digest())
    return curve_certificate(trainjob_name=name, secret=key)


def curve_keys(cert: bytes) -> tuple[str, str]:
    values = {
        line.split("=", 1)[0].strip(): line.split('"')[1] for line in cert.decode().splitlines() if "-key = " in line
    }
    return values["public-key"], values["secret-key"]


def secret_changes(delta: WriteCounts) -> int:
    """Secret writes other than creates (the applier's only verb on Secrets; a repeated one is answered 409)."""
    return delta.writes("secrets", verbs={"APPLY", "PATCH", "PUT", "DELETE", "DELETECOLLECTION"})


@pytest.fixture
def pipeline(kube: Any, tmp_path: Path) -> Any:
    if kube.local is None:
        pytest.skip("needs the local apiserver (its /metrics and token)")
    pipe = open_pipeline(kube.local, tmp_path / "pipe", runtimes=())
    try:
        yield pipe
    finally:
        print(close_pipeline(pipe))


async def test_flux_key_is_random_created_once_and_trainers_is_kept(pipeline: Pipeline) -> None:
    runtime = f"flux-{uuid.uuid4().hex[:6]}"
    pipeline.create(flux_runtime(runtime))
    kind = {"runtime_kind": "ClusterTrainingRuntime"}
    flux_job = {"numNodes": 2, "image": "example.com/lammps:1", "command": ["lmp", "-in", "in.reaxff"]}

    # A TrainJob Trainer built before the pipeline took over: its Secret and snapshot are unlabelled, and
    # its key is the one Trainer derives from the UID.
    old = pipeline.create(trainjob("old", runtime=runtime, trainer=flux_job, **kind))
    old_uid = old["metadata"]["uid"]
    owner = {**_owner(old_uid), "name": "old", "blockOwnerDeletion": True}
    trainers = trainers_certificate("old", old_uid)
    pipeline.create(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "old-flux-curve", "ownerReferences": [owner]},
            "data": {"curve.cert": base64.b64encode(trainers).decode()},
        }
    )
    snapshot_text = yaml.safe_dump(flux_runtime(runtime))  # Trainer's snapshot: the runtime as YAML
    pipeline.create(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "old-runtime-snapshot", "ownerReferences": [owner]},
            "data": {"runtime": snapshot_text},
        }
    )
    before_start = pipeline.writes()

    pipeline.start("watcher", extra=["--resync-seconds", "2"])
    pipeline.start("planner")
    pipeline.start("applier")
    new = pipeline.create(trainjob("new", runtime=runtime, trainer=flux_job, **kind))
    new_uid = new["metadata"]["uid"]
    nc = await pipeline.connect()
    try:
        js = nc.jetstream()
        await until(lambda: converged(pipeline, ["old", "new"]), timeout=90, what="both JobSets")
        await until(
            lambda: pipeline.get("v1", "ConfigMap", "old-runtime-snapshot")["metadata"].get("labels") == OWNED,
            timeout=30,
            what="the label on Trainer's snapshot",
        )
        settled = await quiet(pipeline, js)

        # The new TrainJob's key: random, valid, in Trainer's format, labelled, written once.
        secret = pipeline.get("v1", "Secret", "new-flux-curve")
        assert secret["metadata"]["labels"] == OWNED
        cert = base64.b64decode(secret["data"]["curve.cert"])
        public, private = curve_keys(cert)
        key = x25519.X25519PrivateKey.from_private_bytes(z85_decode(private))
        assert key.public_key().public_bytes_raw() == z85_decode(public)
        assert cert == curve_certificate(trainjob_name="new", secret=key)
        assert cert != trainers_certificate("new", new_uid), "the key must not be derivable from the UID"
        applies = {
            m["manager"]: m["operation"] for m in secret["metadata"]["managedFields"] if "f:data" in m["fieldsV1"]
        }
        assert applies == {"trainer": "Update"}  # a create, not an apply: the applier may not patch Secrets

        # Trainer's Secret: untouched, unread, unlabelled. Its snapshot: data untouched, only the label added
        # (by its own field manager).
        old_secret = pipeline.get("v1", "Secret", "old-flux-curve")
        assert base64.b64decode(old_secret["data"]["curve.cert"]) == trainers
        assert "labels" not in old_secret["metadata"]
        old_snapshot = pipeline.get("v1", "ConfigMap", "old-runtime-snapshot")
        assert old_snapshot["data"] == {"runtime": snapshot_text}
        assert old_snapshot["metadata"]["labels"] == OWNED
        # Once labelled, the watcher sees Trainer's snapshot and the planner builds from it, without complaint.
        await until(
            lambda: pipeline.get_or_none("v1", "ConfigMap", "old-flux-entrypoint") is not None,
            timeout=30,
            what="old's entrypoint ConfigMap",
        )
        assert condition_of(pipeline.get(TRAINER, "TrainJob", "old"), "ResourcesCreated") is None
        # Secret writes since the services started: creates only (new's, and old's answered 409), no change.
        assert secret_changes(settled - before_start) == 0, (settled - before_start).summary()
        assert (settled - before_start).writes("secrets", verbs={"POST"}) >= 2

        # Resyncs (every 2 s) and a change to the TrainJob re-plan both jobs: not one Secret changed.
        version = secret["metadata"]["resourceVersion"]
        pipeline.merge_patch(TRAINER, "TrainJob", "new", {"metadata": {"labels": {"touched": "yes"}}})

        async def secret_unchanged_twice() -> bool:
            results = await results_of(js, pipeline.namespace, "new")
            return sum(1 for r in results if r.target.kind == "Secret" and r.reason == ALREADY_CREATED) >= 2

        await until_async(secret_unchanged_twice, timeout=60, what="re-plans answered 'exists already'")
        await asyncio.sleep(4.5)  # two more resyncs
        after = await quiet(pipeline, js)
        assert secret_changes(after - settled) == 0, (after - settled).summary()
        assert (after - settled).writes("configmaps") == 0, (after - settled).summary()
        assert pipeline.get("v1", "Secret", "new-flux-curve")["metadata"]["resourceVersion"] == version

        # No key, neither the random one nor Trainer's, on the bus or in a log.
        leaks = [public, private, *curve_keys(trainers)]
        for stream in (streams.EVENTS, streams.APPLY, streams.RESULTS, streams.DLQ):
            for message in await stream_messages(js, stream.name, ">"):
                assert not [k for k in leaks if k.encode() in message.data], stream.name
        for name in pipeline.processes:
            text = pipeline.log_text(name)
            assert not [k for k in leaks if k in text], name
        assert "informer failed" not in pipeline.log_text("watcher")
    finally:
        await nc.close()


def _create_or_replace(create: Any, replace: Any) -> None:
    try:
        create()
    except kube_client.ApiException as exc:
        if exc.status != 409:
            raise
        replace()
