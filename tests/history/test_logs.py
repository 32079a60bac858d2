"""Kept pod logs and the whole-record export over the history server's JSON API, against the session's real
nats-server and kube-apiserver: what a capture records where there is no log to keep (a simulated cluster's
pods, a kubelet that cannot be asked, a JobSet gone), a capture asked for while a TrainJob runs, a tail and a
download of a kept log, the export as JSON lines, the logs still there once the TrainJob and its pods are gone,
and every one of them refused to a user of another namespace (``tests/history/logs_support.py``)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import pytest
from kubernetes import client as kube_client

from contracts import subjects
from contracts.messages import ObjectKey, TrainJobDeleted, encode
from plumbing import bus

from .logs_support import DONE_LOG, Kept, uid
from .support import get, run_async

pytestmark = [pytest.mark.cluster, pytest.mark.nats]


def _job(world: Kept, name: str, tail: str = "", namespace: str = "") -> str:
    return f"{world.server.url}/api/v1/namespaces/{namespace or world.namespace}/trainjobs/{name}{tail}"


def _post(url: str, token: str | None) -> tuple[int, bytes]:
    request = urllib.request.Request(url, method="POST", headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_on_a_simulated_cluster_the_capture_says_it_runs_no_containers(kept_logs: Kept) -> None:
    answer = kept_logs.logs("sim")
    assert answer["captures"] is True and answer["finished"] is True
    manifest = answer["kept"]
    assert manifest["reason"] == "finished" and manifest["noContainers"] is True and manifest["pieces"] == []
    assert [m["why"] for m in manifest["missing"]] == ["no-containers"]


def test_what_could_not_be_kept_is_recorded_with_its_reason(kept_logs: Kept) -> None:
    lost = kept_logs.logs("lost")["kept"]
    assert lost["pieces"] == [] and not lost["noContainers"]
    [missing] = lost["missing"]
    assert (missing["pod"], missing["container"], missing["why"]) == ("lost-node-0-0", "node", "unreachable")
    assert missing["reason"] == "the node's kubelet could not be reached" and missing["detail"]
    gone = kept_logs.logs("gone")["kept"]
    assert [(m["why"], m["reason"]) for m in gone["missing"]] == [("no-jobset", "the TrainJob's JobSet is gone")]


def test_a_kept_log_has_a_tail_and_a_download(kept_logs: Kept) -> None:
    manifest = kept_logs.logs("done")["kept"]
    assert [(p["pod"], p["container"], p["bytes"]) for p in manifest["pieces"]] == [
        ("done-node-0-0", "node", len(DONE_LOG))
    ]
    status, body, _ = get(_job(kept_logs, "done", "/logs/done-node-0-0/node?tail=3"), kept_logs.tokens["viewer"])
    assert status == 200, body
    tail = json.loads(body)
    assert tail["lines"] == DONE_LOG.splitlines()[-3:] and tail["totalLines"] == 13 and tail["complete"] is True
    status, body, headers = get(
        _job(kept_logs, "done", "/logs/done-node-0-0/node?output=download"), kept_logs.tokens["viewer"]
    )
    assert status == 200 and body.decode() == DONE_LOG
    assert headers["Content-Disposition"] == f'attachment; filename="{kept_logs.namespace}_done_done-node-0-0_node.log"'
    status, body, _ = get(_job(kept_logs, "done", "/logs/another-pod/node"), kept_logs.tokens["viewer"])
    assert status == 404, body
    for bad in ("?tail=0", "?tail=x", "?output=html"):
        assert get(_job(kept_logs, "done", f"/logs/done-node-0-0/node{bad}"), kept_logs.tokens["viewer"])[0] == 400, bad


def test_a_running_trainjobs_logs_are_kept_on_request_and_a_finished_ones_not_again(kept_logs: Kept) -> None:
    assert kept_logs.logs("run")["kept"] is None and kept_logs.logs("run")["finished"] is False
    status, body = _post(_job(kept_logs, "run", "/logs/capture"), kept_logs.tokens["viewer"])
    assert status == 200, body
    assert json.loads(body)["kept"]["reason"] == "requested"
    assert kept_logs.logs("run")["kept"]["reason"] == "requested"
    status, body = _post(_job(kept_logs, "run", "/logs/capture"), kept_logs.tokens["viewer"])
    assert status == 409 and b"just kept" in body, body  # each capture reads every pod's log again: not at once
    status, body = _post(_job(kept_logs, "sim", "/logs/capture"), kept_logs.tokens["viewer"])
    assert status == 409, body


def test_the_export_is_the_whole_record_as_json_lines(kept_logs: Kept) -> None:
    status, body, headers = get(_job(kept_logs, "done", "/export"), kept_logs.tokens["viewer"])
    assert status == 200, body
    assert headers["Content-Type"].startswith("application/x-ndjson")
    assert headers["Content-Disposition"] == f'attachment; filename="{kept_logs.namespace}_done.jsonl"'
    records = [json.loads(line) for line in body.decode().splitlines()]
    assert records[0]["record"] == "trainjob" and records[0]["name"] == "done" and records[0]["state"] == "Complete"
    kinds = [r["record"] for r in records]
    assert kinds.count("event") == 2 and "plan" in kinds and "result" in kinds
    assert records[kinds.index("event")]["message"]["trainjob"]["metadata"]["uid"] == uid(kept_logs.namespace, "done")
    assert kinds[-2:] == ["logs", "log"] and records[-1]["text"] == DONE_LOG
    times = [r["time"] for r in records[1:-2]]
    assert times == sorted(times)
    assert get(_job(kept_logs, "nobody", "/export"), kept_logs.tokens["viewer"])[0] == 404


def test_every_logs_request_and_the_export_are_refused_to_a_user_of_another_namespace(kept_logs: Kept) -> None:
    reads = ["/logs", "/logs/done-node-0-0/node", "/logs/done-node-0-0/node?output=download", "/export"]
    for tail in reads:
        status, body, _ = get(_job(kept_logs, "done", tail), kept_logs.tokens["stranger"])
        assert status == 403, (tail, body)
        assert DONE_LOG.splitlines()[0].encode() not in body
        assert get(_job(kept_logs, "done", tail))[0] == 401, tail
    assert _post(_job(kept_logs, "run", "/logs/capture"), kept_logs.tokens["stranger"])[0] == 403
    assert _post(_job(kept_logs, "run", "/logs/capture"), None)[0] == 401
    # Their own namespace's TrainJob they may export; the viewer may not.
    assert get(_job(kept_logs, "theirs", "/export", kept_logs.other), kept_logs.tokens["stranger"])[0] == 200
    assert get(_job(kept_logs, "theirs", "/export", kept_logs.other), kept_logs.tokens["viewer"])[0] == 403


def test_the_logs_stay_after_the_trainjob_and_its_pods_are_gone(
    kept_logs: Kept, nats_url: str, nats_credentials: Any
) -> None:
    import time

    core = kube_client.CoreV1Api(kept_logs.api)
    custom = kube_client.CustomObjectsApi(kept_logs.api)
    core.delete_namespaced_pod("sim-node-0-0", kept_logs.namespace, grace_period_seconds=0)
    custom.delete_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", kept_logs.namespace, "jobsets", "sim")

    async def delete() -> None:
        nc = await bus.connect(nats_url, name="test-history-logs", creds=nats_credentials.seed_file("admin"))
        try:
            deleted = TrainJobDeleted(
                key=ObjectKey(namespace=kept_logs.namespace, name="sim"),
                uid=uid(kept_logs.namespace, "sim"),
                observed_at=time.time(),
            )
            await nc.jetstream().publish(subjects.event_subject(kept_logs.namespace, "sim"), encode(deleted))
        finally:
            await nc.close()

    run_async(delete)
    deadline = time.monotonic() + 30
    while kept_logs.logs("sim")["trainjob"]["state"] != "Deleted" and time.monotonic() < deadline:
        time.sleep(0.3)
    answer = kept_logs.logs("sim")
    assert answer["trainjob"]["state"] == "Deleted"
    assert answer["kept"]["reason"] == "finished" and answer["kept"]["noContainers"] is True
