"""compose/docker-compose.yml on a real Docker engine: the stack comes up, runs the demo and 50 more
TrainJobs to Complete on the simulated cluster with each service as its own ServiceAccount, serves the
history over HTTP to the host's login token, survives an applier restart without writing, takes a trainer
pod's progress through the published status server, and leaves nothing behind.

The images are built first with the project's own offline builder (scripts/compose-images.sh; cached, so
a warm run is seconds). The stack runs under Debian's docker-compose 1.29 where it is installed, else under
the compose v2 plugin built from its module; the file is checked by both.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from faults.support import read_write_counts
from kubernetes.client import CoreV1Api, CustomObjectsApi, VersionApi
from needs import unavailable
from status_endpoint.support import trainer_status

from contracts import streams, subjects
from contracts.progress import decode_progress
from plumbing import bus_history
from status_server import core as status_core
from tjpipe import standin
from tjpipe.local import compose, crds
from tjpipe.local.cluster import RUN_TIME_ANNOTATION
from tjpipe.local.kubeapi import new_api_client

from .support import (
    WRITTEN,
    Project,
    build_images,
    compose_tools,
    engine_problem,
    exactly_once_problems,
    namespace_record,
    pipeline_writes,
    settled_writes,
)

pytestmark = pytest.mark.timeout(2400)

LOAD_NAMESPACE = "compose-load"
LOAD_RUNTIMES = ("torch-distributed", "deepspeed-distributed", "xgboost-distributed")
LOAD_TRAINJOBS = 50
DEMO_TIMEOUT = 600.0
LOAD_TIMEOUT = 600.0


def _say(line: str) -> None:
    print(f"[compose] {line}", flush=True)


@pytest.fixture(scope="module")
def engine() -> None:
    problem = engine_problem()
    if problem is not None:
        unavailable(problem)


@pytest.fixture(scope="module")
def v2_config(engine: None) -> Path | None:
    """compose v2 as built from its Go module, where it is cached; building it takes 10-20 minutes on 2 cores,
    so a run never starts that (tests/deploy checks the file with compose-go, the loader v2 is built on)."""
    return compose.ensure_compose_v2(progress=_say) if compose.compose_v2_built() else None


@pytest.fixture(scope="module")
def images(engine: None) -> None:
    build_images(_say)


@pytest.fixture(scope="module")
def project(images: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Project]:
    """The stack under Debian's docker-compose 1.29 (what apt installs), else under compose v2."""
    tools = compose_tools(None) or compose_tools(compose.ensure_compose_v2(progress=_say))
    tool = next(iter(tools.values()))
    stack = Project(tool=tool, state=tmp_path_factory.mktemp("compose-state"))
    started = time.monotonic()
    try:
        stack.run("up", "-d", timeout=600)
        _say(f"{' '.join(tool)} up -d returned in {time.monotonic() - started:.0f}s (project {stack.name})")
        yield stack
    finally:
        stack.down()


def test_demo_trainjobs_complete_and_are_cleaned_up(project: Project) -> None:
    started = time.monotonic()
    code = project.wait_exited("demo", timeout=DEMO_TIMEOUT)
    logs = project.logs("demo")
    assert code == 0, logs[-4000:]
    for name in ("mnist", "deepspeed"):
        assert f"TrainJob tjpipe-demo/{name} is Complete" in logs
        assert f"TrainJob tjpipe-demo/{name} and everything it owned are gone" in logs
    assert "removed by the garbage collector: Secret/deepspeed-mpi-ssh-auth" in logs
    assert "demo finished" in logs
    _say(f"demo Complete and cleaned up {time.monotonic() - started:.0f}s after up returned")


def test_host_reaches_the_apiserver_and_the_bus(project: Project) -> None:
    with new_api_client(project.state / "kubeconfig") as api:
        assert VersionApi(api).get_code().git_version == "v1.36.3"
    for name in ("reader.nk", "nats-ca.crt", "login-token", "env"):
        assert (project.state / name).is_file()
    assert (project.state / "reader.nk").stat().st_mode & 0o077 == 0


