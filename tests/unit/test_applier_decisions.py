"""The applier's pure decisions: error classes (``applier.errors``), apply policies against the live object and
live state (``applier.claim_round``), and outcome names (``applier.api_answers``)."""

from __future__ import annotations

import msgspec
import pytest

from applier import api_answers, claim_round, errors, live_holds
from contracts import labels
from contracts import messages as m
from contracts.jobset import JobSet

KEY = m.ObjectKey(namespace="ns", name="tj")


@pytest.mark.parametrize("status", [0, 408, 409, 425, 429, 500, 502, 503, 504, 599])
def test_transient_statuses(status: int) -> None:
    err = errors.classify(status, "Reason", "try later", retry_after=2.5)
    assert isinstance(err, errors.TransientError)
    assert err.retry_after == 2.5


def test_transient_retry_after_defaults_to_none_and_text() -> None:
    err = errors.classify(429, "TooManyRequests", "slow down")
    assert isinstance(err, errors.TransientError)
    assert err.retry_after is None
    assert err.reason == "429 TooManyRequests: slow down"
    conn = errors.classify(0, "", "connection refused")
    assert isinstance(conn, errors.TransientError)
    assert conn.reason == "connection refused"


@pytest.mark.parametrize("status", [400, 401, 403, 404, 405, 406, 410, 413, 415, 422])
def test_permanent_statuses(status: int) -> None:
    err = errors.classify(status, "Invalid", "spec.replicatedJobs: field is immutable", retry_after=3)
    assert isinstance(err, errors.PermanentError)
    assert err.reason == f"{status} Invalid: spec.replicatedJobs: field is immutable"
    assert "CRD" not in err.reason


def test_jobsets_refusal_over_a_claim_being_collected_settles_then_is_permanent() -> None:
    text = (
        'admission webhook "vjobset.kb.io" denied the request: spec.volumeClaimPolicies[0].retentionPolicy.'
        'whenDeleted: Invalid value: "Delete": retentionPolicy must be retain when PVC exists'
    )
    err = errors.classify(422, "Invalid", text)
    assert isinstance(err, errors.SettlingRefusal) and isinstance(err, errors.TransientError)
    assert err.permanent.api_reason == "Invalid" and err.permanent.api_message == text
    assert err.permanent.reason == f"422 Invalid: {text}"
    # Another refusal of the same JobSet, by the same webhook, does not settle by itself.
    other = errors.classify(422, "Invalid", "spec does not match existing PVC x-initializer in namespace ns")
    assert type(other) is errors.PermanentError
    assert type(errors.classify(400, "BadRequest", text)) is errors.PermanentError


def test_404_missing_resource_type_mentions_the_crd() -> None:
    err = errors.classify(404, "NotFound", "the server could not find the requested resource")
    assert isinstance(err, errors.PermanentError)
    assert "CRD" in err.reason
    assert err.reason.startswith("404 NotFound: the server could not find the requested resource")


def test_404_missing_object_does_not_mention_the_crd() -> None:
    err = errors.classify(404, "NotFound", 'jobsets.jobset.x-k8s.io "tj" not found')
    assert isinstance(err, errors.PermanentError)
    assert "CRD" not in err.reason


def jobset_message(policy: m.ApplyPolicy, *, suspend: bool | None) -> m.ApplyJobSet:
    body: dict[str, object] = {"metadata": {"name": "tj", "namespace": "ns"}}
    if suspend is not None:
        body["spec"] = {"suspend": suspend}
    return m.ApplyJobSet(
        trainjob=KEY,
        trainjob_uid="u",
        source_seq=1,
        policy=policy,
        trainjob_suspended=suspend is True,
        target=m.Target(api_version="jobset.x-k8s.io/v1alpha2", kind="JobSet", namespace="ns", name="tj"),
        object=msgspec.convert(body, JobSet),
    )


ABSENT = claim_round.LiveState(exists=False)
RUNNING = claim_round.LiveState(exists=True, suspended=False, resource_version="3")
SUSPENDED = claim_round.LiveState(exists=True, suspended=True, resource_version="3")


