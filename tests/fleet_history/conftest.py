"""A fleet's history server on real servers: two clusters, each its own kube-apiserver and etcd, a hub of
three nats-servers sourcing both members' record streams, and ``tjpipe history-server --fleet-clusters``.

Both clusters have a namespace ``team-x`` and a TrainJob ``shared`` in it (besides ``alpha`` in A and
``beta`` in B); the two ``shared`` are told apart only by their training loss (0.1234 in A, 8.7654 in B) and by
the cluster they are filed under. Each cluster has its own ``viewer`` ServiceAccount in ``team-x``, bound to
read TrainJobs there, and a ``history-reviewer`` ServiceAccount whose ClusterRole allows creating
TokenReviews and SubjectAccessReviews and nothing else: the server's only credential for that cluster.
Cluster A is configured by server, CA and token file; cluster B by a kubeconfig.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from history.progress_support import progress_record
from history.support import Server, record, run_async, start_server
from kubernetes import client as kube_client

from contracts import subjects
from tjpipe import fleet_nats
from tjpipe.local.fleet import LocalFleet as Fleet
from tjpipe.local.fleet import LocalMember as Member
from tjpipe.local.fleet import start_fleet
from tjpipe.local.kubeapi import LocalKube, start_kube
from tjpipe.private_files import write_private_file

pytestmark = [pytest.mark.cluster, pytest.mark.nats]

NAMESPACE = "team-x"
LOSS = {"a": "0.1234", "b": "8.7654"}
"""The training loss each cluster's ``shared`` reported: what tells the two apart."""
OWN = {"a": "alpha", "b": "beta"}
REVIEWER_RULES = [
    kube_client.V1PolicyRule(api_groups=["authentication.k8s.io"], resources=["tokenreviews"], verbs=["create"]),
    kube_client.V1PolicyRule(api_groups=["authorization.k8s.io"], resources=["subjectaccessreviews"], verbs=["create"]),
]
READ_TRAINJOBS = kube_client.V1PolicyRule(
    api_groups=["trainer.kubeflow.org"], resources=["trainjobs"], verbs=["get", "list"]
)


@dataclass
class Cluster:
    name: str
    kube: LocalKube
    api: Any
    viewer: str
    """The token of ``viewer`` in ``team-x``, issued by this cluster."""
    reviewer: str


@dataclass
class World:
    fleet: Fleet
    clusters: dict[str, Cluster]
    server: Server
    hub_url: str
    reader_seed: Path
    event_seqs: dict[str, tuple[int, ...]]
    """``alpha``'s (A) and ``beta``'s (B) event sequences in their member's work stream."""


def _token(core: kube_client.CoreV1Api, namespace: str, name: str) -> str:
    request = kube_client.AuthenticationV1TokenRequest(
        spec=kube_client.V1TokenRequestSpec(audiences=[], expiration_seconds=3600)
    )
    token: str = core.create_namespaced_service_account_token(name, namespace, request).status.token
    return token


def _prepare(name: str, kube: LocalKube) -> Cluster:
    """The namespace, the viewer bound in it, and the reviewer with its two create rights only."""
    api = kube.api_client()
    core, rbac = kube_client.CoreV1Api(api), kube_client.RbacAuthorizationV1Api(api)
    meta = kube_client.V1ObjectMeta
    for ns in (NAMESPACE, "tjpipe-system"):
        core.create_namespace(kube_client.V1Namespace(metadata=meta(name=ns)))
    core.create_namespaced_service_account(NAMESPACE, kube_client.V1ServiceAccount(metadata=meta(name="viewer")))
    rbac.create_namespaced_role(NAMESPACE, kube_client.V1Role(metadata=meta(name="reader"), rules=[READ_TRAINJOBS]))
    rbac.create_namespaced_role_binding(
        NAMESPACE,
        kube_client.V1RoleBinding(
            metadata=meta(name="reader"),
            role_ref=kube_client.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="Role", name="reader"),
            subjects=[kube_client.RbacV1Subject(kind="ServiceAccount", name="viewer", namespace=NAMESPACE)],
        ),
    )
    core.create_namespaced_service_account(
        "tjpipe-system", kube_client.V1ServiceAccount(metadata=meta(name="history-reviewer"))
    )
    rbac.create_cluster_role(kube_client.V1ClusterRole(metadata=meta(name="history-reviewer"), rules=REVIEWER_RULES))
    rbac.create_cluster_role_binding(
        kube_client.V1ClusterRoleBinding(
            metadata=meta(name="history-reviewer"),
            role_ref=kube_client.V1RoleRef(
                api_group="rbac.authorization.k8s.io", kind="ClusterRole", name="history-reviewer"
            ),
            subjects=[
                kube_client.RbacV1Subject(kind="ServiceAccount", name="history-reviewer", namespace="tjpipe-system")
            ],
        )
    )
    return Cluster(
        name=name,
        kube=kube,
        api=api,
        viewer=_token(core, NAMESPACE, "viewer"),
        reviewer=_token(core, "tjpipe-system", "history-reviewer"),
    )


