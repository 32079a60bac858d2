"""Two simulated clusters, each running the real pipeline, joined to a hub of three nats-servers as leaf nodes.

Each member is what ``tjpipe up --simulate`` runs for one cluster: its own etcd and kube-apiserver with the
CRDs and Trainer's runtimes, kube-controller-manager, kube-scheduler, JobSet's manager and kwok nodes whose
pods succeed after a few seconds (``tjpipe.local.cluster.start_simulated_cluster``), and the watcher, planner
and applier as subprocesses (``faults.support.open_pipeline``, the watcher limited to one namespace). Its NATS
is the member server of a loopback fleet (``tjpipe.local.fleet.start_fleet``): its own JetStream domain (the
cluster's name), one leaf remote to the hub over mutual TLS with the member's leaf seed, and the authorization
block a lone cluster has, so each stage runs as its own identity. Both clusters use the same namespace, so
the same namespace and name exist in both.

Started once for the module (the clusters and the fleet at the same time, in threads), stopped in reverse:
the services, then the fleet's servers, then the clusters.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable, Iterator

import pytest
from faults.support import close_pipeline, open_pipeline

from tjpipe.local.cluster import SimulatedCluster, start_simulated_cluster
from tjpipe.local.crds import crd_manifests
from tjpipe.local.fleet import LocalFleet, start_fleet

from .support import CLUSTERS, NAMESPACE, POD_RUN_SECONDS, Member, World


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, uncaptured_progress: Callable[[str], None]) -> Iterator[World]:
    root = tmp_path_factory.mktemp("fleet-e2e")
    crd_manifests(progress=uncaptured_progress)  # built or found once, before two threads read them

    def cluster(name: str) -> SimulatedCluster:
        return start_simulated_cluster(
            work_dir=root / name / "cluster",
            log_dir=root / name / "logs",
            kubeconfig_path=root / name / "kubeconfig",
            progress=lambda line: None,
            pod_run_seconds=POD_RUN_SECONDS,
        )

    clusters: dict[str, SimulatedCluster] = {}
    running: LocalFleet | None = None
    members: dict[str, Member] = {}
    try:
        with concurrent.futures.ThreadPoolExecutor(max_workers=len(CLUSTERS) + 1) as pool:
            futures = {name: pool.submit(cluster, name) for name in CLUSTERS}
            fleet_future = pool.submit(start_fleet, root / "fleet", CLUSTERS)
            # Each result is taken, so that whatever started is stopped below even when another start failed.
            failures: list[BaseException] = []
            for name, future in futures.items():
                try:
                    clusters[name] = future.result()
                except BaseException as exc:
                    failures.append(exc)
            try:
                running = fleet_future.result()
            except BaseException as exc:
                failures.append(exc)
            if failures:
                raise failures[0]
        assert running is not None
        for name in CLUSTERS:
            server = running.members[name]
            pipe = open_pipeline(
                clusters[name].kube,
                root / name / "pipeline",
                bus=(server.server, server.creds),
                namespace=NAMESPACE,
            )
            members[name] = Member(name=name, cluster=clusters[name], pipe=pipe, server=server)
            pipe.start_all()
        uncaptured_progress(
            "fleet e2e: a hub of 3 nats-servers; members "
            + ", ".join(
                f"{m.name} (apiserver {m.cluster.kube.server}, NATS {m.server.server.url})" for m in members.values()
            )
        )
        yield World(fleet=running, members=members)
    finally:
        for member in members.values():
            print(f"--- {member.name}'s services ---\n{close_pipeline(member.pipe)}")
        if running is not None:
            running.stop()
        for started in clusters.values():
            started.stop()
