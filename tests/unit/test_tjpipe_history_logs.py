"""What a capture of pod logs keeps, decided from the live cluster's objects alone (``history_server.logs``),
the bucket's names and limits (``contracts.logs``, ``contracts.streams``), and the log-keeper's NATS rights."""

from __future__ import annotations

from typing import Any

from cryptography.hazmat.primitives.asymmetric import ec

from contracts import logs, streams
from history_server import logs as core
from tjpipe import credentials
from tjpipe.keys.pki import private_key_pem

UID = "3f1c2d4e-0000-4000-8000-000000000001"
JOBSET = {"metadata": {"name": "mnist", "uid": "js-uid", "ownerReferences": [{"kind": "TrainJob", "uid": UID}]}}


def _pod(name: str, *, phase: str = "Succeeded", container_id: str | None = "containerd://abc", **labels: str) -> Any:
    status: dict[str, Any] = {"name": "node", "ready": False, "restartCount": 0, "image": "x", "imageID": ""}
    if container_id is not None:
        status["containerID"] = container_id
    return {
        "metadata": {
            "name": name,
            "labels": {
                "jobset.sigs.k8s.io/jobset-name": "mnist",
                "jobset.sigs.k8s.io/jobset-uid": "js-uid",
                "jobset.sigs.k8s.io/replicatedjob-name": "node",
                **labels,
            },
        },
        "spec": {"containers": [{"name": "node"}]},
        "status": {"phase": phase, "containerStatuses": [status]},
    }


def test_secrets_printed_by_training_code_are_blanked_before_they_are_kept() -> None:
    key = private_key_pem(ec.generate_private_key(ec.SECP256R1())).decode().strip()
    key_body = key.splitlines()[1]
    jwt = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJzeXN0ZW06c2EifQ.c2lnbmF0dXJlLXBhcnQ"
    seed = credentials.new_user_seed().decode()
    text = f"step 1\n{key}\nAuthorization: Bearer abcdefgh12345678\ntoken={jwt}\nseed {seed}\nloss 0.1\n"
    kept, count = core.redact(text)
    assert count == 4
    for secret in (key_body, "abcdefgh12345678", jwt, seed):
        assert secret not in kept
    assert kept.startswith("step 1\n[redacted]\n") and kept.endswith("loss 0.1\n")
    assert core.redact("loss 0.25 step 12/12\n") == ("loss 0.25 step 12/12\n", 0)


def test_a_long_log_keeps_its_start_and_its_newest_lines() -> None:
    head = b"".join(b"line %d\n" % i for i in range(1000))
    newest = b"".join(b"line %d\n" % i for i in range(5000, 6000))
    kept = core.shortened(head, newest, most=2000)
    assert kept.startswith(b"line 0\n") and kept.endswith(b"line 5999\n")
    assert b"was not kept" in kept and len(kept) < 2200
    assert core.tail("a\nb\nc\n", 2) == (["b", "c"], 3)


def test_only_the_trainjobs_jobset_and_its_pods_are_read() -> None:
    assert core.owned_by(JOBSET, UID)
    assert not core.owned_by(JOBSET, "another-uid")
    assert core.of_jobset(_pod("mnist-node-0-0"), JOBSET)
    # A pod of an earlier JobSet of the same name (another uid) is not this one's.
    assert not core.of_jobset(_pod("old", **{"jobset.sigs.k8s.io/jobset-uid": "old-uid"}), JOBSET)
    unlabelled = _pod("mnist-node-0-0")
    del unlabelled["metadata"]["labels"]["jobset.sigs.k8s.io/jobset-uid"]
    assert not core.of_jobset(unlabelled, JOBSET)
    unlabelled["metadata"]["ownerReferences"] = [{"kind": "Job", "name": "mnist-node-0"}]
    assert core.of_jobset(unlabelled, JOBSET)


def test_the_plan_says_what_is_read_what_is_missing_and_whether_containers_run() -> None:
    ran = core.plan([_pod("b"), _pod("a")])
    assert [(t.pod, t.container, t.replicated_job) for t in ran.targets] == [
        ("a", "node", "node"),
        ("b", "node", "node"),
    ]
    assert ran.missing == () and not ran.no_containers
    # kwok plays a pod's life without a runtime: it ran, and no container of it has an id.
    simulated = core.plan([_pod("a", container_id=None)])
    assert simulated.targets == () and simulated.no_containers
    pending = core.plan([_pod("a", phase="Pending", container_id=None)])
    assert [(m.pod, m.why) for m in pending.missing] == [("a", logs.NOT_STARTED)] and not pending.no_containers
    gone = core.plan([])
    assert [m.why for m in gone.missing] == [logs.POD_GONE]


def test_a_failed_read_says_why_without_a_credential() -> None:
    target = core.Target("a", "node", "node", "Succeeded")
    assert core.missing_after_error(target, 404, "pods a not found").why == logs.POD_GONE
    assert core.missing_after_error(target, 400, 'container "node" is waiting to start').why == logs.NOT_STARTED
    refused = core.missing_after_error(target, 0, "ClientConnectorError: Bearer abcdefgh12345678 refused")
    assert refused.why == logs.UNREACHABLE and "abcdefgh12345678" not in refused.detail
    assert core.manifest_json(None) is None


def test_a_trainjobs_logs_are_named_by_cluster_namespace_and_uid() -> None:
    assert logs.prefix("", "team-a", UID) == f"local/team-a/{UID}/"
    assert logs.manifest_name("east", "team-a", UID) == f"east/team-a/{UID}/manifest"
    name = logs.piece_name("", "team-a", UID, "20261207T064501.000000Z", "mnist-node-0-0", "node")
    assert name.startswith(logs.prefix("", "team-a", UID))
    manifest = logs.LogManifest(
        cluster="local", namespace="team-a", name="mnist", uid=UID, captured_at=1.0, reason="finished"
    )
    assert logs.decode_manifest(logs.encode_manifest(manifest)) == manifest


def test_the_logs_bucket_has_a_record_streams_limits_and_takes_the_operators() -> None:
    (spec,) = streams.configured_buckets()
    assert spec == streams.LOGS and spec.discard == "old" and spec.max_bytes > 0 and spec.max_age_seconds > 0
    (spec,) = streams.configured_buckets({"TJPIPE_LOGS_MAX_AGE": "30d", "TJPIPE_LOGS_MAX_BYTES": "1gi"})
    assert spec.max_age_seconds == 30 * streams.DAY and spec.max_bytes == 1024**3
    assert spec.stream == "OBJ_tj_logs"


def test_the_log_keeper_may_add_objects_to_the_logs_bucket_and_nothing_else() -> None:
    rules = credentials.permissions()[credentials.LOG_KEEPER]
    assert rules is not None
    assert rules.publish == ("$O.tj_logs.C.>", "$O.tj_logs.M.>") and rules.subscribe == ()
    reader = credentials.permissions()[credentials.READER]
    assert reader is not None and not any(p.startswith("$O.") for p in reader.publish)
    assert "$JS.API.DIRECT.GET.OBJ_tj_logs.>" in reader.publish
