"""compose/docker-compose.yml on a real Docker engine: the stack comes up, runs the demo and 50 more
TrainJobs to Complete on the simulated cluster, survives an applier restart without writing, and leaves
nothing behind.

The images are built first with the project's own offline builder (scripts/compose-images.sh; cached, so
a warm run is seconds). The stack runs under Debian's docker-compose 1.29 where it is installed, else under
the compose v2 plugin built from its module; the file is checked by both.
"""

from __future__ import annotations

import importlib.util
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from faults.support import WriteCounts, read_write_counts
from kubernetes.client import CustomObjectsApi, VersionApi

from tjpipe.local import compose, crds
from tjpipe.local.kubeapi import new_api_client

from .support import REPO, Project, compose_tools, engine_problem

pytestmark = pytest.mark.timeout(2400)

LOAD_NAMESPACE = "compose-load"
LOAD_RUNTIMES = ("torch-distributed", "deepspeed-distributed", "xgboost-distributed")
LOAD_TRAINJOBS = 50
DEMO_TIMEOUT = 600.0
LOAD_TIMEOUT = 600.0
PIPELINE_WRITES = (
    ("jobsets", ""),
    ("configmaps", ""),
    ("secrets", ""),
    ("trainjobs", ""),
    ("trainjobs", "status"),
    ("podgroups", ""),
)
"""What the applier writes; the simulated cluster's own writes (pods, jobs, nodes, leases, JobSet status)
go on while the pipeline is idle and are not counted."""


def _say(line: str) -> None:
    print(f"[compose] {line}", flush=True)


@pytest.fixture(scope="module")
def engine() -> None:
    problem = engine_problem()
    if problem is not None:
        pytest.skip(problem)


@pytest.fixture(scope="module")
def v2_config(engine: None) -> Path | None:
    """compose v2 as built from its Go module, where it is cached; building it takes 10-20 minutes on 2 cores,
    so a run never starts that (tests/deploy checks the file with compose-go, the loader v2 is built on)."""
    return compose.ensure_compose_v2(progress=_say) if compose.compose_v2_built() else None


@pytest.fixture(scope="module")
def images(engine: None) -> None:
    spec = importlib.util.spec_from_file_location("compose_images", REPO / "tools" / "compose_images.py")
    assert spec is not None and spec.loader is not None
    compose_images = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = compose_images  # its dataclasses look their module up there
    spec.loader.exec_module(compose_images)
    started = time.monotonic()
    assert compose_images.main([]) == 0
    _say(f"images ready in {time.monotonic() - started:.0f}s")


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
    for name in ("reader.nk", "nats-ca.crt", "env"):
        assert (project.state / name).is_file()
    assert (project.state / "reader.nk").stat().st_mode & 0o077 == 0


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


def _pipeline_writes(counts: WriteCounts) -> int:
    return sum(counts.writes(resource, sub) for resource, sub in PIPELINE_WRITES)


def test_applier_restart_writes_nothing(project: Project) -> None:
    kube = project.kube()
    # Settled first: the last status writes of the TrainJobs above are done.
    before = read_write_counts(kube)
    for _ in range(30):
        time.sleep(3)
        now = read_write_counts(kube)
        if _pipeline_writes(now - before) == 0:
            break
        before = now
    else:
        raise AssertionError("the pipeline kept writing for 90 s with nothing to do")
    project.run("restart", "applier", timeout=120)
    project.wait_healthy("applier", timeout=120)
    time.sleep(15)
    after = read_write_counts(kube)
    delta = after - before
    assert _pipeline_writes(delta) == 0, {k: v for k, v in delta.all_writes().items() if v}


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
