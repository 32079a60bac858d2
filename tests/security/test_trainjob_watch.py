"""The applier's TrainJob checks answered from a watch of TrainJobs, on the session's real API server.

The watch is the cluster's own account of each TrainJob, so a message naming a TrainJob the watch knows by
the same uid costs no read of it; anything else is read, as it was before the watch: a uid the watch does
not know (the TrainJob replaced, or created a moment ago), a TrainJob the watch saw deleted, and every
check while the watch is not current. An applier whose role still lacks ``watch`` on TrainJobs (a
deployment not yet given the new rule) keeps working on reads alone. Where the pipeline is confined to some
namespaces (``TJPIPE_NAMESPACES``) and its role is a Role in each, the watch is of those namespaces.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from faults.support import trainjob
from kubernetes import client as kube_client

from applier.errors import TrainJobGone
from applier.trainjob_watch import WatchedTrainJobs
from applier.trainjobs import TrainJobs
from contracts import resources
from contracts.kube import ConfigMap
from contracts.messages import ApplyConfigMap, ObjectKey, Target
from contracts.resources import Resource
from plumbing.kube import KubeClient, KubeConfig

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]


class ReadCountingKube(KubeClient):
    """The project's client, counting its GETs of TrainJobs."""

    trainjob_reads = 0

    async def get(self, resource: Resource, *, namespace: str | None, name: str) -> bytes | None:
        if resource is resources.TRAINJOB:
            self.trainjob_reads += 1
        return await super().get(resource, namespace=namespace, name=name)


def _create_trainjob(api: kube_client.ApiClient, namespace: str, name: str) -> str:
    body = trainjob(name)
    created = kube_client.CustomObjectsApi(api).create_namespaced_custom_object(
        "trainer.kubeflow.org", "v1alpha1", namespace, "trainjobs", body
    )
    uid: str = created["metadata"]["uid"]
    return uid


def _delete_trainjob(api: kube_client.ApiClient, namespace: str, name: str) -> None:
    kube_client.CustomObjectsApi(api).delete_namespaced_custom_object(
        "trainer.kubeflow.org", "v1alpha1", namespace, "trainjobs", name
    )


def _message(namespace: str, name: str, uid: str) -> ApplyConfigMap:
    return ApplyConfigMap(
        trainjob=ObjectKey(namespace=namespace, name=name),
        trainjob_uid=uid,
        source_seq=1,
        source_version=1,
        target=Target(api_version="v1", kind="ConfigMap", namespace=namespace, name=f"{name}-cm"),
        object=ConfigMap(api_version="v1", kind="ConfigMap"),
    )


