"""The fleet's history server: every cluster's TrainJobs in one list, each cluster's own API server deciding.

A viewer bound in cluster A's ``team-x`` sees A's TrainJobs there and nothing of B, not even B's ``team-x``
(same namespace, a TrainJob of the same name): not in the list, a timeline, the progress or its CSV. A token
B issued gets nothing of A. The server's only Kubernetes credential per cluster may create TokenReviews and
SubjectAccessReviews and nothing else. ``tjpipe history``, ``replay`` and ``plan --from-history`` read one
cluster's records at the hub with ``--cluster``.
"""

from __future__ import annotations

import csv
import io
import json
import os
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from typing import Any

import pytest
from history.support import get
from kubernetes import client as kube_client

from .conftest import LOSS, NAMESPACE, OWN, World, _token

pytestmark = [pytest.mark.cluster, pytest.mark.nats, pytest.mark.timeout(180)]


def _api(world: World, path: str, token: str | None) -> tuple[int, Any, dict[str, str]]:
    status, body, headers = get(f"{world.server.url}/api/v1{path}", token)
    try:
        return status, json.loads(body), headers
    except ValueError:
        return status, body.decode(), headers


def _job(cluster: str, name: str) -> str:
    return f"/clusters/{cluster}/namespaces/{NAMESPACE}/trainjobs/{name}"


def _until_listed(world: World, token: str, cluster: str, count: int) -> list[dict[str, Any]]:
    from tjpipe.local.procs import wait_until

    found: list[dict[str, Any]] = []

    def listed() -> bool:
        nonlocal found
        status, body, _ = _api(world, f"/clusters/{cluster}/namespaces/{NAMESPACE}/trainjobs", token)
        found = body["items"] if status == 200 else []
        return len(found) >= count

    wait_until(listed, timeout=30, what=f"cluster {cluster}'s TrainJobs in the fleet's index")
    return found


def test_a_viewer_of_a_sees_a_s_team_x_and_nothing_of_b(world: World) -> None:
    a = world.clusters["a"]
    listed = _until_listed(world, a.viewer, "a", 2)
    assert sorted((j["cluster"], j["namespace"], j["name"]) for j in listed) == [
        ("a", NAMESPACE, "alpha"),
        ("a", NAMESPACE, "shared"),
    ]
    shared = next(j for j in listed if j["name"] == "shared")
    assert shared["progress"]["metrics"] == {"loss": LOSS["a"]}

    # The fleet-wide list, the token offered to both clusters named: B does not accept it, so B adds nothing.
    status, fleet_list, _ = _api(world, "/trainjobs?cluster=a&cluster=b", a.viewer)
    assert status == 200
    assert {(j["cluster"], j["name"]) for j in fleet_list["items"]} == {("a", "alpha"), ("a", "shared")}
    assert {c["cluster"]: c["accepted"] for c in fleet_list["clusters"]} == {"a": True, "b": False}
    assert [j["progress"]["metrics"] for j in fleet_list["items"] if j["name"] == "shared"] == [{"loss": LOSS["a"]}]
    status, only_a, _ = _api(world, "/trainjobs?cluster=a&state=Running", a.viewer)
    assert status == 200 and {j["name"] for j in only_a["items"]} == {"alpha", "shared"}
    assert [c["cluster"] for c in only_a["clusters"]] == ["a"]
    assert _api(world, "/trainjobs?cluster=b", a.viewer)[0] == 401

    # A's timeline, progress and CSV: A's records, named as A's.
    status, timeline, _ = _api(world, _job("a", "shared") + "/history", a.viewer)
    assert status == 200 and timeline["trainjob"]["cluster"] == "a"
    assert {e["kind"] for e in timeline["entries"]} >= {"event", "plan", "result", "dead-letter"}
    status, progress, _ = _api(world, _job("a", "shared") + "/progress", a.viewer)
    assert status == 200 and [p["metrics"]["loss"] for p in progress["points"]] == [LOSS["a"]]
    status, text, headers = _api(world, _job("a", "shared") + "/progress?output=csv", a.viewer)
    assert (
        status == 200 and headers["Content-Disposition"] == f'attachment; filename="a_{NAMESPACE}_shared_progress.csv"'
    )
    assert [r["loss"] for r in csv.DictReader(io.StringIO(text))] == [LOSS["a"]]

    # Nothing of B: its team-x (same name), its shared (same name), its own TrainJob: 401, and no record.
    for path in (
        f"/clusters/b/namespaces/{NAMESPACE}/trainjobs",
        "/clusters/b/trainjobs",
        "/clusters/b/namespaces",
        _job("b", "shared") + "/history",
        _job("b", "shared") + "/progress",
        _job("b", "shared") + "/progress?output=csv",
        _job("b", "beta") + "/history",
        _job("b", "beta") + f"/plans/{world.event_seqs['b'][0]}",
    ):
        status, body, _ = _api(world, path, a.viewer)
        assert status == 401, path
        assert set(body) == {"status", "error"}, path
    # B's TrainJob under A's name is not B's: A has no beta.
    assert _api(world, _job("a", "beta") + "/history", a.viewer)[0] == 404
    # In A itself, only what A's RBAC grants: not the cluster-wide list, not another namespace.
    assert _api(world, "/clusters/a/trainjobs", a.viewer)[0] == 403
    assert _api(world, "/clusters/a/namespaces/tjpipe-system/trainjobs", a.viewer)[0] == 403
    assert _api(world, "/clusters/a/namespaces", a.viewer)[1] == {"items": [NAMESPACE], "clusterWide": False}


