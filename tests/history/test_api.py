"""The JSON API and its authorization against the real apiserver: TokenReview, SubjectAccessReview, RBAC.

A reader of namespace A gets A's records and a 403 for B's, whichever way B is asked about (its list, a
TrainJob's timeline, a plan, a diff, the cluster-wide list), and the list of namespaces names A alone;
a group binding counts as the cluster counts it; a revoked binding stops working within the cache's
second; no token, a bad one or one in the URL never gets data; and no token ever reaches the log.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
import yaml
from kubernetes import client as kube_client

from .conftest import World
from .support import get

pytestmark = [pytest.mark.cluster, pytest.mark.nats]


def _api(world: World, path: str, who: str | None) -> tuple[int, Any]:
    status, body, _ = get(f"{world.server.url}/api/v1{path}", world.token(who) if who else None)
    try:
        return status, json.loads(body)
    except ValueError:
        return status, body.decode()


def _trainjobs(world: World, namespace: str, who: str) -> tuple[int, Any]:
    return _api(world, f"/namespaces/{namespace}/trainjobs", who)


def test_no_token_or_a_bad_one_is_401_and_a_token_in_the_url_is_refused(world: World) -> None:
    ns = world.a.namespace
    assert _trainjobs(world, ns, None)[0] == 401
    status, body, headers = get(f"{world.server.url}/api/v1/namespaces/{ns}/trainjobs", "not-a-token")
    assert status == 401 and headers.get("WWW-Authenticate") == "Bearer"
    assert b"alpha" not in body
    status, body, _ = get(f"{world.server.url}/api/v1/namespaces/{ns}/trainjobs?access_token=x")
    assert status == 400 and b"Authorization header" in body
    assert get(f"{world.server.url}/healthz")[0] == 200
    assert get(f"{world.server.url}/readyz")[0] == 200


def test_a_serviceaccount_bound_in_a_reads_a_and_nothing_of_b(world: World) -> None:
    a, b = world.a, world.b
    status, listing = _trainjobs(world, a.namespace, "viewer-a")
    assert status == 200
    assert [(j["namespace"], j["name"], j["state"]) for j in listing["items"]] == [(a.namespace, "alpha", "Running")]
    assert listing["items"][0]["runtime"] == "torch-distributed" and listing["items"][0]["deadLetters"] == 1

    assert _api(world, "/namespaces", "viewer-a") == (200, {"items": [a.namespace], "clusterWide": False})
    assert _api(world, "/whoami", "viewer-a")[1]["username"] == f"system:serviceaccount:{a.namespace}:viewer"

    forbidden = [
        f"/namespaces/{b.namespace}/trainjobs",
        f"/namespaces/{b.namespace}/trainjobs/beta/history",
        f"/namespaces/{b.namespace}/trainjobs/beta/plans/{b.event_seqs[0]}",
        f"/namespaces/{b.namespace}/trainjobs/beta/plans/diff?from={b.event_seqs[0]}&to={b.event_seqs[1]}",
        "/trainjobs",
    ]
    for path in forbidden:
        status, body = _api(world, path, "viewer-a")
        assert status == 403, path
        assert set(body) == {"status", "error"}, path  # a refusal, never a record
    # B's TrainJob does not exist in A: nothing, not B's record.
    assert _api(world, f"/namespaces/{a.namespace}/trainjobs/beta/history", "viewer-a")[0] == 404


def test_a_timeline_holds_events_plans_results_and_dead_letters_with_the_fields_changed(world: World) -> None:
    a = world.a
    status, timeline = _api(world, f"/namespaces/{a.namespace}/trainjobs/alpha/history", "viewer-a")
    assert status == 200
    kinds = [e["kind"] for e in timeline["entries"]]
    assert kinds.count("event") == 2 and kinds.count("dead-letter") == 1
    assert kinds.count("plan") >= 4 and kinds.count("result") >= 3
    second = [e for e in timeline["entries"] if e["kind"] == "event"][1]
    assert "spec.trainer.numNodes" in second["detail"]["changed"]
    assert all(a.namespace in json.dumps(e) for e in timeline["entries"] if e["kind"] != "event")
    assert "beta" not in json.dumps(timeline)
    times = [e["time"] for e in timeline["entries"]]
    assert times == sorted(times)


def test_the_plan_of_an_event_is_yaml_and_two_plans_diff_by_field(world: World) -> None:
    a = world.a
    first, second = a.event_seqs
    status, text = _api(world, f"/namespaces/{a.namespace}/trainjobs/alpha/plans/{first}", "viewer-a")
    assert status == 200
    docs = list(yaml.safe_load_all(text))
    assert {d["component"] for d in docs} >= {"jobset", "configmap.alpha-runtime-snapshot"}
    jobset = next(d for d in docs if d["component"] == "jobset")
    assert jobset["object"]["metadata"]["namespace"] == a.namespace and jobset["source_seq"] == first

    path = f"/namespaces/{a.namespace}/trainjobs/alpha/plans/diff?from={first}&to={second}"
    status, diff = _api(world, path, "viewer-a")
    assert status == 200 and (diff["from"], diff["to"]) == (first, second)
    changes = {c["field"]: (c["from"], c["to"]) for c in diff["components"]["jobset"]}
    assert changes["object.spec.replicatedJobs.node.template.spec.parallelism"] == (4, 2)
    assert not any(f in ("observed_at", "source_version") for c in diff["components"].values() for f in c)
    assert _api(world, f"/namespaces/{a.namespace}/trainjobs/alpha/plans/999999", "viewer-a")[0] == 404
    assert _api(world, f"/namespaces/{a.namespace}/trainjobs/alpha/plans/diff?from=x&to=1", "viewer-a")[0] == 400


def test_a_user_reads_what_its_group_is_bound_to_and_an_unbound_user_reads_nothing(world: World) -> None:
    a, b = world.a, world.b
    status, listing = _trainjobs(world, b.namespace, "alice")
    assert status == 200 and [j["name"] for j in listing["items"]] == ["beta"]
    assert _trainjobs(world, a.namespace, "alice")[0] == 403
    assert _api(world, "/namespaces", "alice")[1]["items"] == [b.namespace]

    for path in (f"/namespaces/{a.namespace}/trainjobs", f"/namespaces/{b.namespace}/trainjobs/beta/history"):
        assert _api(world, path, "bob")[0] == 403
    assert _api(world, "/namespaces", "bob")[1] == {"items": [], "clusterWide": False}
    assert _api(world, "/health", "bob")[0] == 200  # pipeline-wide figures, no namespace's records


def test_the_cluster_wide_list_needs_the_cluster_wide_permission(world: World) -> None:
    status, listing = _api(world, "/trainjobs", "admin")
    assert status == 200
    names = {(j["namespace"], j["name"]) for j in listing["items"]}
    assert {(world.a.namespace, "alpha"), (world.b.namespace, "beta")} <= names
    assert _api(world, "/namespaces", "admin")[1]["clusterWide"] is True
    assert _api(world, "/trainjobs?state=Nonsense", "admin")[0] == 400
    assert _api(world, "/namespaces/Not_A_Namespace/trainjobs", "admin")[0] == 400


def test_the_health_page_reads_the_streams_and_the_consumers(world: World) -> None:
    status, health = _api(world, "/health", "viewer-a")
    assert status == 200
    assert {s["stream"] for s in health["streams"]} == {
        "TJ_EVENTS",
        "TJ_APPLY",
        "TJ_EVENTS_HISTORY",
        "TJ_APPLY_HISTORY",
        "TJ_RESULTS",
        "TJ_DLQ",
        "TJ_PROGRESS",
    }
    assert not any("error" in s for s in health["streams"])
    assert len(health["consumers"]) == 32 and not any("error" in c for c in health["consumers"])
    assert health["deadLetters"] >= 2
    assert health["refusedPublishes"]["known"] is False  # this server was told of no /metrics page


def test_a_revoked_binding_stops_working_within_the_cache_time(world: World) -> None:
    b = world.b
    assert _trainjobs(world, b.namespace, "alice")[0] == 200
    kube_client.RbacAuthorizationV1Api(world.api).delete_namespaced_role_binding("trainjob-reader", b.namespace)
    deadline = time.monotonic() + 15
    while _trainjobs(world, b.namespace, "alice")[0] != 403:
        assert time.monotonic() < deadline, "alice still reads B after her binding was deleted"
        time.sleep(0.3)
