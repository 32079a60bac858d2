"""Retention by namespace and Run again, through the history server's API on real servers.

Retention: a TrainJob of a namespace kept ``SHORT`` seconds is findable and readable after it was deleted,
its page says until when, and then it is gone: from the list, its pages, and every record stream (a purge,
not a hidden row); a running TrainJob there and other namespaces' TrainJobs stay. Run again: only a user a
SubjectAccessReview lets create TrainJobs in the namespace may, the new TrainJob is the recorded spec under
the new name, created with the caller's own token, under the rules the server keeps for a write.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Any

import pytest
from kubernetes import client as kube_client

from contracts import streams, subjects
from history_server.index import Summary
from history_server.rerun import RUN_AGAIN_OF, Creator, RunAgainError
from history_server.retention import StreamRecords
from plumbing import bus
from plumbing.bus_history import read_stream
from plumbing.kube import KubeConfig

from .keep_support import SHORT, Kept, publish
from .support import get, run_async

pytestmark = [pytest.mark.cluster, pytest.mark.nats]


def _json(url: str, token: str) -> tuple[int, Any]:
    status, body, _ = get(url, token)
    return status, json.loads(body) if body else None


def post(
    url: str, token: str | None, body: object, *, content_type: str = "application/json", **headers: str
) -> tuple[int, Any]:
    sent = {"Content-Type": content_type, **headers}
    if token:
        sent["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers=sent, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=20) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def _job(kept: Kept, namespace: str, name: str) -> str:
    return f"{kept.server.url}/api/v1/namespaces/{namespace}/trainjobs/{name}"


def _names(kept: Kept, namespace: str) -> dict[str, str]:
    status, body = _json(f"{kept.server.url}/api/v1/namespaces/{namespace}/trainjobs", kept.tokens["runner"])
    assert status == 200, body
    return {item["name"]: item["state"] for item in body["items"]}


def _wait(what: str, check: Any, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"not within {timeout:.0f} s: {what}"
        time.sleep(0.3)


def _records(kept: Kept, namespace: str, name: str) -> dict[str, int]:
    """How many records each record stream holds of one TrainJob."""
    filters = {
        streams.EVENTS_HISTORY.name: subjects.trainjob_events_filter(namespace, name),
        streams.APPLY_HISTORY.name: subjects.trainjob_apply_filter(namespace, name),
        streams.RESULTS.name: subjects.trainjob_results_filter(namespace, name),
        streams.DLQ.name: f"{subjects.DLQ_PREFIX}.*.{namespace}.{name}",
        streams.PROGRESS.name: subjects.trainjob_progress_filter(namespace, name),
    }

    async def count() -> dict[str, int]:
        nc = await bus.connect(kept.nats_url, name="test-retention-count", creds=kept.admin_creds)
        try:
            js = nc.jetstream()
            return {stream: len(await read_stream(js, stream, subject)) for stream, subject in filters.items()}
        finally:
            await nc.close()

    return run_async(count)


# ------------------------------------------------------------------------------------------ retention


def test_a_deleted_trainjob_is_readable_until_its_namespace_keeps_it_and_then_gone_from_every_stream(
    kept: Kept,
) -> None:
    short, name = kept.short, "doomed"
    run_async(lambda: publish(kept.nats_url, kept.admin_creds, short, name, delete=True))
    _wait("the deleted TrainJob in the list", lambda: _names(kept, short).get(name) == "Deleted")
    status, body = _json(_job(kept, short, name) + "/retention", kept.tokens["runner"])
    assert status == 200, body
    assert body["policy"] is True and body["keepForSeconds"] == SHORT
    assert body["keptUntil"] == pytest.approx(body["ended"] + SHORT)
    assert body["keptUntil"] > time.time() - 1  # still kept: its page reads
    before = _records(kept, short, name)
    assert all(before.values()), before  # events, plans, results, the dead letter, progress

    _wait("the TrainJob gone from the list", lambda: name not in _names(kept, short), timeout=SHORT + 60)
    assert time.time() >= body["keptUntil"]
    for tail in ("/history", "/progress", "/retention"):
        assert get(_job(kept, short, name) + tail, kept.tokens["runner"])[0] == 404, tail
    assert _records(kept, short, name) == dict.fromkeys(before, 0)
    # A TrainJob that still runs is never expired by the policy; other namespaces keep theirs.
    assert _names(kept, short) == {"lives": "Running"}
    assert _records(kept, short, "lives")[streams.EVENTS_HISTORY.name] == 1
    assert _names(kept, kept.mine)["deleted"] == "Deleted"
    status, body = _json(_job(kept, kept.mine, "running") + "/retention", kept.tokens["runner"])
    assert (status, body["keptUntil"], body["keepForSeconds"]) == (200, None, 3600.0)


def test_how_long_a_trainjob_is_kept_is_told_only_to_who_may_read_it(kept: Kept) -> None:
    url = _job(kept, kept.short, "lives") + "/retention"
    assert get(url)[0] == 401
    assert get(url, kept.tokens["outsider"])[0] == 403
    assert get(url, kept.tokens["viewer"])[0] == 403
    assert get(_job(kept, kept.short, "never-was") + "/retention", kept.tokens["outsider"])[0] == 403


def test_a_purge_removes_only_what_was_stored_before_the_sweep_looked(kept: Kept) -> None:
    """A TrainJob made again under an expired one's name keeps its own records."""
    namespace, name = "keep-bounds", f"again-{int(time.time())}"
    history, subject = streams.EVENTS_HISTORY.name, subjects.trainjob_events_filter(namespace, name)

    async def scenario() -> tuple[int, int]:
        import asyncio

        admin = await bus.connect(kept.nats_url, name="test-bounds", creds=kept.admin_creds)
        keeper = await bus.connect(kept.nats_url, name="test-keeper", creds=kept.keeper_creds)
        js = admin.jetstream()

        async def recorded(count: int) -> None:  # the history stream copies from the work stream
            for _ in range(200):
                if len(await read_stream(js, history, subject)) >= count:
                    return
                await asyncio.sleep(0.05)
            raise AssertionError(f"{count} record(s) of {subject} never reached {history}")

        try:
            await js.publish(subjects.event_subject(namespace, name), b'{"type":"trainjob.deleted"}')
            await recorded(1)
            store = StreamRecords(keeper)
            bounds = await store.bounds()
            await js.publish(subjects.event_subject(namespace, name), b'{"type":"trainjob.deleted"}')
            await recorded(2)
            purged = await store.purge(Summary(namespace=namespace, name=name), bounds)
            return purged, len(await read_stream(js, history, subject))
        finally:
            await keeper.close()
            await admin.close()

    assert run_async(scenario) == (1, 1)  # the first went; the second, stored after the bounds, stays