# What the applier's container asks the API server, with the kubeconfig and token it mounts: who it is, and to
# create a ConfigMap in kube-system, which its role does not allow (nothing is created: the answer is 403).
WHO_AM_I = """
import json, kubernetes
from kubernetes.client import AuthenticationV1Api, CoreV1Api, V1ConfigMap, V1ObjectMeta
from kubernetes.client.rest import ApiException
api = kubernetes.config.new_client_from_config()
user = AuthenticationV1Api(api).create_self_subject_review({"apiVersion": "authentication.k8s.io/v1",
    "kind": "SelfSubjectReview"}).status.user_info.username
try:
    CoreV1Api(api).create_namespaced_config_map("kube-system", V1ConfigMap(metadata=V1ObjectMeta(name="x")))
    status = 201
except ApiException as exc:
    status = exc.status
print(json.dumps({"user": user, "kube-system-write": status}))
"""


def test_the_applier_runs_as_its_own_service_account(project: Project) -> None:
    completed = project.exec("applier", "python", "-c", WHO_AM_I)
    assert completed.returncode == 0, completed.stderr[-3000:]
    answer = json.loads(completed.stdout.strip().splitlines()[-1])
    assert answer == {"user": "system:serviceaccount:trainjob-pipeline:tjpipe-applier", "kube-system-write": 403}


def test_the_history_server_lists_the_demo_trainjobs_to_the_host_token(project: Project) -> None:
    project.wait_healthy("history-server", timeout=120)
    token = (project.state / "login-token").read_text().strip()
    url = f"http://127.0.0.1:{project.history_port}/api/v1/namespaces/tjpipe-demo/trainjobs"
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    deadline = time.monotonic() + 60
    names: set[str] = set()
    while time.monotonic() < deadline:
        with urllib.request.urlopen(request, timeout=10) as response:
            names = {item["name"] for item in json.load(response)["items"]}
        if {"mnist", "deepspeed"} <= names:
            break
        time.sleep(2)
    assert {"mnist", "deepspeed"} <= names, names
    refused = urllib.request.Request(url, headers={"Authorization": "Bearer not-a-token"})
    try:
        urllib.request.urlopen(refused, timeout=10)
    except urllib.error.HTTPError as exc:
        assert exc.code == 401
    else:
        raise AssertionError("the history server answered a token the API server does not know")


def _load_trainjob(index: int) -> dict[str, Any]:
    runtime = LOAD_RUNTIMES[index % len(LOAD_RUNTIMES)]
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": f"load-{index:02d}", "namespace": LOAD_NAMESPACE},
        "spec": {"runtimeRef": {"name": runtime}, "trainer": {"numNodes": 1}},
    }


def _finished(api: Any) -> dict[str, str]:
    listed = CustomObjectsApi(api).list_namespaced_custom_object(
        "trainer.kubeflow.org", "v1alpha1", LOAD_NAMESPACE, "trainjobs"
    )
    out = {}
    for item in listed["items"]:
        for condition in (item.get("status") or {}).get("conditions") or []:
            if condition["type"] in ("Complete", "Failed") and condition["status"] == "True":
                out[item["metadata"]["name"]] = condition["type"]
    return out


