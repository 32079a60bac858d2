"""The install page, run for real: ``docs/install.md``'s own commands install the pipeline onto a real node.

The cluster is what a platform team has: an apiserver with Trainer's and JobSet's CRDs, JobSet's controller
running, the controllers and scheduler, and one real node (``tjpipe.local.realnode``: kubelet, containerd, CNI,
kube-proxy, CoreDNS), on which every pod of the install really runs: the NATS servers, the set-up Job, the
watcher, planner, applier, webhook, status server and history server, and a TrainJob's training pod.

The page's blocks are those ``tests/docs/test_install.py`` runs against an API server alone (the same
extraction, ``docs.support.blocks``), and those marked ``<!-- real node: ... -->`` there, which need running
pods, in page order, up to "Hand back to Trainer"; then this test checks what the page promises of a running
install, and runs the rest of the page (hand back, uninstall) as that test does. Where this machine differs
from a platform team's cluster, the test says so here, never by changing a command:

* No registry: step 3's ``docker build`` + ``docker push`` is not run. The same image (the Dockerfile's
  ``runtime`` target, with the Debian stand-in for its Python base) and the NATS stand-in are built here
  (``tools/node_images.py --pipeline``) and loaded into the node's containerd under the names the page and
  ``deploy/`` use, which is what a pull would have left there.
* Storage: the NATS servers' claims are bound to local volumes on the node (folders in this test's own
  directory), as a cluster without a storage provisioner does it.
* Trainer's install: as in ``tests/docs/test_install.py`` (``trainer_install``), with its Deployments at zero
  replicas (their images are names only; JobSet's controller runs on this machine instead).

Bounded: every wait has a timeout; the cluster, the images and the install are made once for the module.
"""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from budgets.costs import READ_VERBS, audit_flags, audit_requests
from docs.support import (
    INSTALL_PAGE,
    Block,
    assert_ran,
    blocks,
    install_env,
    run_block,
    trainer_install,
)
from kubernetes import client as kube_client
from kubernetes.client.exceptions import ApiException

from contracts import streams, subjects
from status_server.settings import COALESCE_SECONDS, SWEEP_SECONDS
from tjpipe.local import compose, realnode
from tjpipe.local.cluster import STORAGE_CLASS, Simulation, start_simulation
from tjpipe.local.crds import crd_manifests, install_crds
from tjpipe.local.helm import ensure_helm
from tjpipe.local.kubeapi import LocalKube
from tjpipe.local.stack import real_node_demo_trainjob
from tjpipe.local.toolchain import cache_root, ensure_kubectl, ensure_node_binaries

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(2400)]

IMAGE = "registry.example.com/platform/trainjob-pipeline:0.1.0"
"""The image the page builds and names (step 3 and step 6)."""
NAMESPACE = "trainjob-pipeline"
DEPLOYMENTS = (
    "tjpipe-watcher",
    "tjpipe-planner",
    "tjpipe-applier",
    "tjpipe-webhook",
    "tjpipe-status-server",
    "tjpipe-history-server",
)
TRAINING_NAMESPACE = "team-a"
HAND_BACK = "## Hand back to Trainer"
NATS_VOLUMES = 3


@dataclass(frozen=True)
class Installed:
    api: kube_client.ApiClient
    env: dict[str, str]
    token: str
    """The cluster admin's token (the history server asks the apiserver who it is and what it may read)."""
    later: list[Block]
    """The page's blocks after "Hand back to Trainer", and the uninstall: run once the checks are done."""
    audit_log: Path
    """The apiserver's record of every request (``budgets.costs.audit_flags``): who wrote what, how often."""
    root: Path


def _page_parts() -> tuple[list[Block], list[Block]]:
    """The blocks to run on the node, in order: those before the hand-back heading, and the rest."""
    lines = (Path(__file__).resolve().parents[2] / "docs" / INSTALL_PAGE).read_text().splitlines()
    hand_back = lines.index(HAND_BACK) + 1
    runnable = [b for b in blocks(INSTALL_PAGE) if b.marker in ("", "real node")]
    last = [b for b in blocks(INSTALL_PAGE) if b.marker == "run"]
    return [b for b in runnable if b.line < hand_back], [b for b in runnable if b.line > hand_back] + last


