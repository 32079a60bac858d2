"""Stolen Kubernetes tokens of the pipeline, on a real API server: what each one can still do.

The tokens are real ServiceAccount tokens from the TokenRequest API, for the ServiceAccounts, roles,
bindings and admission policies of deploy/base as ``tjpipe up`` installs them (``tjpipe.local.identities``).
An attacker holding one is not bound by anything the services' code does, so every request here is made
directly, with the token alone: the refusals come from RBAC and the ValidatingAdmissionPolicies, nothing
else. Then the three services run as those ServiceAccounts and still build every kind of component.
"""

from __future__ import annotations

import copy
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from faults.support import (
    JOBSET,
    TRAINER,
    Pipeline,
    close_pipeline,
    condition_of,
    converged,
    dead_letters,
    new_namespace,
    open_pipeline,
    trainjob,
    until,
    until_async,
)
from kubernetes import client as kube_client

from contracts import resources
from contracts.resources import Resource
from plumbing.kube import METADATA_LIST_ACCEPT, KubeApiError, KubeClient, KubeConfig
from tjpipe.local import crds
from tjpipe.local.identities import NAMESPACE, install_identities, request_token
from tjpipe.local.kubeapi import LocalKube, new_api_client

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]

KINDS: tuple[Resource, ...] = (resources.CONFIG_MAP, resources.SECRET, resources.JOBSET, resources.POD_GROUP)
"""Every kind the applier writes as a component (the Volcano PodGroup is matched by the same rule)."""
EXCLUDED = ("kube-system", "kube-public", "kube-node-lease", NAMESPACE)


@pytest.fixture(scope="module")
def identities(module_kube: LocalKube, tmp_path_factory: pytest.TempPathFactory) -> LocalKube:
    """deploy/'s identities installed, and the policies in force (the API server loads them within a moment)."""
    with new_api_client(module_kube.kubeconfig) as api:
        kubeconfigs = install_identities(
            api, admin_kubeconfig=module_kube.kubeconfig, folder=tmp_path_factory.mktemp("identities")
        )
        core = kube_client.CoreV1Api(api)
        probe = new_namespace(api, prefix="probe")
        with new_api_client(kubeconfigs.path("applier")) as as_applier:
            # One probe per policy, since the API server loads each on its own: a ConfigMap no TrainJob
            # controls (tjpipe-trainjob-components), and one a TrainJob in kube-system controls
            # (tjpipe-excluded-namespaces).
            excluded_job = _trainjob(api, "kube-system", f"probe-{uuid.uuid4().hex[:6]}")
            probes = [(probe, []), ("kube-system", [_controller(excluded_job)])]

            def refused() -> bool:
                for namespace, owners in probes:
                    name = f"p-{uuid.uuid4().hex[:6]}"
                    meta = {"name": name, "ownerReferences": owners}
                    try:
                        kube_client.CoreV1Api(as_applier).create_namespaced_config_map(namespace, {"metadata": meta})
                    except kube_client.ApiException as exc:
                        if exc.status != 403:
                            return False
                        continue
                    core.delete_namespaced_config_map(name, namespace)
                    return False
                return True

            deadline = time.monotonic() + 30
            while not refused():
                assert time.monotonic() < deadline, "the admission policies never took effect"
                time.sleep(0.2)
            kube_client.CustomObjectsApi(api).delete_namespaced_custom_object(
                "trainer.kubeflow.org", "v1alpha1", "kube-system", "trainjobs", excluded_job["metadata"]["name"]
            )
    return module_kube


@pytest.fixture
def admin(identities: LocalKube) -> Iterator[kube_client.ApiClient]:
    with new_api_client(identities.kubeconfig) as api:
        yield api


@pytest.fixture
def namespace(admin: kube_client.ApiClient) -> str:
    return new_namespace(admin, prefix="id")


async def _client_as(kube: LocalKube, account: str) -> AsyncIterator[KubeClient]:
    with new_api_client(kube.kubeconfig) as api:
        token = request_token(kube_client.CoreV1Api(api), account, seconds=600)
    admin = KubeConfig.load(str(kube.kubeconfig))
    async with KubeClient(KubeConfig(server=admin.server, token=token, ca_file=admin.ca_file)) as client:
        yield client


@pytest.fixture
async def applier(identities: LocalKube) -> AsyncIterator[KubeClient]:
    async for client in _client_as(identities, "tjpipe-applier"):
        yield client