def test_fifty_trainjobs_on_three_runtimes_complete(project: Project) -> None:
    objects: list[dict[str, Any]] = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": LOAD_NAMESPACE}}]
    objects += [_load_trainjob(i) for i in range(LOAD_TRAINJOBS)]
    # The API server's counters are the whole cluster's: the demo's TrainJobs are done and written first.
    project.wait_exited("demo", timeout=DEMO_TIMEOUT)
    kube = project.kube()
    before = settled_writes(kube)
    started = time.monotonic()
    with new_api_client(project.state / "kubeconfig") as api:
        crds.apply_objects(api, objects, field_manager="compose-test")
        deadline = time.monotonic() + LOAD_TIMEOUT
        finished = _finished(api)
        while len(finished) < LOAD_TRAINJOBS and time.monotonic() < deadline:
            time.sleep(3)
            finished = _finished(api)
        jobsets = CustomObjectsApi(api).list_namespaced_custom_object(
            "jobset.x-k8s.io", "v1alpha2", LOAD_NAMESPACE, "jobsets"
        )
    assert len(finished) == LOAD_TRAINJOBS, f"{len(finished)} of {LOAD_TRAINJOBS} finished: {finished}"
    assert set(finished.values()) == {"Complete"}, finished
    assert len(jobsets["items"]) == LOAD_TRAINJOBS
    _say(f"{LOAD_TRAINJOBS} TrainJobs on {', '.join(LOAD_RUNTIMES)} Complete in {time.monotonic() - started:.0f}s")

    # Nothing doubled, counted: no fault here, so every plan is recorded once and answered by exactly one
    # result, and the API server's own count of JobSet writes is the pipeline's count of them, one per
    # TrainJob (a JobSet is written once, when it is created; a running one is not even planned).
    delta = settled_writes(kube) - before
    # A TrainJob reads Complete before its last status plan is answered: a plan of the Jobs' counts may wait out
    # its status interval (5 s) first. So the record is read again until every plan has its result (bounded);
    # a plan answered twice stays a problem however long it is read.
    deadline = time.monotonic() + 30
    while True:
        plans, results = asyncio.run(_namespace_record(project))
        problems = exactly_once_problems(plans, results, redeliveries=False)
        if not problems or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert problems == [], problems
    reported = Counter(r.target.kind for r in results if r.action in WRITTEN)
    assert delta.writes("jobsets") == reported["JobSet"] == LOAD_TRAINJOBS, (delta.summary(), dict(reported))
    _say(
        f"{len(plans)} plans, {len(results)} results, one each; writes reported {dict(reported)}; "
        f"JobSet writes the API server counted: {delta.writes('jobsets')}"
    )


async def _namespace_record(project: Project) -> tuple[list[Any], list[Any]]:
    nc = await project.reader()
    try:
        return await namespace_record(nc, LOAD_NAMESPACE)
    finally:
        await nc.close()


def test_applier_restart_writes_nothing(project: Project) -> None:
    kube = project.kube()
    before = settled_writes(kube)  # the last status writes of the TrainJobs above are done
    project.run("restart", "applier", timeout=120)
    project.wait_healthy("applier", timeout=120)
    time.sleep(15)
    after = read_write_counts(kube)
    delta = after - before
    assert pipeline_writes(delta) == 0, {k: v for k, v in delta.all_writes().items() if v}


PROGRESS_NAMESPACE = "compose-progress"
PROGRESS_TRAINJOB = "progress"
PROGRESS_TIMEOUT = 120.0