def _local_volumes(api: kube_client.ApiClient, folder: Path, *, prefix: str = "node-local") -> None:
    """Local volumes on the node for the NATS servers' claims (the claims' default class names them)."""
    core = kube_client.CoreV1Api(api)
    for index in range(NATS_VOLUMES):
        path = folder / f"volume-{index}"
        path.mkdir(parents=True, exist_ok=True)
        core.create_persistent_volume(
            {
                "metadata": {"name": f"{prefix}-{index}"},
                "spec": {
                    "capacity": {"storage": "10Gi"},
                    "accessModes": ["ReadWriteOnce"],
                    "persistentVolumeReclaimPolicy": "Retain",
                    "storageClassName": STORAGE_CLASS,
                    "local": {"path": str(path)},
                    "nodeAffinity": {
                        "required": {
                            "nodeSelectorTerms": [
                                {
                                    "matchExpressions": [
                                        {
                                            "key": "kubernetes.io/hostname",
                                            "operator": "In",
                                            "values": [realnode.NODE_NAME],
                                        }
                                    ]
                                }
                            ]
                        }
                    },
                },
            }
        )


@pytest.fixture(scope="module")
def installed(
    pipeline_images: None, tmp_path_factory: pytest.TempPathFactory, uncaptured_progress: Callable[[str], None]
) -> Iterator[Installed]:
    root = tmp_path_factory.mktemp("real-node-install")
    say = uncaptured_progress
    kubectl = ensure_kubectl(progress=say)
    binaries = ensure_node_binaries(progress=say)
    kube: LocalKube | None = None
    simulation: Simulation | None = None
    node: realnode.RealNode | None = None
    try:
        audit_args, audit_log = audit_flags(root / "audit")
        kube = realnode.start_control_plane(
            work_dir=root / "kube",
            log_dir=root / "logs",
            kubeconfig_path=root / "kubeconfig",
            progress=say,
            extra_apiserver_args=audit_args,
        )
        with kube.api_client() as api:
            install_crds(api, crd_manifests(progress=say))
            trainer_install(api, replicas=0)
            simulation = start_simulation(
                kube, work_dir=root / "kube" / "simulation", log_dir=root / "logs", progress=say, nodes=0
            )
            node = realnode.start_real_node(kube, work_dir=root / "kube" / "node", log_dir=root / "logs", progress=say)
            archives = [realnode.image_archive(i, pipeline=True) for i in (compose.PROJECT_IMAGE, compose.NATS_IMAGE)]
            realnode.import_images(
                binaries, realnode.containerd_socket(node.work_dir), archives, tags={compose.PROJECT_IMAGE: IMAGE}
            )
            _local_volumes(api, root / "volumes")
            env = install_env(root, kubeconfig=kube.kubeconfig, kubectl=kubectl, cache_dir=cache_root())
            (root / "bin" / "helm").symlink_to(ensure_helm(progress=say))  # for the page's Helm way (the last test)
            first, later = _page_parts()
            started = time.monotonic()
            for block in first:
                assert_ran(block, run_block(block, env, timeout=900))
            say(f"the install page's commands ran on the real node in {time.monotonic() - started:.0f}s")
            yield Installed(api=api, env=env, token=kube.token, later=later, audit_log=audit_log, root=root)
    finally:
        if node is not None:
            node.stop()
        if simulation is not None:
            simulation.stop()
        if kube is not None:
            kube.stop()
        realnode.teardown_network(binaries.kube_proxy)