async def _until(what: Callable[[], bool], why: str, seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while not what():
        assert time.monotonic() < deadline, why
        await asyncio.sleep(0.02)


def _service_account_config(kube: Any, core: kube_client.CoreV1Api, namespace: str, account: str) -> KubeConfig:
    """A new ServiceAccount in ``namespace`` and a client configuration that acts as it."""
    core.create_namespaced_service_account(
        namespace, kube_client.V1ServiceAccount(metadata=kube_client.V1ObjectMeta(name=account))
    )
    review = core.create_namespaced_service_account_token(
        account,
        namespace,
        kube_client.AuthenticationV1TokenRequest(spec=kube_client.V1TokenRequestSpec(audiences=[])),
    )
    admin = KubeConfig.load(str(kube.kubeconfig))
    return KubeConfig(server=admin.server, token=review.status.token, ca_file=admin.ca_file)


@contextlib.asynccontextmanager
async def _following(client: KubeClient, namespaces: tuple[str, ...] = ()) -> AsyncIterator[WatchedTrainJobs]:
    watched = WatchedTrainJobs(client, namespaces=namespaces)
    task = asyncio.create_task(watched.run())
    try:
        yield watched
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_trainjob_the_watch_knows_is_not_read_and_anything_else_is(kube: Any, namespace: str) -> None:
    config = KubeConfig.load(str(kube.kubeconfig))
    with kube.api_client() as api:
        first_uid = _create_trainjob(api, namespace, "first")
        async with ReadCountingKube(config) as client, _following(client) as watched:
            await asyncio.wait_for(watched.synced(), 20)
            checks = TrainJobs(client, cache_seconds=0.0, watched=watched)

            # Known by its uid: answered from the watch, again and again, with no read.
            for _ in range(3):
                facts = await checks.verify(_message(namespace, "first", first_uid))
                assert facts.uid == first_uid and facts.runtime == "torch-distributed"
            assert client.trainjob_reads == 0

            # Another uid for the same name: read, and refused as gone, never taken from the watch.
            with pytest.raises(TrainJobGone):
                await checks.verify(_message(namespace, "first", "00000000-0000-0000-0000-000000000000"))
            assert client.trainjob_reads >= 1

            # Created after the watch's list: the watch brings it, and it is not read either.
            second_uid = _create_trainjob(api, namespace, "second")
            key = (namespace, "second")
            await _until(lambda: key in watched.facts, "the watch never brought the new TrainJob")
            reads = client.trainjob_reads
            await checks.verify(_message(namespace, "second", second_uid))
            assert client.trainjob_reads == reads

            # Deleted: the watch forgets it, so the next check reads and finds it gone.
            _delete_trainjob(api, namespace, "second")
            await _until(lambda: key not in watched.facts, "the watch never reported the deletion")
            with pytest.raises(TrainJobGone):
                await checks.verify(_message(namespace, "second", second_uid))
            assert client.trainjob_reads > reads

            # A watch that is not current answers nothing: every check reads.
            watched.informers[None].current = False
            reads = client.trainjob_reads
            await checks.verify(_message(namespace, "first", first_uid))
            assert client.trainjob_reads == reads + 1


async def test_an_applier_whose_role_lacks_watch_checks_by_reading(kube: Any, namespace: str) -> None:
    """Its role as before the watch (get and list on TrainJobs): it does not watch, and reads serve."""
    suffix = secrets.token_hex(3)
    role, account = f"tjpipe-test-no-watch-{suffix}", "applier-without-watch"
    with kube.api_client() as api:
        core, rbac = kube_client.CoreV1Api(api), kube_client.RbacAuthorizationV1Api(api)
        rule = kube_client.V1PolicyRule(
            api_groups=["trainer.kubeflow.org"], resources=["trainjobs"], verbs=["get", "list"]
        )
        rbac.create_cluster_role(kube_client.V1ClusterRole(metadata=kube_client.V1ObjectMeta(name=role), rules=[rule]))
        rbac.create_cluster_role_binding(
            kube_client.V1ClusterRoleBinding(
                metadata=kube_client.V1ObjectMeta(name=role),
                role_ref=kube_client.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="ClusterRole", name=role),
                subjects=[kube_client.RbacV1Subject(kind="ServiceAccount", name=account, namespace=namespace)],
            )
        )
        try:
            limited = _service_account_config(kube, core, namespace, account)
            uid = _create_trainjob(api, namespace, "tj")
            async with ReadCountingKube(limited) as client, _following(client) as watched:
                checks = TrainJobs(client, cache_seconds=0.0, watched=watched)
                for _ in range(3):
                    reads = client.trainjob_reads
                    facts = await checks.verify(_message(namespace, "tj", uid))
                    assert facts.uid == uid
                    assert client.trainjob_reads == reads + 1
                    await asyncio.sleep(0.5)
                # It asked, was told no, and never listed TrainJobs at all (no list every few seconds either).
                assert not watched.informers[None].synced.is_set() and not watched.informers[None].current
                assert not watched.facts
        finally:
            rbac.delete_cluster_role_binding(role)
            rbac.delete_cluster_role(role)


async def test_an_applier_confined_to_namespaces_watches_them_with_a_role_there(kube: Any, namespace: str) -> None:
    """TJPIPE_NAMESPACES with the applier's rules in a Role of that namespace (README, Security): a watch of the
    whole cluster would be refused, the namespace's watch is not, and answers the checks there."""
    suffix = secrets.token_hex(3)
    role, account = f"tjpipe-test-namespaced-{suffix}", "applier-in-one-namespace"
    with kube.api_client() as api:
        core, rbac = kube_client.CoreV1Api(api), kube_client.RbacAuthorizationV1Api(api)
        rule = kube_client.V1PolicyRule(
            api_groups=["trainer.kubeflow.org"], resources=["trainjobs"], verbs=["get", "list", "watch"]
        )
        rbac.create_namespaced_role(
            namespace, kube_client.V1Role(metadata=kube_client.V1ObjectMeta(name=role), rules=[rule])
        )
        rbac.create_namespaced_role_binding(
            namespace,
            kube_client.V1RoleBinding(
                metadata=kube_client.V1ObjectMeta(name=role),
                role_ref=kube_client.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="Role", name=role),
                subjects=[kube_client.RbacV1Subject(kind="ServiceAccount", name=account, namespace=namespace)],
            ),
        )
        limited = _service_account_config(kube, core, namespace, account)
        uid = _create_trainjob(api, namespace, "tj")
        async with ReadCountingKube(limited) as client:
            assert not await WatchedTrainJobs(client)._may_watch(None)
            async with _following(client, (namespace,)) as watched:
                assert list(watched.informers) == [namespace]
                await asyncio.wait_for(watched.synced(), 20)
                checks = TrainJobs(client, cache_seconds=0.0, watched=watched)
                for _ in range(3):
                    assert (await checks.verify(_message(namespace, "tj", uid))).uid == uid
                assert client.trainjob_reads == 0
                # A TrainJob outside the namespaces is nothing the watch answers for: a check there reads.
                assert watched.known(("elsewhere", "tj"), uid) is None