def test_a_trainer_pod_reports_progress_through_the_published_status_server(project: Project) -> None:
    """Issue #40 in this layout: a running trainer pod's update, sent from the host as the planner told the pod
    (URL, CA, projected token's audience, read from the live JobSet) with a real token bound to that pod, is
    answered 200 with its echo, lands in TJ_PROGRESS and the history server's series, and shows on the TrainJob
    under manager ``trainer-status``; a token of the same pod for another audience is refused and writes nothing."""
    for service in ("watcher", "planner", "applier", "status-server", "history-server"):
        project.wait_healthy(service, timeout=120)
    with new_api_client(project.state / "kubeconfig") as api:
        crds.apply_objects(api, _progress_objects(), field_manager="compose-test")
        pod = _running_trainer_pod(api)
        env, audience = _injected(api)
        path = status_core.status_path(PROGRESS_NAMESPACE, PROGRESS_TRAINJOB)
        assert env[standin.URL_ENV] == f"https://127.0.0.1:{project.status_port}{path}", env
        assert audience == status_core.audience(PROGRESS_NAMESPACE, PROGRESS_TRAINJOB)
        pod_env = {e.name: e.value for c in pod.spec.containers for e in c.env or [] if e.name in env}
        assert pod_env == env and standin.projected_token(pod)[0] == audience
        kube_core = CoreV1Api(api)
        tls = kube_core.read_namespaced_config_map(f"{PROGRESS_TRAINJOB}-tls-config", PROGRESS_NAMESPACE)
        ca_file = project.state / "progress-ca.crt"  # what the pod reads at env[CA_ENV], from the same ConfigMap
        ca_file.write_text((tls.data or {})["ca.crt"])
        token = standin.pod_token(kube_core, pod, audience)
        elsewhere = standin.pod_token(kube_core, pod, status_core.audience(PROGRESS_NAMESPACE, "someone-else"))
        assert token is not None and elsewhere is not None  # (never shown: a failing assert prints its operands)

        started = int(time.time())
        sent = [_progress_update(20, "0.9", at=started), _progress_update(60, "0.4", at=started + 1)]
        for body in sent:
            answer = _post_progress(env[standin.URL_ENV], ca_file, token, body)
            assert answer == (200, body)
        refused = _progress_update(99, "0.01", at=started + 2)
        answer = _post_progress(env[standin.URL_ENV], ca_file, elsewhere, refused)
        assert answer[0] == 403, answer

        deadline = time.monotonic() + 30  # the second update waits for the coalescing interval (5 s)
        status, managers = trainer_status(api, PROGRESS_NAMESPACE, PROGRESS_TRAINJOB)
        while (status or {}).get("progressPercentage") != 60 and time.monotonic() < deadline:
            time.sleep(1)
            status, managers = trainer_status(api, PROGRESS_NAMESPACE, PROGRESS_TRAINJOB)
        assert status == sent[1]["trainerStatus"] and managers == ["trainer-status"], (status, managers)

    recorded = asyncio.run(_progress_records(project))
    assert [r.trainer_status.progress_percentage for r in recorded] == [20, 60]  # the refused one is not there
    senders = {(r.pod, r.pod_uid, r.service_account) for r in recorded}
    assert senders == {(pod.metadata.name, pod.metadata.uid, "default")}, senders
    series = _history_progress(project, "")
    assert [(p["progressPercentage"], p["metrics"]["loss"]) for p in series["points"]] == [(20, "0.9"), (60, "0.4")]
    assert series["pods"] == [pod.metadata.name]
    csv_rows = _history_progress(project, "?output=csv").splitlines()
    assert len(csv_rows) == 3 and "loss" in csv_rows[0], csv_rows[0]
    _say(f"progress from pod {pod.metadata.name} through 127.0.0.1:{project.status_port}: 2 accepted, 1 refused")


def _progress_objects() -> list[dict[str, Any]]:
    """The namespace and a TrainJob on torch-distributed whose pod keeps Running (run-time 10m) while it reports."""
    long_run = {"metadata": {"annotations": {RUN_TIME_ANNOTATION: "10m"}}}
    patch = {
        "manager": "example.com/compose-test",
        "trainingRuntimeSpec": {
            "template": {"spec": {"replicatedJobs": [{"name": "node", "template": {"spec": {"template": long_run}}}]}}
        },
    }
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": PROGRESS_NAMESPACE}},
        {
            "apiVersion": "trainer.kubeflow.org/v1alpha1",
            "kind": "TrainJob",
            "metadata": {"name": PROGRESS_TRAINJOB, "namespace": PROGRESS_NAMESPACE},
            "spec": {
                "runtimeRef": {"name": "torch-distributed"},
                "trainer": {"numNodes": 1},
                "runtimePatches": [patch],
            },
        },
    ]


def _running_trainer_pod(api: Any) -> Any:
    selector = f"jobset.sigs.k8s.io/jobset-name={PROGRESS_TRAINJOB}"
    deadline = time.monotonic() + PROGRESS_TIMEOUT
    while time.monotonic() < deadline:
        pods = CoreV1Api(api).list_namespaced_pod(PROGRESS_NAMESPACE, label_selector=selector).items
        running = [p for p in pods if p.status.phase == "Running"]
        if running:
            return running[0]
        time.sleep(1)
    raise AssertionError(f"no Running pod of TrainJob {PROGRESS_NAMESPACE}/{PROGRESS_TRAINJOB} in time")