def test_every_deployment_is_available_with_its_probes_passing(installed: Installed) -> None:
    apps, core = kube_client.AppsV1Api(installed.api), kube_client.CoreV1Api(installed.api)
    for name in DEPLOYMENTS:
        deployment: Any = _wait(
            lambda name=name: _available(apps.read_namespaced_deployment(name, NAMESPACE)), what=f"{name} Available"
        )
        assert deployment.status.ready_replicas == deployment.spec.replicas >= 1, deployment.status
    nats: Any = apps.read_namespaced_stateful_set("nats", NAMESPACE)
    assert nats.status.ready_replicas == 3, nats.status
    pods = core.list_namespaced_pod(NAMESPACE).items
    running = [p for p in pods if p.status.phase == "Running"]
    for pod in running:
        for status in pod.status.container_statuses or []:
            # Ready: the readiness probe passes; started: the startup probe did; on this node, under containerd.
            assert status.ready and status.started, (pod.metadata.name, status)
            assert status.container_id.startswith("containerd://"), status
        assert pod.spec.node_name == realnode.NODE_NAME
    images = {c.image for p in running for c in p.spec.containers}
    assert images == {IMAGE, compose.NATS_IMAGE}, images


def _available(deployment: Any) -> Any:
    conditions = {c.type: c.status for c in deployment.status.conditions or []}
    ready = deployment.status.ready_replicas or 0
    if conditions.get("Available") == "True" and ready == deployment.spec.replicas:
        return deployment
    return None


def _wait(probe: Callable[[], Any], *, what: str, timeout: float = 300, every: float = 2) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        found = probe()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:.0f}s: {what}")
        time.sleep(every)


def test_the_webhook_answers_through_its_service(installed: Installed) -> None:
    """The apiserver calls the webhook at its Service (kube-proxy leads it to a pod), which refuses an invalid
    TrainJob with Trainer's message."""
    _ensure_namespace(installed.api, TRAINING_NAMESPACE)
    trainjob = _trainjob("zero-nodes")
    trainjob["spec"]["trainer"]["numNodes"] = 0
    with pytest.raises(ApiException) as refused:
        kube_client.CustomObjectsApi(installed.api).create_namespaced_custom_object(
            "trainer.kubeflow.org", "v1alpha1", TRAINING_NAMESPACE, "trainjobs", trainjob, dry_run="All"
        )
    message = json.loads(refused.value.body)["message"]
    assert 'admission webhook "validator.trainjob.trainer.kubeflow.org" denied the request' in message, message
    assert "spec.trainer.numNodes" in message, message


def test_a_trainjob_runs_to_complete_and_its_pod_reports_progress(installed: Installed) -> None:
    custom, core = kube_client.CustomObjectsApi(installed.api), kube_client.CoreV1Api(installed.api)
    _ensure_namespace(installed.api, TRAINING_NAMESPACE)
    custom.create_namespaced_custom_object(
        "trainer.kubeflow.org", "v1alpha1", TRAINING_NAMESPACE, "trainjobs", _trainjob("line")
    )
    status = _wait(lambda: _finished(custom, "line"), what="TrainJob line Complete or Failed", timeout=420)
    conditions = {c["type"]: c["status"] for c in status.get("conditions") or []}
    assert conditions.get("Complete") == "True", status
    progress = status.get("trainerStatus") or {}
    assert progress.get("progressPercentage") == 100, status
    metrics = {m["name"]: m["value"] for m in progress.get("metrics") or []}
    assert float(metrics["loss"]) < 0.05 and metrics["step"] == "12", progress
    pods = core.list_namespaced_pod(TRAINING_NAMESPACE, label_selector="jobset.sigs.k8s.io/jobset-name=line").items
    assert [p.status.phase for p in pods] == ["Succeeded"]
    logs = core.read_namespaced_pod_log(pods[0].metadata.name, TRAINING_NAMESPACE)
    assert "progress reports: True" in logs and "step 12/12" in logs, logs
    _check_the_history_server_serves_it(installed, pod_name=pods[0].metadata.name)


def _trainjob(name: str, *, namespace: str = TRAINING_NAMESPACE, steps: int = 12) -> dict[str, Any]:
    trainjob = real_node_demo_trainjob()
    trainjob["metadata"] = {"name": name, "namespace": namespace}
    # One small pod: the node's two CPUs also hold the pipeline's own pods.
    trainjob["spec"]["trainer"]["resourcesPerNode"] = {
        "requests": {"cpu": "100m", "memory": "256Mi"},
        "limits": {"cpu": "1", "memory": "512Mi"},
    }
    trainjob["spec"]["trainer"]["env"] = [{"name": "TRAIN_STEPS", "value": str(steps)}]
    return trainjob


