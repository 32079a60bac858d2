"""``tjpipe status-server`` on the real kube-apiserver and nats-server: Trainer's answers, stricter authorization,
every accepted update in the history, ``status.trainerStatus`` written coalesced by ``trainer-status``.

The refusals are each a request a real caller could send: tokens come from the TokenRequest API (bound to a pod
object, or to nothing), an expired one is a genuine token of the API server's own key with its times moved
back. After every refusal nothing is recorded, the status is unchanged, and the server still serves.
"""

from __future__ import annotations

import json
import secrets
import socket
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as kube_client

from status_server import core
from tjpipe.credentials import Credentials

from .support import (
    GROUP,
    VERSION,
    StatusServer,
    TrainJobWithPods,
    make_trainjob,
    pod_token,
    post,
    records,
    resigned,
    start_status_server,
    token_reviews,
    trainer_status,
    unsigned,
    update,
)

pytestmark = [pytest.mark.cluster, pytest.mark.nats, pytest.mark.timeout(300)]

INTERVAL = 2.0
"""Coalescing interval for these tests: short, so the flood's bound is tested in seconds."""


@pytest.fixture(scope="module")
def server(
    kube: Any, nats_url: str, nats_credentials: Credentials | None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[StatusServer]:
    if kube.local is None or nats_credentials is None:
        pytest.skip("needs the session's own kube-apiserver (its signing key) and NATS identities")
    root = tmp_path_factory.mktemp("status-server")
    with kube.api_client() as api:
        started = start_status_server(
            api,
            admin_kubeconfig=kube.kubeconfig,
            nats_url=nats_url,
            creds=nats_credentials,
            root=root,
            interval=INTERVAL,
        )
    try:
        yield started
    finally:
        print(started.process.log_tail(40))
        started.stop()


@pytest.fixture
def api(kube: Any) -> Iterator[Any]:
    with kube.api_client() as client:
        yield client


def _records(nats_url: str, creds: Credentials | None, namespace: str, name: str) -> list[Any]:
    return list(records(nats_url, creds, namespace, name))


def _until(check: Callable[[], bool], *, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:.0f}s: {what}")
        time.sleep(0.2)


def _job(api: Any, namespace: str, pods: int = 1) -> TrainJobWithPods:
    return make_trainjob(api, namespace, f"tj-{secrets.token_hex(3)}", pods=pods)


def _token(api: Any, job: TrainJobWithPods, pod: int = 0) -> str:
    return pod_token(api, job.namespace, pod=job.pods[pod], audience=core.audience(job.namespace, job.name))


# ------------------------------------------------------------------------------------------- accepted


def test_an_update_is_echoed_recorded_and_applied_by_trainer_status(
    server: StatusServer, api: Any, namespace: str, nats_url: str, nats_credentials: Credentials | None
) -> None:
    job = _job(api, namespace)
    body = update(42, estimatedRemainingSeconds=300, metrics=[{"name": "loss", "value": "0.31"}])
    code, answer = post(server, namespace, job.name, token=_token(api, job), body=body)
    assert code == 200, answer
    sent = body["trainerStatus"]
    echoed = answer["trainerStatus"]
    assert echoed["progressPercentage"] == 42 and echoed["metrics"] == [{"name": "loss", "value": "0.31"}]
    assert echoed["lastUpdatedTime"] == core.format_time(core.parse_time(sent["lastUpdatedTime"]))

    _until(lambda: trainer_status(api, namespace, job.name)[0] is not None, timeout=15, what="status.trainerStatus")
    status, managers = trainer_status(api, namespace, job.name)
    assert status == echoed
    assert managers == ["trainer-status"]

    (record,) = _records(nats_url, nats_credentials, namespace, job.name)
    assert (record.trainjob_uid, record.pod, record.pod_uid) == (job.uid, job.pods[0].name, job.pods[0].uid)
    assert record.service_account == "trainer"
    assert record.trainer_status.progress_percentage == 42
    assert abs(record.updated_at - core.parse_time(sent["lastUpdatedTime"])) < 1e-3
    assert server.process.log_path.read_text().count(_token(api, job)[:40]) == 0


def test_an_update_without_trainer_status_is_answered_and_writes_nothing(
    server: StatusServer, api: Any, namespace: str, nats_url: str, nats_credentials: Credentials | None
) -> None:
    job = _job(api, namespace)
    assert post(server, namespace, job.name, token=_token(api, job), body={}) == (200, {})
    time.sleep(0.5)
    assert trainer_status(api, namespace, job.name)[0] is None
    assert _records(nats_url, nats_credentials, namespace, job.name) == []


def test_an_older_update_is_recorded_but_never_written_over_a_newer_one(
    server: StatusServer, api: Any, namespace: str, nats_url: str, nats_credentials: Credentials | None
) -> None:
    job = _job(api, namespace, pods=2)
    now = time.time()
    assert post(server, namespace, job.name, token=_token(api, job, 0), body=update(60, at=now))[0] == 200
    assert post(server, namespace, job.name, token=_token(api, job, 1), body=update(20, at=now - 30))[0] == 200
    time.sleep(INTERVAL * 2 + 1)
    status, _ = trainer_status(api, namespace, job.name)
    assert status is not None and status["progressPercentage"] == 60
    assert sorted(
        r.trainer_status.progress_percentage for r in _records(nats_url, nats_credentials, namespace, job.name)
    ) == [20, 60]


def test_an_update_from_2099_is_refused_and_the_honest_one_after_it_shows(
    server: StatusServer, api: Any, namespace: str, nats_url: str, nats_credentials: Credentials | None
) -> None:
    """A pod whose clock runs far ahead (or a leaked token) cannot freeze the TrainJob's progress: its update is
    refused with the reason, kept nowhere, and the next honest update is written."""
    job = _job(api, namespace)
    token = _token(api, job)
    future = {"trainerStatus": {"progressPercentage": 99, "lastUpdatedTime": "2099-01-01T00:00:00Z"}}
    code, answer = post(server, namespace, job.name, token=token, body=future)
    assert code == 422 and "ahead of the server's clock" in answer["message"], answer
    assert post(server, namespace, job.name, token=token, body=update(7))[0] == 200
    _until(lambda: (trainer_status(api, namespace, job.name)[0] or {}).get("progressPercentage") == 7,
           timeout=INTERVAL * 3 + 5, what="the honest update in status.trainerStatus")  # fmt: skip
    assert [
        r.trainer_status.progress_percentage for r in _records(nats_url, nats_credentials, namespace, job.name)
    ] == [7]


def test_within_one_second_the_first_update_shows_whichever_replica_decides(
    server: StatusServer, api: Any, namespace: str
) -> None:
    """Every comparison is made at the whole second the live status keeps: an update of the same second as the
    live one, with a smaller fraction, does not replace it, even after the server forgot what it saw (a restart,
    another replica)."""
    job = _job(api, namespace, pods=2)
    second = float(int(time.time()) - 5)
    assert post(server, namespace, job.name, token=_token(api, job, 0), body=update(50, at=second + 0.9))[0] == 200
    _until(lambda: (trainer_status(api, namespace, job.name)[0] or {}).get("progressPercentage") == 50,
           timeout=INTERVAL * 3 + 5, what="the first update written")  # fmt: skip
    server.stop()
    server.restart()
    assert post(server, namespace, job.name, token=_token(api, job, 1), body=update(40, at=second + 0.2))[0] == 200
    time.sleep(INTERVAL + 1.5)
    assert (trainer_status(api, namespace, job.name)[0] or {}).get("progressPercentage") == 50


# ------------------------------------------------------------------------------------------- refused


def _long_metrics(count: int, *, name_length: int = 4) -> list[dict[str, str]]:
    return [{"name": f"m{i:0{name_length - 1}d}", "value": "1"} for i in range(count)]


INVALID: dict[str, tuple[bytes | dict[str, Any], int]] = {
    "oversized": (b'{"trainerStatus": {"metrics": [' + b'{"name": "x", "value": "y"},' * 3000 + b"]}}", 413),
    "malformed JSON": (b'{"trainerStatus": {"progressPercentage": 5', 422),
    "progress above 100": (update(150), 422),
    "progress below 0": (update(-1), 422),
    "progress not a number": (update("half"), 422),  # type: ignore[arg-type]
    "more than 256 metrics": (update(1, metrics=_long_metrics(257)), 422),
    "a name over 64 characters": (update(1, metrics=[{"name": "n" * 65, "value": "1"}]), 422),
    "a value over 64 characters": (update(1, metrics=[{"name": "loss", "value": "1" * 65}]), 422),
    "an empty name": (update(1, metrics=[{"name": "", "value": "1"}]), 422),
    "no lastUpdatedTime": ({"trainerStatus": {"progressPercentage": 5}}, 422),
    "a lastUpdatedTime that is no time": ({"trainerStatus": {"lastUpdatedTime": "yesterday"}}, 422),
    "negative remaining seconds": (update(1, estimatedRemainingSeconds=-5), 422),
    "year 0001 with an offset": ({"trainerStatus": {"lastUpdatedTime": "0001-01-01T00:00:00+01:00"}}, 422),
    "year 9999 with an offset": ({"trainerStatus": {"lastUpdatedTime": "9999-12-31T23:59:59-01:00"}}, 422),
    "an hour ahead of the server's clock": (update(1, at=time.time() + 3600), 422),
}


@pytest.mark.parametrize("case", sorted(INVALID))
def test_an_invalid_body_is_refused_and_nothing_is_written(
    case: str, server: StatusServer, api: Any, namespace: str, nats_url: str, nats_credentials: Credentials | None
) -> None:
    job = _job(api, namespace)
    token = _token(api, job)
    body, expected = INVALID[case]
    code, answer = post(server, namespace, job.name, token=token, body=body)
    assert code == expected, answer
    assert answer.get("kind") == "Status" and answer.get("code") == expected and answer.get("message")
    time.sleep(0.3)
    assert trainer_status(api, namespace, job.name)[0] is None
    assert _records(nats_url, nats_credentials, namespace, job.name) == []
    assert post(server, namespace, job.name, token=token, body=update(1))[0] == 200  # and it still serves


def _refusal_token(case: str, api: Any, kube: Any, job: TrainJobWithPods, other: TrainJobWithPods) -> str | None:
    ns = job.namespace
    mine = core.audience(ns, job.name)
    if case == "no token":
        return None
    if case == "not a token":
        return "not-a-token"
    if case == "a pod of another TrainJob, with this TrainJob's audience":
        return pod_token(api, ns, pod=other.pods[0], audience=mine)
    if case == "this TrainJob's pod, with another TrainJob's audience":
        return pod_token(api, ns, pod=job.pods[0], audience=core.audience(ns, other.name))
    if case == "a wrong audience":
        return pod_token(api, ns, pod=job.pods[0], audience="https://kubernetes.default.svc")
    if case == "the audience and another one":
        spec = kube_client.V1TokenRequestSpec(
            audiences=[mine, "https://kubernetes.default.svc"],
            expiration_seconds=3600,
            bound_object_ref=kube_client.V1BoundObjectReference(
                api_version="v1", kind="Pod", name=job.pods[0].name, uid=job.pods[0].uid
            ),
        )
        return str(
            kube_client.CoreV1Api(api)
            .create_namespaced_service_account_token("trainer", ns, kube_client.AuthenticationV1TokenRequest(spec=spec))
            .status.token
        )
    if case == "a plain ServiceAccount token with the audience":
        return pod_token(api, ns, pod=None, audience=mine)
    if case == "expired":
        past = int(time.time()) - 7200
        return resigned(_token(api, job), kube.local.service_account_private_key, iat=past, nbf=past, exp=past + 600)
    raise AssertionError(case)


REFUSED = (
    "no token",
    "not a token",
    "a pod of another TrainJob, with this TrainJob's audience",
    "this TrainJob's pod, with another TrainJob's audience",
    "a wrong audience",
    "the audience and another one",
    "a plain ServiceAccount token with the audience",
    "expired",
)


@pytest.mark.parametrize("case", REFUSED)
def test_a_caller_that_is_not_a_pod_of_the_trainjob_is_refused(
    case: str,
    server: StatusServer,
    api: Any,
    kube: Any,
    namespace: str,
    nats_url: str,
    nats_credentials: Credentials | None,
) -> None:
    job, other = _job(api, namespace), _job(api, namespace)
    code, answer = post(server, namespace, job.name, token=_refusal_token(case, api, kube, job, other), body=update(5))
    assert code == 403, answer
    assert answer == {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": "Forbidden",
                      "reason": "Forbidden", "code": 403}  # fmt: skip
    time.sleep(0.3)
    assert trainer_status(api, namespace, job.name)[0] is None
    assert _records(nats_url, nats_credentials, namespace, job.name) == []
    assert post(server, namespace, job.name, token=_token(api, job), body=update(1))[0] == 200


def test_fifty_forged_or_malformed_tokens_cost_the_api_server_no_token_review(
    server: StatusServer, api: Any, kube: Any, namespace: str
) -> None:
    """Shape, audience, expiry and the pod binding are read from the token itself before any review: what fails
    there is refused without the API server hearing of it (counted by the API server's own metrics)."""
    job, other = _job(api, namespace), _job(api, namespace)
    genuine = _token(api, job)
    now = int(time.time())
    forged = [
        unsigned(genuine),  # the right claims, no signature
        unsigned(genuine, exp=now + 86400),
        "not-a-token",
        "a.b.c",
        _token(api, other),  # a genuine token of another TrainJob's audience
        resigned(genuine, kube.local.service_account_private_key, iat=now - 7200, nbf=now - 7200, exp=now - 3600),
        resigned(genuine, kube.local.service_account_private_key, **{"kubernetes.io": {"namespace": namespace}}),
        pod_token(api, namespace, pod=job.pods[0], audience="https://kubernetes.default.svc"),
        pod_token(api, namespace, pod=None, audience=core.audience(namespace, job.name)),  # bound to no pod
        genuine[:-5] + "." * 5,
    ]
    before = token_reviews(kube.local)
    codes = [post(server, namespace, job.name, token=forged[i % len(forged)], body=update(5))[0] for i in range(50)]
    assert codes == [403] * 50
    assert token_reviews(kube.local) - before == 0
    assert post(server, namespace, job.name, token=genuine, body=update(6))[0] == 200  # the control: one review
    assert token_reviews(kube.local) - before == 1


def test_a_resigned_token_that_has_not_expired_is_accepted(
    server: StatusServer, api: Any, kube: Any, namespace: str
) -> None:
    """The control for "expired": the same re-signing with times still valid passes, so the refusal above is
    the expiry's and not the signature's."""
    job = _job(api, namespace)
    now = int(time.time())
    token = resigned(_token(api, job), kube.local.service_account_private_key, iat=now, nbf=now, exp=now + 900)
    assert post(server, namespace, job.name, token=token, body=update(3))[0] == 200


def test_unknown_and_deleted_trainjobs_are_not_found(server: StatusServer, api: Any, namespace: str) -> None:
    job = _job(api, namespace)
    token_for_unknown = pod_token(api, namespace, pod=job.pods[0], audience=core.audience(namespace, "no-such-job"))
    code, answer = post(server, namespace, "no-such-job", token=token_for_unknown, body=update(5))
    assert (code, answer.get("message")) == (404, "Train job not found")

    token = _token(api, job)
    kube_client.CustomObjectsApi(api).delete_namespaced_custom_object(GROUP, VERSION, namespace, "trainjobs", job.name)
    # No garbage collector runs on this apiserver: the pod and its token stay, the TrainJob is gone.
    code, answer = post(server, namespace, job.name, token=token, body=update(5))
    assert (code, answer.get("message")) == (404, "Train job not found")


def test_another_path_or_method_is_not_found(server: StatusServer, api: Any, namespace: str) -> None:
    job = _job(api, namespace)
    code, _ = post(server, namespace, job.name + "/../x", token=_token(api, job), body=update(1))
    assert code == 404


def test_plain_http_is_not_served(server: StatusServer) -> None:
    host, port = server.url.removeprefix("https://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as plain:
        plain.sendall(
            b"POST /apis/trainer.kubeflow.org/v1alpha1/namespaces/a/trainjobs/b/status HTTP/1.1\r\nHost: x\r\n\r\n"
        )
        plain.settimeout(5)
        try:
            answer = plain.recv(1024)
        except (ConnectionResetError, TimeoutError):
            answer = b""
    assert b"HTTP/1.1 200" not in answer and b"trainerStatus" not in answer
    with pytest.raises(ssl.SSLError):  # and a client that does not trust the CA does not get through
        context = ssl.create_default_context()
        with (
            socket.create_connection((host, int(port)), timeout=5) as raw,
            context.wrap_socket(raw, server_hostname=host),
        ):
            pass


# ------------------------------------------------------------------------------------------- the flood


def test_a_flood_from_twenty_pods_is_all_recorded_and_written_at_most_once_per_interval(
    server: StatusServer, api: Any, namespace: str, nats_url: str, nats_credentials: Credentials | None
) -> None:
    pods, per_pod = 20, 10
    job = _job(api, namespace, pods=pods)
    tokens = [_token(api, job, i) for i in range(pods)]
    written_before = server.metric("tjpipe_status_writes_total", outcome="written")
    base = time.time()

    def report(i: int) -> list[int]:
        codes = []
        for n in range(per_pod):
            at = base + n + i * 0.0001  # each round a second later: "newer" is a later second
            codes.append(post(server, namespace, job.name, token=tokens[i], body=update(n * 10 + 1, at=at))[0])
        return codes

    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=pods) as pool:
        codes = [code for result in pool.map(report, range(pods)) for code in result]
    took = time.monotonic() - started
    assert codes == [200] * (pods * per_pod)
    time.sleep(INTERVAL + 1.5)  # the last pending write goes out

    writes = server.metric("tjpipe_status_writes_total", outcome="written") - written_before
    allowed = int(took // INTERVAL) + 2  # one at the start of each interval the flood spanned, and the trailing one
    assert 1 <= writes <= allowed, (writes, took)
    records = _records(nats_url, nats_credentials, namespace, job.name)
    assert len(records) == pods * per_pod
    newest = max(records, key=lambda r: r.updated_at)
    status, managers = trainer_status(api, namespace, job.name)
    assert status is not None and status["progressPercentage"] == newest.trainer_status.progress_percentage
    assert managers == ["trainer-status"]
    per_update = writes / (pods * per_pod)
    print(f"{pods * per_pod} updates in {took:.1f}s: {writes:.0f} status writes ({per_update:.3f} per update)")


def _post_headers(server: StatusServer, namespace: str, name: str, token: str, body: dict[str, Any]) -> tuple[int, str]:
    """The status code and the ``Retry-After`` header of one POST."""
    request = urllib.request.Request(server.endpoint(namespace, name), data=json.dumps(body).encode(), method="POST")
    request.add_header("Content-Type", "application/json")
    request.add_header("Authorization", f"Bearer {token}")
    context = ssl.create_default_context(cafile=str(server.ca_file))
    try:
        with urllib.request.urlopen(request, timeout=15, context=context) as response:
            return response.status, response.headers.get("Retry-After", "")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("Retry-After", "")


def test_a_flood_from_one_pod_is_answered_429_and_every_other_trainjob_keeps_its_series_and_status(
    server: StatusServer, api: Any, namespace: str, nats_url: str, nats_credentials: Credentials | None
) -> None:
    others = [_job(api, namespace) for _ in range(3)]
    for i, other in enumerate(others):
        assert post(server, namespace, other.name, token=_token(api, other), body=update(30 + i))[0] == 200
    flooder = _job(api, namespace, pods=2)
    token, neighbour = _token(api, flooder, 0), _token(api, flooder, 1)
    base = time.time() - 50
    answers = [
        _post_headers(server, namespace, flooder.name, token, update(n % 100, at=base + n * 0.5)) for n in range(40)
    ]
    limited = [retry for code, retry in answers if code == 429]
    assert [code for code, _ in answers].count(200) < 40 and limited, answers
    assert all(retry.isdigit() and int(retry) >= 1 for retry in limited), limited
    assert {code for code, _ in answers} <= {200, 429}
    # another pod of the same TrainJob keeps its own share, and the flooder is served once it waited as told
    assert post(server, namespace, flooder.name, token=neighbour, body=update(77))[0] == 200
    time.sleep(int(limited[-1]))
    assert post(server, namespace, flooder.name, token=token, body=update(78))[0] == 200

    time.sleep(INTERVAL + 1.5)
    for i, other in enumerate(others):
        status, _ = trainer_status(api, namespace, other.name)
        assert status is not None and status["progressPercentage"] == 30 + i
        assert [
            r.trainer_status.progress_percentage for r in _records(nats_url, nats_credentials, namespace, other.name)
        ] == [30 + i]
    accepted = [code for code, _ in answers].count(200) + 2
    assert len(_records(nats_url, nats_credentials, namespace, flooder.name)) == accepted  # a 429 is kept nowhere


def test_one_trainjob_past_its_share_of_the_history_loses_its_own_oldest_records_never_anothers(
    nats_url: str, nats_credentials: Credentials | None
) -> None:
    """``TJ_PROGRESS`` keeps at most ``max_msgs_per_subject`` records per TrainJob, on the real nats-server: a
    TrainJob (or a status server with a leaked identity) publishing past it drops its own oldest records only."""
    import asyncio

    from contracts import streams, subjects
    from plumbing import bus
    from tjpipe.local.stack import nats_connect_options

    if nats_credentials is None:
        pytest.skip("needs the session's NATS identities")
    limit = streams.PROGRESS.max_msgs_per_subject
    assert 0 < limit <= 10_000
    namespace = f"share-{secrets.token_hex(3)}"

    async def flood() -> tuple[int, int, int]:
        nc = await bus.connect(nats_url, name="test-flood", **nats_connect_options(nats_credentials, "status-server"))
        try:
            js = nc.jetstream()
            mine, theirs = f"{namespace}-own", f"{namespace}-other"
            await js.publish(subjects.progress_subject(namespace, theirs), b"{}", stream=streams.PROGRESS.name)
            for _ in range(limit + 100):
                await js.publish(subjects.progress_subject(namespace, mine), b"{}", stream=streams.PROGRESS.name)
            reader = await bus.connect(nats_url, name="test-reader", **nats_connect_options(nats_credentials, "reader"))
            try:
                info = await reader.jetstream().stream_info(
                    streams.PROGRESS.name, subjects_filter=subjects.namespace_progress_filter(namespace)
                )
            finally:
                await reader.close()
            counts = info.state.subjects or {}
            return (
                counts.get(subjects.progress_subject(namespace, mine), 0),
                counts.get(subjects.progress_subject(namespace, theirs), 0),
                info.config.max_msgs_per_subject,
            )
        finally:
            await nc.close()

    own, other, configured = asyncio.run(flood())
    assert (own, other, configured) == (limit, 1, limit)


def test_an_update_accepted_but_not_written_when_the_server_is_killed_is_written_after_restart(
    kube: Any, api: Any, namespace: str, nats_url: str, nats_credentials: Credentials | None, tmp_path: Path
) -> None:
    """kill -9 between the answer and the coalesced write: the update is in the history (200 means stored), and
    the next process writes it from there at start-up."""
    slow = start_status_server(
        api, admin_kubeconfig=kube.kubeconfig, nats_url=nats_url, creds=nats_credentials, root=tmp_path, interval=60
    )
    try:
        job = _job(api, namespace)
        token = _token(api, job)
        now = time.time()
        assert post(slow, namespace, job.name, token=token, body=update(10, at=now - 5))[0] == 200
        _until(lambda: (trainer_status(api, namespace, job.name)[0] or {}).get("progressPercentage") == 10,
               timeout=15, what="the first update written at once")  # fmt: skip
        assert post(slow, namespace, job.name, token=token, body=update(95, at=now - 1))[0] == 200
        slow.kill()  # the second waits for the 60 s interval: never written by this process
        assert (trainer_status(api, namespace, job.name)[0] or {}).get("progressPercentage") == 10
        slow.restart()
        # Written by whichever replica reads the history first: this module's other server, running on the same
        # bus, may be sweeping just then (every 30 s), before the restarted one's start-up read is through.
        _until(lambda: (trainer_status(api, namespace, job.name)[0] or {}).get("progressPercentage") == 95,
               timeout=30, what="the recorded update written from the history")  # fmt: skip
        _until(lambda: slow.metric("tjpipe_status_recovered_total") >= 1,
               timeout=30, what="the restarted server reading the recorded updates at start-up")  # fmt: skip
    finally:
        print(slow.process.log_tail(30))
        slow.stop()


def test_the_server_needs_its_own_files(tmp_path: Path) -> None:
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-m", "tjpipe", "status-server", "--tls-cert", str(tmp_path / "none"), "--tls-key", "x"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2 and "no such file" in result.stderr