def _injected(api: Any) -> tuple[dict[str, str], str]:
    """What the planner gave the trainer container of the live JobSet: the three variables, and the audience of
    the projected token."""
    jobset = CustomObjectsApi(api).get_namespaced_custom_object(
        "jobset.x-k8s.io", "v1alpha2", PROGRESS_NAMESPACE, "jobsets", PROGRESS_TRAINJOB
    )
    for rjob in jobset["spec"]["replicatedJobs"]:
        pod_spec = rjob["template"]["spec"]["template"]["spec"]
        for container in pod_spec["containers"]:
            env = {e["name"]: e.get("value", "") for e in container.get("env") or []}
            if standin.URL_ENV in env:
                audiences = [
                    source["serviceAccountToken"]["audience"]
                    for volume in pod_spec.get("volumes") or []
                    for source in (volume.get("projected") or {}).get("sources") or []
                    if "serviceAccountToken" in source
                ]
                assert len(audiences) == 1, audiences
                names = (standin.URL_ENV, standin.CA_ENV, standin.TOKEN_ENV)
                return {name: env[name] for name in names}, audiences[0]
    raise AssertionError("no container of the JobSet has the status server's URL (TrainJobStatus off?)")


def _progress_update(percent: int, loss: str, *, at: int) -> dict[str, Any]:
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))  # metav1.Time's form, which the echo keeps
    metrics = [{"name": "loss", "value": loss}]
    return {
        "trainerStatus": {
            "progressPercentage": percent,
            "estimatedRemainingSeconds": 100 - percent,
            "metrics": metrics,
            "lastUpdatedTime": when,
        }
    }


def _post_progress(url: str, ca_file: Path, token: str, body: dict[str, Any]) -> tuple[int, Any]:
    """POST over TLS, trusting only the CA the pod is given; the status code and the decoded answer."""
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
    request.add_header("Content-Type", "application/json")
    request.add_header("Authorization", f"Bearer {token}")
    context = ssl.create_default_context(cafile=str(ca_file))
    try:
        with urllib.request.urlopen(request, timeout=15, context=context) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


async def _progress_records(project: Project) -> list[Any]:
    nc = await project.reader()
    try:
        stored = await bus_history.read_stream(
            nc.jetstream(),
            streams.PROGRESS.name,
            subjects.trainjob_progress_filter(PROGRESS_NAMESPACE, PROGRESS_TRAINJOB),
        )
    finally:
        await nc.close()
    return sorted((decode_progress(m.data) for m in stored), key=lambda r: r.updated_at)


def _history_progress(project: Project, query: str) -> Any:
    """The TrainJob's series from the history server, as the host's login token reads it (JSON, or CSV text)."""
    token = (project.state / "login-token").read_text().strip()
    url = (
        f"http://127.0.0.1:{project.history_port}/api/v1/namespaces/{PROGRESS_NAMESPACE}"
        f"/trainjobs/{PROGRESS_TRAINJOB}/progress{query}"
    )
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        text = response.read().decode()
    return text if query else json.loads(text)


@pytest.mark.parametrize("tool", ["docker-compose", "docker compose"])
def test_both_compose_tools_accept_the_file(tool: str, v2_config: Path | None, tmp_path: Path) -> None:
    command = compose_tools(v2_config).get(tool)
    if command is None:
        how = {
            "docker-compose": "apt-get install docker-compose",
            "docker compose": "python -c 'from tjpipe.local.compose import ensure_compose_v2 as e; e()' builds it",
        }
        pytest.skip(f"{tool} is not here ({how[tool]})")
    Project(tool=command, state=tmp_path).run("config", "-q", timeout=60)


def test_down_leaves_no_container_volume_or_network(project: Project) -> None:
    assert project.leftovers()["volumes"], "the stack's volumes should exist before down"
    project.down()
    assert project.leftovers() == {"containers": [], "volumes": [], "networks": []}