def _finished(
    custom: kube_client.CustomObjectsApi, name: str, namespace: str = TRAINING_NAMESPACE
) -> dict[str, Any] | None:
    trainjob: Any = custom.get_namespaced_custom_object(
        "trainer.kubeflow.org", "v1alpha1", namespace, "trainjobs", name
    )
    status: dict[str, Any] = trainjob.get("status") or {}
    conditions = {c["type"]: c["status"] for c in status.get("conditions") or []}
    return status if "True" in (conditions.get("Complete"), conditions.get("Failed")) else None


def _ensure_namespace(api: kube_client.ApiClient, name: str) -> None:
    core = kube_client.CoreV1Api(api)
    try:
        core.create_namespace({"metadata": {"name": name}})
    except ApiException as error:
        if error.status != 409:
            raise
    # The controllers give every namespace its default ServiceAccount, which the training pod runs as.
    _wait(lambda: _exists(lambda: core.read_namespaced_service_account("default", name)), what="default SA")


def _exists(read: Callable[[], Any]) -> bool:
    try:
        read()
    except ApiException as error:
        if error.status == 404:
            return False
        raise
    return True


class _ServiceConnection(http.client.HTTPSConnection):
    """HTTPS to a Service's cluster address (kube-proxy's rules on this machine lead there), verifying the
    certificate for the Service's name, as a client in the cluster would."""

    def __init__(self, name: str, address: str, *, context: ssl.SSLContext) -> None:
        super().__init__(name, 443, context=context, timeout=20)
        self._address = address
        self._tls = context

    def connect(self) -> None:
        self.sock = self._tls.wrap_socket(
            socket.create_connection((self._address, 443), timeout=20), server_hostname=self.host
        )


def _check_the_history_server_serves_it(installed: Installed, *, pod_name: str) -> None:
    """The history server, through its Service, with a token the apiserver reviews: every progress report of
    the TrainJob came from its pod, the last one at 100 %."""
    core = kube_client.CoreV1Api(installed.api)
    service: Any = core.read_namespaced_service("tjpipe-history-server", NAMESPACE)
    ca = Path(installed.env["HOME"]) / "trainjob-pipeline-secrets" / "history-tls" / "ca.crt"
    tls = ssl.create_default_context(cafile=str(ca))
    token = installed.token
    path = f"/api/v1/namespaces/{TRAINING_NAMESPACE}/trainjobs/line/progress"

    def series() -> dict[str, Any] | None:
        connection = _ServiceConnection(f"tjpipe-history-server.{NAMESPACE}.svc", service.spec.cluster_ip, context=tls)
        try:
            connection.request("GET", path, headers={"Authorization": f"Bearer {token}"})
            answer = connection.getresponse()
            body = answer.read()
        finally:
            connection.close()
        assert answer.status == 200, (answer.status, body[:500])
        found: dict[str, Any] = json.loads(body)
        points = found["points"]
        return found if points and points[-1]["progressPercentage"] == 100 else None

    found = _wait(series, what="the history server's progress of TrainJob line at 100 %", timeout=60)
    assert found["pods"] == [pod_name], found
    assert len(found["points"]) >= 2 and "loss" in found["metrics"], found


# ------------------------------------------------------------------------------------------------ day two

TRICKLE = 8
"""TrainJobs created one every ``TRICKLE_SECONDS`` while every Deployment is restarted and has a pod killed."""
TRICKLE_SECONDS = 3.0
APPLIER = "system:serviceaccount:trainjob-pipeline:tjpipe-applier"


