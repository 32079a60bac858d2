"""The install page's commands, run as a platform team would paste them, against a real kube-apiserver.

Every shell block of ``docs/install.md`` is run here in page order, from the repository's top folder (the page
says to run from the checkout), or is marked ``<!-- not run: REASON -->`` right above it, or ``<!-- real node:
REASON -->`` when it needs pods that run (``tests/real_node/test_install.py`` runs those, with all the others, on
a cluster with a real node). The block marked ``<!-- run: last -->`` (the uninstall) runs after the others, even
when one of them failed.

What stands in for the platform team's cluster: an API server and etcd of this test's own (not the session's:
the install registers a webhook configuration with ``failurePolicy: Fail`` and admission policies, which must
not reach other tests), with Trainer's and JobSet's CRDs, and Trainer's install as the page expects to find it:
the namespace ``kubeflow-system`` with Trainer's and JobSet's controller Deployments and Trainer's two webhook
configurations. Those Deployments never run (no node), and need not: the page's commands scale, delete and
replace them, which is what is checked. ``HOME`` is a folder of the test's, so the secrets the page makes in
``~/trainjob-pipeline-secrets`` never touch the developer's; the Go and build caches stay the machine's.
``kubectl`` is built from the same Kubernetes release as the API server (``ensure_kubectl``).

Bounded: each block has a timeout; warm, the whole run is about a minute (most of it the kustomize render).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from kubernetes import client as kube_client

from tjpipe.local.crds import crd_manifests, install_crds
from tjpipe.local.kubeapi import start_kube
from tjpipe.local.toolchain import cache_root, ensure_kubectl

from .support import INSTALL_PAGE, Block, assert_ran, blocks, install_env, run_block, trainer_install

PAGE = INSTALL_PAGE
IMAGE = "registry.example.com/platform/trainjob-pipeline:0.1.0"
pytestmark = [pytest.mark.cluster]


def _split() -> tuple[list[Block], list[Block]]:
    every = blocks(PAGE)
    return [b for b in every if b.marker == ""], [b for b in every if b.marker == "run"]


def test_every_block_is_run_or_says_why_not() -> None:
    for block in blocks(PAGE):
        where = f"docs/{PAGE}:{block.line}"
        if block.marker in ("not run", "real node"):
            assert block.note, f"{where}: say why it is not run here"
        elif block.marker == "run":
            assert block.note == "last", f"{where}: the one run marker is 'run: last'"
    first, last = _split()
    commands = " ".join(b.text for b in first)
    for step in ("tjpipe keys init", "tjpipe nats-credentials", "kubectl apply --server-side", "scale deployment"):
        assert step in commands, f"the install page runs no '{step}'"
    assert [b for b in last if "kubectl delete -k deploy/base" in b.text], "the uninstall runs last"


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, uncaptured_progress: Callable[[str], None]
) -> Iterator[tuple[kube_client.ApiClient, dict[str, str]]]:
    root = tmp_path_factory.mktemp("install")
    kubectl = ensure_kubectl(progress=uncaptured_progress)
    local = start_kube(
        work_dir=root / "kube", log_dir=root / "logs", kubeconfig_path=root / "kubeconfig", progress=uncaptured_progress
    )
    try:
        env = install_env(root, kubeconfig=local.kubeconfig, kubectl=kubectl, cache_dir=cache_root())
        with local.api_client() as api:
            install_crds(api, crd_manifests())
            trainer_install(api)
            yield api, env
            _, last = _split()
            for block in last:
                assert_ran(block, run_block(block, env, timeout=300))
            rbac = kube_client.RbacAuthorizationV1Api(api)
            left = [r.metadata.name for r in rbac.list_cluster_role().items if r.metadata.name.startswith("tjpipe-")]
            assert left == [], f"the uninstall left ClusterRoles: {left}"
    finally:
        local.stop()


def test_the_install_pages_commands_run_on_a_real_api_server(
    cluster: tuple[kube_client.ApiClient, dict[str, str]],
) -> None:
    api, env = cluster
    apps = kube_client.AppsV1Api(api)
    first, _ = _split()
    for block in first:
        assert_ran(block, run_block(block, env, timeout=600))

    trainer = apps.read_namespaced_deployment("kubeflow-trainer-controller-manager", "kubeflow-system")
    assert trainer.spec.replicas == 0, "Trainer's controller still runs beside the pipeline"
    admission = kube_client.AdmissionregistrationV1Api(api)
    assert [w.metadata.name for w in admission.list_mutating_webhook_configuration().items] == []
    hooks = {w.metadata.name: w for w in admission.list_validating_webhook_configuration().items}
    assert "validator.trainer.kubeflow.org" not in hooks

    deployments = apps.list_namespaced_deployment("trainjob-pipeline").items
    names = {d.metadata.name for d in deployments}
    assert {"tjpipe-watcher", "tjpipe-planner", "tjpipe-applier", "tjpipe-webhook"} <= names
    assert {"tjpipe-status-server", "tjpipe-history-server"} <= names
    images = {c.image for d in deployments for c in d.spec.template.spec.containers}
    assert images == {IMAGE}, images
    # The hand-back stops every Deployment of the pipeline, not only the three services.
    assert {d.metadata.name: d.spec.replicas for d in deployments} == dict.fromkeys(names, 0)

    secrets = {s.metadata.name for s in kube_client.CoreV1Api(api).list_namespaced_secret("trainjob-pipeline").items}
    identities = ("watcher", "planner", "applier", "admin", "reader", "status-server", "log-keeper")
    assert {f"tjpipe-{s}-nats-creds" for s in identities} <= secrets
    assert {"nats-auth", "nats-tls", "tjpipe-webhook-tls", "tjpipe-status-server-tls", "tjpipe-history-tls"} <= secrets
    assert not any(secret.startswith("tjpipe-dlq-operator") for secret in secrets), "dlq-operator stays with people"