def test_a_token_b_issued_is_refused_for_a_and_reads_b(world: World) -> None:
    b = world.clusters["b"]
    for path in (f"/clusters/a/namespaces/{NAMESPACE}/trainjobs", _job("a", "shared") + "/history"):
        assert _api(world, path, b.viewer)[0] == 401, path
    listed = _until_listed(world, b.viewer, "b", 2)
    assert sorted((j["cluster"], j["name"]) for j in listed) == [("b", "beta"), ("b", "shared")]
    status, progress, _ = _api(world, _job("b", "shared") + "/progress", b.viewer)
    assert status == 200 and [p["metrics"]["loss"] for p in progress["points"]] == [LOSS["b"]]
    status, who, _ = _api(world, "/whoami?cluster=a&cluster=b", b.viewer)
    assert status == 200
    assert {c["cluster"]: c["accepted"] for c in who["clusters"]} == {"a": False, "b": True}
    assert who["username"] == f"system:serviceaccount:{NAMESPACE}:viewer"


def test_a_fleet_request_reaches_only_the_api_server_of_the_cluster_it_names(world: World) -> None:
    """A token goes to the members named and to no other: a request that names none is refused before any
    member sees it (a compromised member would otherwise collect every cluster's tokens). Counted by each API
    server's own ``apiserver_request_total`` for TokenReviews."""
    from status_endpoint.support import token_reviews

    a = world.clusters["a"]

    def reviews() -> dict[str, int]:
        return {name: token_reviews(c.kube) for name, c in world.clusters.items()}

    before = reviews()
    for path in ("/trainjobs", "/whoami", "/health"):
        status, body, _ = _api(world, path, a.viewer)
        assert status == 400 and "?cluster=NAME" in body["error"], (path, body)
    assert reviews() == before
    # A token the server has not reviewed yet: one it reviewed in an earlier test is answered from its cache.
    with a.kube.api_client() as client:
        fresh = _token(kube_client.CoreV1Api(client), NAMESPACE, "viewer")
    for path in ("/trainjobs?cluster=a", "/whoami?cluster=a", "/health?cluster=a"):
        assert _api(world, path, fresh)[0] == 200, path
    after = reviews()
    assert after["b"] == before["b"] and after["a"] > before["a"]


def test_fleet_health_shows_a_cluster_only_to_who_may_list_it_there(world: World) -> None:
    """The index's counts are a whole cluster's: shown for a cluster whose API server lets the caller list
    TrainJobs cluster-wide, and the fleet streams' totals (every member's) only to who may in every cluster."""
    a = world.clusters["a"]
    status, health, _ = _api(world, "/health?cluster=a&cluster=b", a.viewer)  # a viewer of one namespace of A
    assert status == 200 and health["index"] == {} and health["streams"] == []
    admin_of_a = a.kube.token  # may list everything in A, and is nobody in B
    status, health, _ = _api(world, "/health?cluster=a&cluster=b", admin_of_a)
    assert status == 200 and set(health["index"]) == {"a"} and health["streams"] == []


def test_a_timeline_at_the_hub_names_each_event_as_its_plans_do(world: World) -> None:
    """The hub's copies name the member's history stream, not its work stream: the events are numbered as
    their plans name them, so a plan and the diff of two plans open from the timeline."""
    a = world.clusters["a"]
    status, timeline, _ = _api(world, _job("a", "alpha") + "/history", a.viewer)
    assert status == 200
    events = [e["seq"] for e in timeline["entries"] if e["kind"] == "event"]
    assert tuple(events) == world.event_seqs["a"]
    planned = {e["detail"]["source_seq"] for e in timeline["entries"] if e["kind"] == "plan"}
    assert planned == set(events)
    first, second = events
    assert _api(world, _job("a", "alpha") + f"/plans/{first}", a.viewer)[0] == 200
    status, diff, _ = _api(world, _job("a", "alpha") + f"/plans/diff?from={first}&to={second}", a.viewer)
    assert status == 200 and "jobset" in diff["components"]