def _kubectl(installed: Installed, *args: str, timeout: float = 240) -> str:
    done = subprocess.run(
        ["kubectl", *args], env=installed.env, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert done.returncode == 0, f"kubectl {' '.join(args)}: {done.stdout}\n{done.stderr}"
    return done.stdout


def _component_writes(installed: Installed, namespace: str) -> Counter[str]:
    """The applier's writes of JobSets and ConfigMaps in ``namespace`` by kind (``jobsets APPLY``, ...), from the
    apiserver's audit log. Reads are left out: a message redelivered after a restart costs one read and no write
    (the ledger answers ``unchanged``); status writes follow the progress reports, which vary."""
    requests = audit_requests(installed.audit_log).values()
    return Counter(
        r.label
        for r in requests
        if r.user == APPLIER
        and r.namespace == namespace
        and r.resource in ("jobsets", "configmaps")
        and r.verb not in READ_VERBS
    )


class _Trickle(threading.Thread):
    """Creates the TrainJobs one at a time, as a client would: a create the apiserver refuses because no webhook
    replica answered at that moment is tried again (bounded), any other refusal is an error."""

    def __init__(self, api: kube_client.ApiClient, namespace: str, names: list[str]) -> None:
        super().__init__(daemon=True)
        self.custom = kube_client.CustomObjectsApi(api)
        self.namespace, self.names = namespace, names
        self.retried = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            for name in self.names:
                trainjob = _trainjob(name, namespace=self.namespace, steps=8)
                for attempt in range(60):
                    try:
                        self.custom.create_namespaced_custom_object(
                            "trainer.kubeflow.org", "v1alpha1", self.namespace, "trainjobs", trainjob
                        )
                        break
                    except ApiException as error:
                        if "failed calling webhook" not in str(error.body) or attempt == 59:
                            raise
                        self.retried += 1
                        time.sleep(1)
                time.sleep(TRICKLE_SECONDS)
        except BaseException as error:  # reported by the test, which joins this thread
            self.error = error


def _results(installed: Installed, namespace: str) -> dict[str, Counter[str]]:
    """The results stream's records of each TrainJob in ``namespace``, by component: read from this machine
    through the ``nats`` Service (kube-proxy leads there), over TLS with the page's CA, as the page's admin."""
    import asyncio

    import nats

    secrets = Path(installed.env["HOME"]) / "trainjob-pipeline-secrets"
    service: Any = kube_client.CoreV1Api(installed.api).read_namespaced_service("nats", NAMESPACE)

    async def read() -> dict[str, int]:
        tls = ssl.create_default_context(cafile=str(secrets / "nats-tls" / "ca.crt"))
        nc = await nats.connect(
            servers=[f"tls://{service.spec.cluster_ip}:4222"],
            tls=tls,
            tls_hostname=f"nats.{NAMESPACE}.svc",
            nkeys_seed=str(secrets / "creds" / "admin.nk"),
            allow_reconnect=False,
            connect_timeout=10,
        )
        try:
            info = await nc.jetstream().stream_info(
                streams.RESULTS.name, subjects_filter=f"{subjects.RESULTS_PREFIX}.*.{namespace}.>"
            )
            return dict(info.state.subjects or {})
        finally:
            await nc.close()

    counts: dict[str, Counter[str]] = {}
    for subject, count in asyncio.run(read()).items():
        _, _, _, _, name, component = subject.split(".", 5)
        counts.setdefault(name, Counter())[component] += count
    return counts


def _kinds(counts: Counter[str], name: str) -> Counter[str]:
    """Result counts by component, the TrainJob's name in a component's name made ``NAME``."""
    return Counter({component.replace(f"_{name}-", "_NAME-"): n for component, n in counts.items()})


def test_day_two_restarts_and_killed_pods_lose_nothing_and_apply_nothing_twice(installed: Installed) -> None:
    """Under a trickle of TrainJobs: ``kubectl rollout restart`` of every Deployment (the status server's while
    training pods report to it), then one pod of each killed with ``--grace-period=0``. Every TrainJob still
    runs to Complete with its last progress report in its status, each has exactly one JobSet, and the applier
    wrote each one's JobSet and ConfigMaps as often as the undisturbed TrainJob's (the audit log counts them)."""
    baseline = _component_writes(installed, TRAINING_NAMESPACE)
    assert baseline["jobsets APPLY"] == 1, "the undisturbed TrainJob (the test before) gives the per-TrainJob count"
    results = _results(installed, TRAINING_NAMESPACE)["line"]
    assert results, "the undisturbed TrainJob's results are on the stream"
    namespace = "team-b"
    _ensure_namespace(installed.api, namespace)
    names = [f"trickle-{i}" for i in range(TRICKLE)]
    trickle = _Trickle(installed.api, namespace, names)
    trickle.start()
    custom = kube_client.CustomObjectsApi(installed.api)
    # The restarts begin while a training pod is reporting to the status server, between its first and last report.
    _wait(lambda: _reporting(custom, namespace), what="a training pod reporting its progress", timeout=180, every=0.5)
    _kubectl(installed, "-n", NAMESPACE, "rollout", "restart", "deployment")
    for name in DEPLOYMENTS:
        _kubectl(installed, "-n", NAMESPACE, "rollout", "status", f"deployment/{name}", "--timeout=300s", timeout=320)
    apps = kube_client.AppsV1Api(installed.api)
    for name in DEPLOYMENTS:
        selector = apps.read_namespaced_deployment(name, NAMESPACE).spec.selector.match_labels
        labels = ",".join(f"{k}={v}" for k, v in selector.items())
        _kubectl(
            installed, "-n", NAMESPACE, "delete", "pod", "-l", labels, "--grace-period=0", "--force", "--wait=false"
        )
    for name in DEPLOYMENTS:
        _wait(lambda name=name: _available(apps.read_namespaced_deployment(name, NAMESPACE)), what=f"{name} back")
    trickle.join(timeout=TRICKLE * (TRICKLE_SECONDS + 60))
    assert trickle.error is None, trickle.error

    for name in names:
        status = _wait(lambda name=name: _finished(custom, name, namespace), what=f"{name} finished", timeout=420)
        conditions = {c["type"]: c["status"] for c in status.get("conditions") or []}
        assert conditions.get("Complete") == "True", (name, status)
        # The last report's write may come after Complete: a status server replica killed between storing it
        # and writing it leaves it to a replica's next read of the history (docs/training-progress.md).
        _wait(
            lambda name=name: _progress(custom, name, namespace) == 100,
            what=f"{name}'s last progress report (100 %) in its status",
            timeout=SWEEP_SECONDS + 2 * COALESCE_SECONDS + 30,
        )
    jobsets: Any = custom.list_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", namespace, "jobsets")
    assert sorted(j["metadata"]["name"] for j in jobsets["items"]) == sorted(names)
    # The results stream: each TrainJob's JobSet and runtime snapshot applied once, as the undisturbed one's, and
    # the same kinds of result; status writes follow the progress reports, so only their presence is compared.
    once = {c: n for c, n in _kinds(results, "line").items() if c in ("jobset", "configmap_NAME-runtime-snapshot")}
    assert once == {"jobset": 1, "configmap_NAME-runtime-snapshot": 1}, results
    disturbed = _results(installed, namespace)
    assert sorted(disturbed) == sorted(names), disturbed
    for name, counts in disturbed.items():
        kinds = _kinds(counts, name)
        assert set(kinds) == set(_kinds(results, "line")), (name, counts)
        assert {c: kinds[c] for c in once} == once, (name, counts)
    expected = Counter({label: n * TRICKLE for label, n in baseline.items()})
    assert _component_writes(installed, namespace) == expected, (baseline, trickle.retried)


def _progress(custom: kube_client.CustomObjectsApi, name: str, namespace: str) -> int | None:
    trainjob: Any = custom.get_namespaced_custom_object(
        "trainer.kubeflow.org", "v1alpha1", namespace, "trainjobs", name
    )
    progress: int | None = ((trainjob.get("status") or {}).get("trainerStatus") or {}).get("progressPercentage")
    return progress


def _reporting(custom: kube_client.CustomObjectsApi, namespace: str) -> bool:
    listed: Any = custom.list_namespaced_custom_object("trainer.kubeflow.org", "v1alpha1", namespace, "trainjobs")
    percentages = [
        ((t.get("status") or {}).get("trainerStatus") or {}).get("progressPercentage") for t in listed["items"]
    ]
    return any(p is not None and 0 < p < 100 for p in percentages)


def test_without_webhook_pods_trainjob_writes_are_refused(installed: Installed) -> None:
    """``failurePolicy: Fail``, as the docs say: with no webhook replica a TrainJob create is refused (nothing is
    admitted unchecked); once a replica is back, it is admitted."""
    _kubectl(installed, "-n", NAMESPACE, "scale", "deployment/tjpipe-webhook", "--replicas=0")
    core, custom = kube_client.CoreV1Api(installed.api), kube_client.CustomObjectsApi(installed.api)
    selector = "app.kubernetes.io/component=webhook"
    _wait(lambda: not core.list_namespaced_pod(NAMESPACE, label_selector=selector).items, what="no webhook pod")
    trainjob = _trainjob("unchecked")
    with pytest.raises(ApiException) as refused:
        custom.create_namespaced_custom_object(
            "trainer.kubeflow.org", "v1alpha1", TRAINING_NAMESPACE, "trainjobs", trainjob, dry_run="All"
        )
    message = json.loads(refused.value.body)["message"]
    assert 'failed calling webhook "validator.trainjob.trainer.kubeflow.org"' in message, message
    _kubectl(installed, "-n", NAMESPACE, "scale", "deployment/tjpipe-webhook", "--replicas=1")
    apps = kube_client.AppsV1Api(installed.api)
    _wait(lambda: _available(apps.read_namespaced_deployment("tjpipe-webhook", NAMESPACE)), what="webhook back")
    custom.create_namespaced_custom_object(
        "trainer.kubeflow.org", "v1alpha1", TRAINING_NAMESPACE, "trainjobs", trainjob, dry_run="All"
    )


def test_hand_back_and_uninstall_as_the_page_says(installed: Installed) -> None:
    """The rest of the page, on the running install: hand back to Trainer, then uninstall."""
    for block in installed.later:
        assert_ran(block, run_block(block, installed.env, timeout=300))
    apps = kube_client.AppsV1Api(installed.api)
    rbac = kube_client.RbacAuthorizationV1Api(installed.api)
    left = [r.metadata.name for r in rbac.list_cluster_role().items if r.metadata.name.startswith("tjpipe-")]
    assert left == [], f"the uninstall left ClusterRoles: {left}"
    assert apps.read_namespaced_deployment("kubeflow-trainer-controller-manager", "kubeflow-system")


def test_the_helm_way_installs_the_same_and_runs_a_trainjob(installed: Installed) -> None:
    """After the uninstall: the page's Secrets again, its Helm block in place of the ``kubectl apply``, the
    webhook's CA, one replica each; then a TrainJob runs to Complete with its progress from the pod."""
    core = kube_client.CoreV1Api(installed.api)
    _wait(lambda: not _exists(lambda: core.read_namespace(NAMESPACE)), what=f"namespace {NAMESPACE} gone", timeout=300)
    _local_volumes(installed.api, installed.root / "volumes-helm", prefix="helm-local")
    every = blocks(INSTALL_PAGE)

    def block(starts: str) -> Block:
        (found,) = [b for b in every if b.text.lstrip().startswith(starts) or f"\n{starts}" in b.text]
        return found

    for step in (
        block("kubectl -n trainjob-pipeline create secret generic tjpipe-watcher-signing-key"),
        block("helm install trainjob-pipeline"),
        block("CA=$(base64"),
        block("kubectl -n trainjob-pipeline scale deployment --all --replicas=1"),
        block("kubectl -n trainjob-pipeline wait --for=condition=complete job/tjpipe-bus-setup"),
    ):
        assert_ran(step, run_block(step, installed.env, timeout=900))
    apps = kube_client.AppsV1Api(installed.api)
    for name in DEPLOYMENTS:
        _wait(lambda name=name: _available(apps.read_namespaced_deployment(name, NAMESPACE)), what=f"{name} Available")
    custom = kube_client.CustomObjectsApi(installed.api)
    namespace = "team-c"
    _ensure_namespace(installed.api, namespace)
    custom.create_namespaced_custom_object(
        "trainer.kubeflow.org", "v1alpha1", namespace, "trainjobs", _trainjob("helm", namespace=namespace, steps=4)
    )
    status = _wait(lambda: _finished(custom, "helm", namespace), what="TrainJob helm finished", timeout=420)
    assert {c["type"]: c["status"] for c in status.get("conditions") or []}.get("Complete") == "True", status
    assert (status.get("trainerStatus") or {}).get("progressPercentage") == 100, status