@pytest.fixture
async def watcher(identities: LocalKube) -> AsyncIterator[KubeClient]:
    async for client in _client_as(identities, "tjpipe-watcher"):
        yield client


def _trainjob(admin: kube_client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    body = {**trainjob(name, suspend=True), "metadata": {"name": name, "namespace": namespace}}
    created: dict[str, Any] = kube_client.CustomObjectsApi(admin).create_namespaced_custom_object(
        "trainer.kubeflow.org", "v1alpha1", namespace, "trainjobs", body
    )
    return created


def _controller(job: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": TRAINER,
        "kind": "TrainJob",
        "name": job["metadata"]["name"],
        "uid": job["metadata"]["uid"],
        "controller": True,
    }


def _object(resource: Resource, name: str, namespace: str, owners: list[dict[str, Any]]) -> dict[str, Any]:
    """A minimal valid object of the kind, with these owner references."""
    body: dict[str, Any] = {
        "apiVersion": resource.api_version,
        "kind": resource.kind,
        "metadata": {"name": name, "namespace": namespace, "ownerReferences": owners},
    }
    if resource is resources.CONFIG_MAP:
        body["data"] = {"k": "v"}
    elif resource is resources.SECRET:
        body["data"] = {"k": "c2VjcmV0"}
    elif resource is resources.JOBSET:
        body["spec"] = {"replicatedJobs": []}
    else:
        body["spec"] = {"minMember": 1}
    return body


async def _create(client: KubeClient, body: dict[str, Any]) -> int:
    """The HTTP status of a create; refusals are answers here, not errors."""
    resource = resources.resource_for(body["apiVersion"], body["kind"])
    try:
        response = await client.create(
            resource, namespace=body["metadata"]["namespace"], body=msgspec.json.encode(body)
        )
    except KubeApiError as exc:
        return exc.status
    return response.status


async def _apply(client: KubeClient, body: dict[str, Any]) -> int:
    resource = resources.resource_for(body["apiVersion"], body["kind"])
    meta = body["metadata"]
    try:
        response = await client.apply(
            resource, namespace=meta["namespace"], name=meta["name"], body=msgspec.json.encode(body), field_manager="x"
        )
    except KubeApiError as exc:
        return exc.status
    return response.status


async def _merge_patch(client: KubeClient, resource: Resource, namespace: str, name: str, patch: Any) -> int:
    path = resource.path(namespace=namespace, name=name)
    try:
        response = await client.request(
            "PATCH", path, body=msgspec.json.encode(patch), content_type="application/merge-patch+json"
        )
    except KubeApiError as exc:
        return exc.status
    return response.status


async def _read(
    client: KubeClient, method: str, path: str, *, accept: str | None = None, **params: str
) -> tuple[int, bytes]:
    try:
        response = await client.request(method, path, params=params or None, accept=accept)
    except KubeApiError as exc:
        return exc.status, exc.message.encode()
    return response.status, response.body


def _admin_create(admin: kube_client.ApiClient, body: dict[str, Any]) -> None:
    crds.apply_objects(admin, [body], field_manager="someone-else")


# ------------------------------------------------------------------------------------- a stolen applier token


@pytest.mark.parametrize("resource", KINDS, ids=lambda r: r.kind)
async def test_a_stolen_applier_token_writes_nothing_into_excluded_namespaces(
    resource: Resource, applier: KubeClient, admin: kube_client.ApiClient
) -> None:
    """Not even with a controller reference to a TrainJob: the namespace alone refuses it, create or apply."""
    for excluded in EXCLUDED:
        job = _trainjob(admin, excluded, f"tj-{uuid.uuid4().hex[:6]}")
        body = _object(resource, f"x-{uuid.uuid4().hex[:6]}", excluded, [_controller(job)])
        assert await _create(applier, body) == 403, excluded
        if resource is not resources.SECRET:  # an apply of a Secret is refused by RBAC alone (no patch)
            assert await _apply(applier, body) == 403, excluded


@pytest.mark.parametrize("resource", KINDS, ids=lambda r: r.kind)
async def test_a_stolen_applier_token_writes_only_objects_a_trainjob_controls(
    resource: Resource, applier: KubeClient, admin: kube_client.ApiClient, namespace: str
) -> None:
    job = _trainjob(admin, namespace, "tj")
    other = {"apiVersion": "v1", "kind": "ConfigMap", "name": "cm", "uid": str(uuid.uuid4()), "controller": True}
    not_controller = {**_controller(job), "controller": False}
    refused = {
        "no owner": [],
        "controlled by a ConfigMap": [other],
        "a TrainJob owner, not the controller": [not_controller],
    }
    for why, owners in refused.items():
        body = _object(resource, f"r-{uuid.uuid4().hex[:6]}", namespace, owners)
        assert await _create(applier, body) == 403, why
    # The one write it may make: a component of a TrainJob, in the TrainJob's namespace.
    assert await _create(applier, _object(resource, "mine", namespace, [_controller(job)])) == 201


@pytest.mark.parametrize("resource", [r for r in KINDS if r is not resources.SECRET], ids=lambda r: r.kind)
async def test_a_stolen_applier_token_cannot_take_over_or_move_an_object(
    resource: Resource, applier: KubeClient, admin: kube_client.ApiClient, namespace: str
) -> None:
    """An existing object nobody, or another TrainJob, controls stays theirs, whatever the write claims."""
    first, second = _trainjob(admin, namespace, "first"), _trainjob(admin, namespace, "second")
    _admin_create(admin, _object(resource, "foreign", namespace, []))
    assert await _apply(applier, _object(resource, "foreign", namespace, [_controller(first)])) == 403
    _admin_create(admin, _object(resource, "firsts", namespace, [_controller(first)]))
    # A merge patch replaces the whole list: the object would move from the first TrainJob to the second.
    move = {"metadata": {"ownerReferences": [_controller(second)]}}
    assert await _merge_patch(applier, resource, namespace, "firsts", move) == 403
    # Its own TrainJob's object it may change.
    assert await _apply(applier, _object(resource, "firsts", namespace, [_controller(first)])) == 200


async def test_a_stolen_applier_token_reads_no_secret_not_even_its_own(
    applier: KubeClient, admin: kube_client.ApiClient, namespace: str
) -> None:
    job = _trainjob(admin, namespace, "tj")
    _admin_create(admin, _object(resources.SECRET, "foreign", namespace, []))
    assert await _create(applier, _object(resources.SECRET, "mine", namespace, [_controller(job)])) == 201
    path = resources.SECRET.path(namespace=namespace)
    for name in ("foreign", "mine"):
        assert (await _read(applier, "GET", f"{path}/{name}"))[0] == 403
    assert (await _read(applier, "GET", path))[0] == 403
    assert (await _read(applier, "GET", resources.SECRET.path()))[0] == 403
    assert (await _read(applier, "GET", path, watch="true"))[0] == 403
    # An apply or patch would answer with the whole Secret: refused by RBAC before anything is read.
    assert await _apply(applier, _object(resources.SECRET, "foreign", namespace, [_controller(job)])) == 403
    assert await _apply(applier, _object(resources.SECRET, "mine", namespace, [_controller(job)])) == 403
    # A second create of an existing Secret says only that it exists.
    status, _ = await _read_create_conflict(
        applier, _object(resources.SECRET, "foreign", namespace, [_controller(job)])
    )
    assert status == 409


async def _read_create_conflict(client: KubeClient, body: dict[str, Any]) -> tuple[int, str]:
    try:
        await client.create(resources.SECRET, namespace=body["metadata"]["namespace"], body=msgspec.json.encode(body))
    except KubeApiError as exc:
        assert "c2VjcmV0" not in exc.message
        return exc.status, exc.reason
    return 201, ""


# ------------------------------------------------------------------------------------- a stolen watcher token


async def test_a_stolen_watcher_token_reads_no_secret_data(
    watcher: KubeClient, admin: kube_client.ApiClient, namespace: str
) -> None:
    job = _trainjob(admin, namespace, "tj")
    _admin_create(admin, _object(resources.SECRET, "s", namespace, [_controller(job)]))
    for path in (resources.SECRET.path(namespace=namespace), resources.SECRET.path()):
        for params in ({}, {"watch": "true"}, {"accept": METADATA_LIST_ACCEPT}):
            status, body = await _read(watcher, "GET", path, **params)
            assert status == 403 and b"c2VjcmV0" not in body, (path, params)
    assert (await _read(watcher, "GET", f"{resources.SECRET.path(namespace=namespace)}/s"))[0] == 403
    # What it needs it still has.
    assert (await _read(watcher, "GET", resources.TRAINJOB.path(namespace=namespace)))[0] == 200
    assert await _create(watcher, _object(resources.CONFIG_MAP, "w", namespace, [_controller(job)])) == 403


# ------------------------------------------------------------------------ the pipeline, as its own identities


def _coscheduling_runtime(name: str) -> dict[str, Any]:
    runtime = copy.deepcopy(crds.shipped_runtimes()["torch-distributed"])
    runtime["metadata"] = {"name": name}
    runtime["spec"]["podGroupPolicy"] = {"coscheduling": {"scheduleTimeoutSeconds": 120}}
    return runtime


@pytest.fixture
def pipeline(identities: LocalKube, tmp_path: Path) -> Iterator[Pipeline]:
    pipe = open_pipeline(
        identities, tmp_path / "pipe", runtimes=("torch-distributed", "deepspeed-distributed"), own_identities=True
    )
    try:
        yield pipe
    finally:
        print(close_pipeline(pipe))


async def test_the_services_build_every_component_as_their_own_service_accounts(pipeline: Pipeline) -> None:
    kubeconfigs = pipeline.stack.service_kubeconfigs
    assert kubeconfigs is not None
    assert "KUBECONFIG" not in pipeline.stack.service_env("planner")
    assert pipeline.stack.service_env("applier")["KUBECONFIG"] == str(kubeconfigs.path("applier").resolve())
    runtime = f"cosched-{uuid.uuid4().hex[:6]}"
    crds.apply_objects(pipeline.api, [_coscheduling_runtime(runtime)], field_manager="test")
    pipeline.start_all()
    pipeline.create(trainjob("torch"))
    pipeline.create(trainjob("mpi", runtime="deepspeed-distributed", num_nodes=2))
    pipeline.create(trainjob("gang", runtime=runtime, runtime_kind="ClusterTrainingRuntime"))
    # MPI runs its launcher as a node, so only the torch jobs' node counts are compared (``converged``).
    await until(lambda: converged(pipeline, ["torch", "gang"]), timeout=120, what="the torch JobSets")
    await until(lambda: "mpi" in pipeline.jobsets(), timeout=60, what="the MPI JobSet")
    secret = pipeline.get("v1", "Secret", "mpi-mpi-ssh-auth")
    assert secret["type"] == "kubernetes.io/ssh-auth" and set(secret["data"]) >= {"ssh-privatekey", "ssh-publickey"}
    assert {m["manager"] for m in secret["metadata"]["managedFields"]} == {"trainer"}
    assert pipeline.get_or_none("v1", "ConfigMap", "mpi-mpi-hostfile") is not None
    podgroup = pipeline.get(resources.POD_GROUP.api_version, "PodGroup", "gang")
    assert podgroup["metadata"]["ownerReferences"][0]["name"] == "gang"
    for name in ("torch", "mpi", "gang"):
        assert pipeline.get_or_none("v1", "ConfigMap", f"{name}-runtime-snapshot") is not None
        assert condition_of(pipeline.get(TRAINER, "TrainJob", name), "ComponentsApplied") is None
    assert pipeline.get(JOBSET, "JobSet", "mpi")["metadata"]["ownerReferences"][0]["name"] == "mpi"


async def test_the_running_applier_is_refused_in_an_excluded_namespace(pipeline: Pipeline) -> None:
    """The services really run under the policies: a TrainJob in ``kube-public`` (a real one, the target checks
    pass) gets nothing built, because the API server refuses the applier's writes there."""
    name = f"tj-{uuid.uuid4().hex[:6]}"
    excluded = "kube-public"
    pipeline.start_all()
    pipeline.stack.start_service(
        "watcher", name="watcher-excluded", extra=["--metrics-port", "0", "--namespace", excluded]
    )
    body = {**trainjob(name), "metadata": {"name": name, "namespace": excluded}}
    kube_client.CustomObjectsApi(pipeline.api).create_namespaced_custom_object(
        "trainer.kubeflow.org", "v1alpha1", excluded, "trainjobs", body
    )
    nc = await pipeline.connect()
    try:
        js = nc.jetstream()

        async def refused() -> list[Any]:
            return [d for d in await dead_letters(js, excluded) if d.reason == "permanent"]

        letters = await until_async(refused, timeout=90, what="the applier's refused writes")
    finally:
        await nc.close()
    assert any(f"the pipeline writes nothing in namespace {excluded}" in d.error for d in letters), letters
    objects = kube_client.CustomObjectsApi(pipeline.api)
    with pytest.raises(kube_client.ApiException):
        objects.get_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", excluded, "jobsets", name)
    snapshot = f"{name}-runtime-snapshot"
    with pytest.raises(kube_client.ApiException):
        kube_client.CoreV1Api(pipeline.api).read_namespaced_config_map(snapshot, excluded)
