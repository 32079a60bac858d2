"""The status server's pure decisions: Trainer's route, the CRD's rules on a body, time forms, the coalescer."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from status_server import core


def test_the_route_is_trainers_and_names_are_kubernetes_names() -> None:
    assert core.route(core.status_path("team-a", "mnist")) == ("team-a", "mnist")
    assert core.route("/apis/trainer.kubeflow.org/v1alpha1/namespaces/a/trainjobs/b") is None
    assert core.route(core.status_path("A", "b")) is None
    assert core.route(core.status_path("a", "b.c")) is None
    assert core.audience("a", "b") == "trainer.kubeflow.org/v1alpha1/namespaces/a/trainjobs/b/status"


@pytest.mark.parametrize(
    ("header", "token"),
    [("Bearer abc", "abc"), ("bearer   abc ", "abc"), ("Basic abc", ""), ("Bearer", ""), ("Bearer a b", "")],
)
def test_a_bearer_header_as_rfc_7235_says(header: str, token: str) -> None:
    assert core.bearer_token(header) == token


def test_times_as_the_sdk_sends_them_and_as_kubernetes_writes_them() -> None:
    sdk = "2026-12-03T22:00:01.654321+00:00"  # datetime.now(timezone.utc).isoformat()
    assert core.parse_time(sdk) == pytest.approx(core.parse_time("2026-12-03T22:00:01Z") + 0.654321)
    assert core.parse_time("2026-12-03T23:00:01+01:00") == core.parse_time("2026-12-03T22:00:01Z")
    assert core.format_time(core.parse_time(sdk)) == "2026-12-03T22:00:01Z"
    for bad in ("yesterday", "2026-12-03", "2026-12-03 22:00:01Z"):
        with pytest.raises(ValueError):
            core.parse_time(bad)


def _body(**status: object) -> bytes:
    return json.dumps({"trainerStatus": {"lastUpdatedTime": "2026-12-03T22:00:00Z", **status}}).encode()


def test_a_valid_update_is_normalised_and_echoed() -> None:
    update = core.parse_update(_body(progressPercentage=100, metrics=[{"name": "loss", "value": "0.1"}]))
    assert update is not None and update.status.progress_percentage == 100
    assert json.loads(core.echo(update)) == {
        "trainerStatus": {
            "progressPercentage": 100,
            "metrics": [{"name": "loss", "value": "0.1"}],
            "lastUpdatedTime": "2026-12-03T22:00:00Z",
        }
    }
    assert core.parse_update(b"{}") is None and core.echo(None) == b"{}"


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b"{", "Invalid payload"),
        (b'{"trainerStatus": {"progressPercentage": 1.5}}', "Invalid payload"),
        (_body(progressPercentage=101), "progressPercentage: Invalid value: 101"),
        (_body(estimatedRemainingSeconds=-1), "estimatedRemainingSeconds"),
        (_body(metrics=[{"name": f"m{i}", "value": "1"} for i in range(257)]), "Too many: 257"),
        (_body(metrics=[{"name": "x" * 65, "value": "1"}]), "metrics[0].name: Too long"),
        (_body(metrics=[{"name": "x", "value": ""}]), "metrics[0].value: Required value"),
        (b'{"trainerStatus": {"progressPercentage": 5}}', "lastUpdatedTime is required"),
    ],
)
def test_what_the_crd_refuses_is_refused_before_anything_is_kept(body: bytes, says: str) -> None:
    with pytest.raises(core.Invalid, match=None) as refused:
        core.parse_update(body)
    assert says in str(refused.value)


def _update(at: float) -> core.Update:
    update = core.parse_update(_body())
    assert update is not None
    return core.Update(status=update.status, updated_at=at)


def test_the_coalescer_writes_the_first_at_once_then_the_newest_once_per_interval() -> None:
    c = core.Coalescer(interval=5.0)
    key = ("ns", "tj")
    assert c.due(key, 100.0) is None
    assert c.offer(key, _update(10.0))
    assert c.due(key, 100.0) == 100.0  # never written: at once
    assert c.take(key) == _update(10.0)
    c.written(key, 100.0)
    assert c.offer(key, _update(11.0)) and c.offer(key, _update(13.0))
    assert not c.offer(key, _update(12.0))  # older than one seen: recorded, never written
    assert not c.offer(key, _update(13.0))
    assert c.due(key, 101.0) == 105.0
    assert c.take(key) == _update(13.0) and c.take(key) is None
    c.written(key, 105.0)
    c.put_back(key, _update(13.0))  # a failed write comes back unless something newer came
    assert c.offer(key, _update(14.0))
    c.put_back(key, _update(13.0))
    assert c.take(key) == _update(14.0)


def test_idle_trainjobs_leave_the_table() -> None:
    c = core.Coalescer(interval=5.0)
    c.offer(("ns", "done"), _update(1.0))
    c.take(("ns", "done"))
    c.written(("ns", "done"), 100.0)
    c.offer(("ns", "busy"), _update(1.0))
    assert c.prune(104.0) == 0  # still within its interval
    assert c.prune(106.0) == 1 and list(c.jobs) == [("ns", "busy")]


def _jwt(claims: dict[str, object], *, alg: str = "RS256", signature: str = "c2ln") -> str:
    def part(value: object) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=").decode()

    return f"{part({'alg': alg, 'kid': 'k'})}.{part(claims)}.{signature}"


AUD = core.audience("ns", "tj")
NOW = 1_800_000_000.0
GOOD = {"aud": [AUD], "exp": NOW + 600, "nbf": NOW - 10, "kubernetes.io": {"namespace": "ns", "pod": {"name": "p"}}}


@pytest.mark.parametrize(
    ("token", "says"),
    [
        ("not-a-token", "not a signed JWT"),
        ("a.b.c", "not a signed JWT"),
        (_jwt(GOOD, alg="none"), "not a signed JWT"),
        (_jwt(GOOD, alg="HS256"), "not a signed JWT"),
        (_jwt(GOOD, signature=""), "not a signed JWT"),
        (_jwt(GOOD) + "x" * core.MAX_TOKEN, "not a signed JWT"),
        (_jwt({**GOOD, "aud": ["https://kubernetes.default.svc"]}), "not minted for this TrainJob"),
        (_jwt({**GOOD, "aud": [AUD, "https://kubernetes.default.svc"]}), "not minted for this TrainJob"),
        (_jwt({**GOOD, "exp": NOW - 1}), "expired"),
        (_jwt({k: v for k, v in GOOD.items() if k != "exp"}), "expired"),
        (_jwt({**GOOD, "exp": "soon"}), "expired"),
        (_jwt({**GOOD, "nbf": NOW + 3600}), "not valid yet"),
        (_jwt({**GOOD, "kubernetes.io": {"namespace": "other", "pod": {"name": "p"}}}), "not bound to a pod"),
        (_jwt({**GOOD, "kubernetes.io": {"namespace": "ns"}}), "not bound to a pod"),
    ],
)
def test_a_token_that_cannot_be_a_pods_is_refused_locally(token: str, says: str) -> None:
    assert says in core.screen_token(token, audience=AUD, namespace="ns", now=NOW)


def test_a_token_shaped_as_a_pods_goes_on_to_the_review() -> None:
    assert core.screen_token(_jwt(GOOD), audience=AUD, namespace="ns", now=NOW) == ""
    assert core.screen_token(_jwt({**GOOD, "aud": AUD}), audience=AUD, namespace="ns", now=NOW) == ""


@pytest.mark.parametrize(
    "stamp", ["0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-01:00", "0000-12-31T23:00:00Z", "9999-12-31T24:00:00Z"]
)
def test_a_time_outside_what_metav1_time_holds_is_a_422_not_an_error(stamp: str) -> None:
    with pytest.raises(core.Invalid, match="within years 0001-9999"):
        core.parse_update(_body(lastUpdatedTime=stamp))


def test_the_edges_of_metav1_time_are_kept() -> None:
    for stamp in ("0001-01-01T00:00:00Z", "9999-12-31T23:59:59Z"):
        assert core.format_time(core.parse_time(stamp)) == stamp
    assert core.format_time(core.parse_time("0001-01-01T00:30:00+00:30")) == "0001-01-01T00:00:00Z"


def test_an_update_from_the_future_is_refused_with_the_reason() -> None:
    received = core.parse_time("2026-12-03T22:00:00Z")
    with pytest.raises(core.Invalid, match=r"ahead of the server's clock, more than the 60s allowed"):
        core.parse_update(_body(lastUpdatedTime="2099-01-01T00:00:00Z"), received_at=received)
    with pytest.raises(core.Invalid, match="61s ahead"):
        core.parse_update(_body(lastUpdatedTime="2026-12-03T22:01:01Z"), received_at=received)
    assert core.parse_update(_body(lastUpdatedTime="2026-12-03T22:01:00Z"), received_at=received) is not None
    assert core.parse_update(_body(lastUpdatedTime="2026-12-03T22:05:00Z"), received_at=received, max_skew=300)


def test_times_are_compared_at_the_whole_second_the_live_status_keeps() -> None:
    c = core.Coalescer(interval=5.0)
    key = ("ns", "tj")
    assert c.offer(key, _update(5.9))
    assert not c.offer(key, _update(5.5))  # the same second: not newer, whichever came first
    assert not c.offer(key, _update(5.95))
    assert c.offer(key, _update(6.1))
    assert c.take(key) == _update(6.1)
    live = core.decode_trainjob(b'{"status": {"trainerStatus": {"lastUpdatedTime": "1970-01-01T00:00:06Z"}}}')
    assert live.trainer_status_second() == _update(6.1).second == 6
    assert core.decode_trainjob(b"{}").trainer_status_second() is None
    old = core.Coalescer(interval=5.0)  # a time before 1970 is a time like any other
    assert old.offer(key, _update(-100.0)) and not old.offer(key, _update(-200.0))


def test_a_flood_from_one_pod_is_limited_and_the_others_keep_their_share() -> None:
    pod, job = core.Rate(per_second=1.0, burst=3), core.Rate(per_second=10.0, burst=5)
    limits = core.RateLimits()

    def ask(uid: str, now: float) -> float:
        return limits.take([(("pod", uid), pod), (("trainjob", "ns/tj"), job)], now)

    assert [ask("a", 100.0) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert ask("a", 100.0) == pytest.approx(1.0)  # its own burst is spent: wait one refill
    assert ask("b", 100.0) == 0.0 and ask("b", 100.0) == 0.0  # another pod of the TrainJob: its own bucket
    assert ask("c", 100.0) == pytest.approx(0.1)  # the TrainJob's burst is spent too
    assert ask("a", 100.5) > 0 and ask("a", 101.0) == 0.0  # a refused request cost nothing; served when told
    other = limits.take([(("trainjob", "ns/other"), job)], 100.0)
    assert other == 0.0
    rates = {"pod": pod, "trainjob": job}
    assert limits.prune(101.0, rates) == 2 and set(limits.buckets) == {
        ("pod", "a"),
        ("pod", "b"),
        ("trainjob", "ns/tj"),
    }
    assert limits.prune(200.0, rates) == 3 and not limits.buckets


def _record(name: str, uid: str, at: float, progress: int) -> Any:
    from contracts.messages import ObjectKey
    from contracts.progress import ProgressReported
    from contracts.trainer import TrainerStatus

    status = TrainerStatus(progress_percentage=progress, last_updated_time=core.format_time(at))
    return ProgressReported(
        trainjob=ObjectKey(namespace="ns", name=name), trainjob_uid=uid, pod="p", trainer_status=status,
        received_at=at, updated_at=at,
    )  # fmt: skip


def test_the_newest_recorded_update_of_each_trainjob_is_what_recovery_writes() -> None:
    found = core.newest_recorded(
        [
            _record("a", "u1", 100.0, 10),
            _record("a", "u1", 120.5, 95),
            _record("a", "u1", 110.0, 50),  # arrived last, older: not the one
            _record("a", "u1", 120.9, 96),  # the same second as the newest: the first of it stays
            _record("b", "old", 500.0, 70),
            _record("b", "new", 10.0, 1),  # a new TrainJob of the name: it alone counts
        ]
    )
    assert {k: (r.trainjob_uid, r.update.status.progress_percentage) for k, r in found.items()} == {
        ("ns", "a"): ("u1", 95),
        ("ns", "b"): ("new", 1),
    }