# ------------------------------------------------------------------------------------------ run again


def test_run_again_creates_the_recorded_trainjob_under_a_new_name_with_the_callers_token(kept: Kept) -> None:
    url = _job(kept, kept.mine, "finished") + "/run-again"
    status, offer = _json(url, kept.tokens["runner"])
    assert (status, offer["allowed"], offer["finished"]) == (200, True, True), offer
    status, made = post(url, kept.tokens["runner"], {"name": "finished-again"})
    assert status == 201, made
    assert (made["namespace"], made["name"]) == (kept.mine, "finished-again") and made["uid"]
    custom = kube_client.CustomObjectsApi(kept.api)
    new = custom.get_namespaced_custom_object(
        "trainer.kubeflow.org", "v1alpha1", kept.mine, "trainjobs", "finished-again"
    )
    assert new["metadata"]["annotations"][RUN_AGAIN_OF] == f"{kept.mine}/finished (uid uid-{kept.mine}-finished)"
    assert new["spec"]["trainer"]["numNodes"] == 2
    assert new["spec"]["runtimeRef"]["name"] == "torch-distributed"
    assert "status" not in new or not new["status"].get("conditions")
    # The same name again: the API server's answer, passed on.
    assert post(url, kept.tokens["runner"], {"name": "finished-again"})[0] == 409
    # A deleted TrainJob runs again from its record.
    status, made = post(_job(kept, kept.mine, "deleted") + "/run-again", kept.tokens["runner"], {"name": "undeleted"})
    assert status == 201, made


def test_run_again_is_not_offered_to_a_viewer_and_refused_to_another_namespaces_user(kept: Kept) -> None:
    url = _job(kept, kept.mine, "finished") + "/run-again"
    status, offer = _json(url, kept.tokens["viewer"])
    assert (status, offer["allowed"]) == (200, False)
    status, said = post(url, kept.tokens["viewer"], {"name": "by-viewer"})
    assert status == 403 and "may not create TrainJobs" in said["error"]
    # A user who may create TrainJobs in another namespace may not even read this one.
    assert get(url, kept.tokens["outsider"])[0] == 403
    assert post(url, kept.tokens["outsider"], {"name": "by-outsider"})[0] == 403
    assert post(url, None, {"name": "anonymous"})[0] == 401
    custom = kube_client.CustomObjectsApi(kept.api)
    names = {
        j["metadata"]["name"]
        for j in custom.list_namespaced_custom_object("trainer.kubeflow.org", "v1alpha1", kept.mine, "trainjobs")[
            "items"
        ]
    }
    assert not names & {"by-viewer", "by-outsider", "anonymous"}


def test_run_again_keeps_the_rules_of_a_write(kept: Kept) -> None:
    url = _job(kept, kept.mine, "finished") + "/run-again"
    token = kept.tokens["runner"]
    assert post(url, token, {"name": "as-form"}, content_type="application/x-www-form-urlencoded")[0] == 415
    assert post(url, token, {"name": "elsewhere"}, Origin="https://evil.example")[0] == 403
    assert post(url, token, {"name": "cross"}, **{"Sec-Fetch-Site": "cross-site"})[0] == 403
    assert post(url + "?access_token=x", token, {"name": "in-url"})[0] == 400
    assert post(url, token, {"name": "Not A Name"})[0] == 400
    assert post(url, token, ["not", "an", "object"])[0] == 400
    assert post(_job(kept, kept.mine, "running") + "/run-again", token, {"name": "still-running"})[0] == 409
    status, _ = post(url, token, {"name": "same-site"}, Origin=kept.server.url)
    assert status == 201


def test_the_create_goes_with_the_callers_token_only(kept: Kept) -> None:
    """The server's own kubeconfig here may create anything; the outsider may not create in ``mine``."""
    creator = Creator.of(KubeConfig.load(str(kept.kubeconfig)))
    body = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "not-mine", "namespace": kept.mine},
        "spec": {"runtimeRef": {"name": "torch-distributed"}},
    }

    async def create() -> int:
        import aiohttp

        async with aiohttp.ClientSession() as session:
            try:
                await creator.create(session, kept.tokens["outsider"], body)
            except RunAgainError as exc:
                return exc.status
        return 201

    assert run_async(create) == 403