@pytest.mark.parametrize(
    ("policy", "trainjob_suspended", "live", "allowed"),
    [
        ("always", False, ABSENT, True),
        ("always", False, RUNNING, True),
        ("always", False, SUSPENDED, True),
        ("always", True, RUNNING, True),
        ("if-absent", False, ABSENT, True),
        ("if-absent", False, RUNNING, False),
        ("if-absent", False, SUSPENDED, False),
        ("if-absent", True, RUNNING, False),
        ("while-suspended", False, ABSENT, True),
        ("while-suspended", False, RUNNING, False),
        ("while-suspended", False, SUSPENDED, True),
        ("while-suspended", True, RUNNING, True),
        ("while-suspended", True, SUSPENDED, True),
        ("while-suspended", None, RUNNING, False),
    ],
)
def test_policy_allows(
    policy: m.ApplyPolicy, trainjob_suspended: bool | None, live: claim_round.LiveState, allowed: bool
) -> None:
    ok, why = claim_round.policy_allows(jobset_message(policy, suspend=trainjob_suspended), live)
    assert ok is allowed
    assert (why == "") is allowed


def test_policy_reasons() -> None:
    _, why = claim_round.policy_allows(jobset_message("if-absent", suspend=False), RUNNING)
    assert "exists" in why
    _, why = claim_round.policy_allows(jobset_message("while-suspended", suspend=False), RUNNING)
    assert "not suspended" in why


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (None, claim_round.LiveState(exists=False)),
        (b"{}", claim_round.LiveState(exists=True, suspended=False, resource_version="")),
        (
            b'{"metadata":{"resourceVersion":"12","name":"tj"},"spec":{"suspend":true,"replicatedJobs":[]}}',
            claim_round.LiveState(exists=True, suspended=True, resource_version="12"),
        ),
        (
            b'{"metadata":{"resourceVersion":"13"},"spec":{"suspend":false}}',
            claim_round.LiveState(exists=True, suspended=False, resource_version="13"),
        ),
        (
            b'{"metadata":{"resourceVersion":"14"},"spec":{"suspend":null}}',
            claim_round.LiveState(exists=True, suspended=False, resource_version="14"),
        ),
        (
            b'{"kind":"ConfigMap","metadata":{"resourceVersion":"15"},"data":{"a":"b"}}',
            claim_round.LiveState(exists=True, suspended=False, resource_version="15"),
        ),
    ],
)
def test_live_state(raw: bytes | None, expected: claim_round.LiveState) -> None:
    assert claim_round.live_state(raw) == expected


def test_live_state_rejects_garbage() -> None:
    with pytest.raises(msgspec.DecodeError):
        claim_round.live_state(b"not json")


@pytest.mark.parametrize(
    ("status", "before", "after", "expected"),
    [
        (201, "", "1", "created"),
        (201, "5", "5", "created"),
        (200, "5", "5", "unchanged"),
        (200, "5", "6", "configured"),
        (200, "", "6", "configured"),
        (200, "", "", "configured"),
    ],
)
def test_outcome(status: int, before: str, after: str, expected: m.ApplyAction) -> None:
    assert api_answers.outcome(status, before=before, after=after) == expected


# ------------------------------------------------------------------------------ held_state (takeover)