def test_the_reviewer_credential_may_create_reviews_and_nothing_else(world: World) -> None:
    for cluster in world.clusters.values():
        context = ssl.create_default_context(cafile=str(cluster.kube.ca_file))
        for path in (
            "/api/v1/namespaces",
            f"/apis/trainer.kubeflow.org/v1alpha1/namespaces/{NAMESPACE}/trainjobs",
            "/api/v1/namespaces/tjpipe-system/secrets",
        ):
            request = urllib.request.Request(
                cluster.kube.server + path, headers={"Authorization": f"Bearer {cluster.reviewer}"}
            )
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(request, timeout=10, context=context)
            assert refused.value.code == 403, (cluster.name, path)


def test_unknown_clusters_and_bad_names_are_refused(world: World) -> None:
    a = world.clusters["a"]
    assert _api(world, f"/clusters/c/namespaces/{NAMESPACE}/trainjobs", a.viewer)[0] == 404
    assert _api(world, "/trainjobs?cluster=c", a.viewer)[0] == 400
    assert _api(world, "/trainjobs", None)[0] == 401
    assert _api(world, f"/namespaces/{NAMESPACE}/trainjobs", a.viewer)[0] == 404  # no path without a cluster
    status, names, _ = _api(world, "/clusters", None)
    assert (status, names) == (200, {"items": ["a", "b"]})


def _tjpipe(world: World, *argv: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NATS_URL": world.hub_url, "NATS_CREDS": str(world.reader_seed)}
    return subprocess.run(
        [sys.executable, "-m", "tjpipe", *argv], env=env, capture_output=True, text=True, timeout=60, check=False
    )


def test_the_cli_reads_one_cluster_at_the_hub(world: World) -> None:
    for cluster in ("a", "b"):
        done = _tjpipe(world, "history", f"{NAMESPACE}/shared", "--cluster", cluster, "-o", "json")
        assert done.returncode == 0, done.stderr
        rows = json.loads(done.stdout)
        assert [r["detail"]["metrics"]["loss"] for r in rows if r["kind"] == "progress"] == [LOSS[cluster]]
        assert all(r["stream"].startswith("TJ_") for r in rows)

    done = _tjpipe(world, "replay", f"{NAMESPACE}/{OWN['a']}", "--cluster", "a", "-o", "json")
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert (report["events"], report["jobs_changed"]) == (2, [])

    done = _tjpipe(world, "plan", "--from-history", f"{NAMESPACE}/{OWN['b']}", "--cluster", "b", "-o", "json")
    assert done.returncode == 0, done.stderr
    objects = json.loads(done.stdout)
    jobset = next(o for o in objects if o["kind"] == "JobSet")
    assert jobset["metadata"]["namespace"] == NAMESPACE and jobset["metadata"]["name"] == OWN["b"]
    assert jobset["spec"]["replicatedJobs"][-1]["template"]["spec"]["parallelism"] == 2  # the newest record

    missing = _tjpipe(world, "history", f"{NAMESPACE}/{OWN['b']}", "--cluster", "a")
    assert missing.returncode != 0 and "in cluster a" in missing.stderr
    bad = _tjpipe(world, "history", f"{NAMESPACE}/x", "--cluster", "A.*")
    assert bad.returncode == 2 and "--cluster" in bad.stderr


def test_the_export_at_the_hub_holds_one_clusters_record_and_is_refused_for_another(world: World) -> None:
    a = world.clusters["a"]
    _until_listed(world, a.viewer, "a", 2)
    status, body, headers = get(f"{world.server.url}/api/v1{_job('a', 'shared')}/export", a.viewer)
    assert status == 200, body
    assert headers["Content-Disposition"] == f'attachment; filename="a_{NAMESPACE}_shared.jsonl"'
    records = [json.loads(line) for line in body.decode().splitlines()]
    assert records[0]["record"] == "trainjob" and records[0]["cluster"] == "a"
    assert {r["record"] for r in records[1:]} >= {"event", "plan", "result", "dead-letter", "progress"}
    # Each record as cluster A stored it (its own stream's names), none of B's.
    assert {r["stream"] for r in records[1:]} <= {
        "TJ_EVENTS_HISTORY",
        "TJ_APPLY_HISTORY",
        "TJ_RESULTS",
        "TJ_DLQ",
        "TJ_PROGRESS",
    }
    progress = [json.dumps(r["message"]) for r in records if r["record"] == "progress"]
    assert progress and all(LOSS["a"] in p and LOSS["b"] not in p for p in progress)
    assert get(f"{world.server.url}/api/v1{_job('b', 'shared')}/export", a.viewer)[0] == 401
    # The hub keeps no logs: they stay on each cluster's own bus.
    assert get(f"{world.server.url}/api/v1{_job('a', 'shared')}/logs", a.viewer)[0] == 404