async def _record(member: Member, cluster: str) -> tuple[int, ...]:
    nc = await member.connect("admin")
    try:
        js = nc.jetstream()
        own = await record(js, NAMESPACE, OWN[cluster])
        await record(js, NAMESPACE, "shared")
        data = progress_record(NAMESPACE, "shared", pod="shared-node-0-0", percent=50, metrics={"loss": LOSS[cluster]})
        await js.publish(subjects.progress_subject(NAMESPACE, "shared"), data)
        return own.event_seqs
    finally:
        await nc.close()


async def _hub_caught_up(running: Fleet) -> None:
    nc = await running.hub_connect()
    try:
        await fleet_nats.wait_caught_up(nc.jetstream(), timeout=60)
    finally:
        await nc.close()


def _fleet_file(folder: Path, a: Cluster, b: Cluster) -> Path:
    write_private_file(folder / "a.token", a.reviewer.encode())
    kubeconfig = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "b", "cluster": {"server": b.kube.server, "certificate-authority": str(b.kube.ca_file)}}],
        "users": [{"name": "reviewer", "user": {"token": b.reviewer}}],
        "contexts": [{"name": "b", "context": {"cluster": "b", "user": "reviewer"}}],
        "current-context": "b",
    }
    write_private_file(folder / "b.kubeconfig", yaml.safe_dump(kubeconfig).encode())
    doc = {
        "clusters": [
            {"name": "a", "server": a.kube.server, "certificateAuthority": str(a.kube.ca_file), "tokenFile": "a.token"},
            {"name": "b", "kubeconfig": "b.kubeconfig"},
        ]
    }
    path = folder / "fleet.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    root = tmp_path_factory.mktemp("fleet-history")
    logs = root / "logs"

    def kube(name: str) -> LocalKube:
        return start_kube(
            work_dir=root / f"kube-{name}",
            log_dir=logs / name,
            kubeconfig_path=root / f"{name}.kubeconfig",
            progress=lambda line: None,
        )

    with concurrent.futures.ThreadPoolExecutor(max_workers=3) as pool:
        kubes = {name: pool.submit(kube, name) for name in ("a", "b")}
        running_future = pool.submit(start_fleet, root / "fleet", ("a", "b"))
    # Every start has ended here; what did start is stopped if another failed, or its servers would outlive
    # the tests.
    started = {name: f.result() for name, f in kubes.items() if f.exception() is None}
    try:
        for f in kubes.values():
            f.result()
        running = running_future.result()
    except BaseException:
        for kube_ in started.values():
            kube_.stop()
        raise
    server: Server | None = None
    clusters: dict[str, Cluster] = {}
    try:
        clusters = {name: _prepare(name, kube) for name, kube in started.items()}
        seqs = {name: run_async(lambda name=name: _record(running.members[name], name)) for name in ("a", "b")}
        run_async(lambda: _hub_caught_up(running))
        hub_url = running.hub.url.split(",")[0]
        reader_seed = running.creds.hub_seed(fleet_nats.HUB_READER)
        server = start_server(
            nats_url=hub_url,
            reader_creds=reader_seed,
            kubeconfig=root / "no-such-kubeconfig",  # a fleet's server uses each cluster's own credential only
            log_dir=root / "server",
            extra=(
                "--fleet-clusters",
                str(_fleet_file(root, clusters["a"], clusters["b"])),
                "--auth-cache-seconds",
                "1",
            ),
        )
        yield World(
            fleet=running, clusters=clusters, server=server, hub_url=hub_url, reader_seed=reader_seed, event_seqs=seqs
        )
    finally:
        if server is not None:
            server.process.stop()
            log = server.log.read_text(errors="replace")
            tokens = [t for c in clusters.values() for t in (c.viewer, c.reviewer)]
            assert not any(t in log for t in tokens), "the server's log holds a token"
        running.stop()
        for kube_ in started.values():
            kube_.stop()