def _live_jobset(
    *, node_selector: dict[str, str] | None = None, owned: dict[str, object] | None = None, protocol: str = "TCP"
) -> bytes:
    """A JobSet as the API server returns it: a server-defaulted port protocol, Trainer's managedFields entry."""
    port = {"containerPort": 29500, "protocol": protocol}
    port_key = "k:" + msgspec.json.encode(port).decode()
    pod: dict[str, object] = {"containers": [{"name": "node", "ports": [port]}]}
    if node_selector is not None:
        pod["nodeSelector"] = node_selector
    fields = owned or {
        "f:spec": {
            "f:replicatedJobs": {
                'k:{"name":"node"}': {
                    ".": {},
                    "f:name": {},
                    "f:template": {
                        "f:spec": {
                            "f:template": {
                                "f:metadata": {},
                                "f:spec": {
                                    "f:containers": {
                                        'k:{"name":"node"}': {"f:ports": {port_key: {"f:containerPort": {}}}}
                                    }
                                },
                            }
                        }
                    },
                }
            },
            "f:suspend": {},
        }
    }
    return msgspec.json.encode(
        {
            "metadata": {
                "name": "tj",
                "resourceVersion": "7",
                "managedFields": [{"manager": "trainer", "operation": "Apply", "fieldsV1": fields}],
            },
            "spec": {
                "suspend": True,
                "replicatedJobs": [{"name": "node", "template": {"spec": {"template": {"metadata": {}, "spec": pod}}}}],
            },
            "status": {"replicatedJobsStatus": []},
        }
    )


def _planned(*, metadata: bool = True, node_selector: dict[str, str] | None = None, protocol: bool = True) -> bytes:
    port: dict[str, object] = {"containerPort": 29500, **({"protocol": "TCP"} if protocol else {})}
    pod: dict[str, object] = {"containers": [{"name": "node", "ports": [port]}]}
    if node_selector is not None:
        pod["nodeSelector"] = node_selector
    template: dict[str, object] = {"spec": pod, **({"metadata": {}} if metadata else {})}
    return msgspec.json.encode(
        {
            "metadata": {"name": "tj"},
            "spec": {
                "suspend": True,
                "replicatedJobs": [{"name": "node", "template": {"spec": {"template": template}}}],
            },
        }
    )


def test_a_plan_the_live_object_already_holds_needs_no_write() -> None:
    assert live_holds.held_state(_planned(), _live_jobset(), manager="trainer") == "held"


def test_a_plan_that_would_add_or_change_a_value_is_written() -> None:
    assert live_holds.held_state(_planned(node_selector={"pool": "a"}), _live_jobset(), manager="trainer") == "differs"
    planned, live = _planned(node_selector={"pool": "b"}), _live_jobset(node_selector={"pool": "a"})
    assert live_holds.held_state(planned, live, manager="trainer") == "differs"


def test_a_plan_that_stops_sending_an_owned_field_is_written() -> None:
    """The apply would remove it: Trainer's entry owns the empty pod-template metadata the plan leaves out."""
    assert live_holds.held_state(_planned(metadata=False), _live_jobset(), manager="trainer") == "differs"


def test_a_port_the_plan_sends_without_its_defaulted_protocol_is_the_item_the_owner_keys_with_tcp() -> None:
    """The replay of a plan made before the JobSet was seen (no protocol) against one re-planned from it (TCP)."""
    assert live_holds.held_state(_planned(protocol=False), _live_jobset(), manager="trainer") == "held"


def test_a_list_item_the_owner_keys_by_another_value_than_the_default_is_written() -> None:
    """Trainer owns a UDP port; a plan without a protocol would replace it with a TCP one."""
    assert live_holds.held_state(_planned(protocol=False), _live_jobset(protocol="UDP"), manager="trainer") == "differs"


def test_fields_another_manager_owns_do_not_matter() -> None:
    assert live_holds.held_state(_planned(metadata=False), _live_jobset(), manager="someone-else") == "held"


def _config_map(*, labels: dict[str, str] | None, data: str = "a b") -> bytes:
    meta: dict[str, object] = {"name": "tj-mpi-hostfile", **({"labels": labels} if labels is not None else {})}
    return msgspec.json.encode({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {"hostfile": data}})


def test_an_object_trainer_made_that_lacks_only_the_label_gets_the_label_alone() -> None:
    ours = {labels.MANAGED_BY_LABEL: labels.MANAGED_BY}
    planned = _config_map(labels=ours)
    assert live_holds.held_state(planned, _config_map(labels=None), manager="trainer") == "held-unlabelled"
    assert live_holds.held_state(planned, _config_map(labels=ours), manager="trainer") == "held"
    assert live_holds.held_state(planned, _config_map(labels=None, data="other"), manager="trainer") == "differs"
