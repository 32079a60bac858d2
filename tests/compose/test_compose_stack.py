"""compose/docker-compose.yml on a real Docker engine: the stack comes up, runs the demo and 50 more
TrainJobs to Complete on the simulated cluster with each service as its own ServiceAccount, serves the
history over HTTP to the host's login token, survives an applier restart without writing, and leaves
nothing behind.

The images are built first with the project's own offline builder (scripts/compose-images.sh; cached, so
a warm run is seconds). The stack runs under Debian's docker-compose 1.29 where it is installed, else under
the compose v2 plugin built from its module; the file is checked by both.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from faults.support import read_write_counts
from kubernetes.client import CustomObjectsApi, VersionApi
from needs import unavailable

from tjpipe.local import compose, crds
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
    plans, results = asyncio.run(_namespace_record(project))
    problems = exactly_once_problems(plans, results, redeliveries=False)
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
