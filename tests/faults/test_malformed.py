"""(h) Malformed inputs: TrainJobs and runtimes the CRDs accept but Trainer's webhooks would refuse, and
corrupt messages published straight onto the bus (a message of a newer wire version among them).

Each bad TrainJob gets a precise condition (``Failed``/``ValidationFailed`` or ``TrainingRuntimeNotSupported``,
or ``ResourcesCreated=False``/``InvalidRuntime``) and no JobSet. Each corrupt message is kept in TJ_DLQ with
its original bytes, the stage and the reason; an apply the apiserver refuses for good also leaves a
Warning Event on the TrainJob. Through all of it the pipeline keeps going: a good TrainJob created last
converges, and the services are still running.
"""

from __future__ import annotations

import json
import time
from typing import Any

import msgspec
import pytest

from tjpipe.contracts import streams, subjects
from tjpipe.contracts.messages import WIRE_VERSION, ObjectKey, Target, decode_dead_letter, encode

from .conftest import MISSING_CRD
from .support import (
    JOBSET,
    TRAINER,
    Pipeline,
    condition_of,
    converged,
    quiet,
    report,
    results_of,
    services_ready,
    stream_messages,
    trainjob,
    until,
    until_async,
)

pytestmark = [pytest.mark.cluster, pytest.mark.nats, pytest.mark.timeout(120)]

VALIDATION = ("Failed", "True", "ValidationFailed")
UNSUPPORTED = ("Failed", "True", "TrainingRuntimeNotSupported")
INVALID_RUNTIME = ("ResourcesCreated", "False", "InvalidRuntime")

PATCH_BASE = "spec.runtimePatches[0].trainingRuntimeSpec.template.spec.replicatedJobs[0]"
POD = "template.spec.template.spec"


def patch(rjob: dict[str, Any], *, manager: str = "example.com/faults") -> list[dict[str, Any]]:
    return [{"manager": manager, "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [rjob]}}}}]


def pod_patch(name: str, pod: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "template": {"spec": {"template": {"spec": pod}}}}


TUNE = {"command": ["tune", "run"], "numNodes": 1}

# name → (TrainJob, (condition type, status, reason), exact message or substrings)
BAD_TRAINJOBS: dict[str, tuple[dict[str, Any], tuple[str, str, str], list[str]]] = {
    "h-reserved-env": (
        trainjob("h-reserved-env", trainer={"numNodes": 1, "env": [{"name": "PET_NNODES", "value": "9"}]}),
        VALIDATION,
        ["spec.trainer.env: must not have reserved envs, invalid envs configured: [PET_NNODES]"],
    ),
    "h-zero-nodes": (
        trainjob("h-zero-nodes", num_nodes=0),
        VALIDATION,
        ["spec.trainer.numNodes: must be greater than or equal to 1"],
    ),
    "h-negative-procs": (
        trainjob("h-negative-procs", trainer={"numNodes": 1, "numProcPerNode": -2}),
        VALIDATION,
        ["spec.trainer.numProcPerNode: must be greater than or equal to 1"],
    ),
    "h-bad-manager": (
        trainjob(
            "h-bad-manager",
            num_nodes=1,
            patches=patch(pod_patch("node", {"nodeSelector": {"a": "b"}}), manager="nodomain"),
        ),
        VALIDATION,
        ['spec.runtimePatches[0].manager: must be a domain-prefixed path (such as "acme.io/foo")'],
    ),
    "h-missing-rjob": (
        trainjob("h-missing-rjob", num_nodes=1, patches=patch(pod_patch("ghost", {"nodeSelector": {"a": "b"}}))),
        VALIDATION,
        [f"{PATCH_BASE}.name: must not have replicated job that doesn't exist in the runtime job template"],
    ),
    "h-missing-container": (
        trainjob(
            "h-missing-container", num_nodes=1, patches=patch(pod_patch("node", {"containers": [{"name": "sidecar"}]}))
        ),
        VALIDATION,
        [f"{PATCH_BASE}.{POD}.containers[0].name: must not have container that doesn't exist in the runtime job node"],
    ),
    "h-patch-env": (
        trainjob(
            "h-patch-env",
            num_nodes=1,
            patches=patch(pod_patch("node", {"containers": [{"name": "node", "env": [{"name": "X", "value": "1"}]}]})),
        ),
        VALIDATION,
        [
            f"{PATCH_BASE}.{POD}.containers[0].env: must not have envs for the dataset-initializer, "
            "model-initializer, node containers"
        ],
    ),
    "h-unsupported-kind": (
        trainjob("h-unsupported-kind", num_nodes=1, runtime="nb", runtime_kind="Notebook", runtime_group="example.com"),
        UNSUPPORTED,
        ["unsupported runtime: Notebook.example.com"],
    ),
    "h-tune-nodes": (
        trainjob("h-tune-nodes", runtime="torchtune-llama3.2-1b", trainer={**TUNE, "numNodes": 2}),
        VALIDATION,
        ["spec.trainer.numNodes: must be 1 for llama3_2/1B model"],
    ),
    "h-tune-args": (
        trainjob("h-tune-args", runtime="torchtune-llama3.2-1b", trainer={**TUNE, "args": ["output_dir=/tmp/x"]}),
        VALIDATION,
        [
            'spec.trainer.args[0]: must not set immutable config "output_dir" in trainer args; '
            "it is managed by the runtime"
        ],
    ),
    "h-mpi-env": (
        trainjob(
            "h-mpi-env",
            runtime="deepspeed-distributed",
            trainer={"numNodes": 2, "env": [{"name": "OMPI_MCA_orte_default_hostfile", "value": "/x"}]},
        ),
        VALIDATION,
        ["spec.trainer.env: must not have reserved envs, invalid envs configured: [OMPI_MCA_orte_default_hostfile]"],
    ),
    "h-mpi-launcher": (
        trainjob("h-mpi-launcher", runtime="h-mpi-launcher-only", runtime_kind="TrainingRuntime", num_nodes=2),
        VALIDATION,
        [
            "spec.trainer.numNodes: must have 1 when MPI trainingRuntime with enabled runLauncherAsNode "
            "does not have either launcher and node"
        ],
    ),
    "h-mpi-impl": (
        trainjob("h-mpi-impl", runtime="h-mpi-no-impl", runtime_kind="TrainingRuntime", num_nodes=1),
        VALIDATION,
        ["spec.runtimeRef: mlPolicy.mpi.mpiImplementation '' is not supported: only OpenMPI is"],
    ),
    "h-xgboost-env": (
        trainjob(
            "h-xgboost-env",
            runtime="xgboost-distributed",
            trainer={"numNodes": 1, "env": [{"name": "DMLC_TRACKER_URI", "value": "x"}]},
        ),
        VALIDATION,
        ["spec.trainer.env[0]: DMLC_TRACKER_URI is reserved for the XGBoost runtime"],
    ),
    "h-no-dataset-job": (
        trainjob("h-no-dataset-job", num_nodes=1, extra_spec={"initializer": {"dataset": {"storageUri": "hf://x/y"}}}),
        VALIDATION,
        ["spec.runtimeRef: must have dataset-initializer job when trainJob is configured with input datasetConfig"],
    ),
    "h-rt-replicas": (
        trainjob("h-rt-replicas", runtime="h-rt-replicas", runtime_kind="TrainingRuntime", num_nodes=1),
        INVALID_RUNTIME,
        ["TrainingRuntime/h-rt-replicas is invalid: spec.template.spec.replicatedJobs[0].replicas: always must be 1"],
    ),
    "h-rt-container": (
        trainjob("h-rt-container", runtime="h-rt-container", runtime_kind="TrainingRuntime", num_nodes=1),
        INVALID_RUNTIME,
        [
            "TrainingRuntime/h-rt-container is invalid: spec.template.spec.replicatedJobs[0].template.spec.template"
            ".spec.containers: must contain the required container for the ancestor: trainer"
        ],
    ),
    "h-rt-numnodes": (
        trainjob("h-rt-numnodes", runtime="h-rt-numnodes", runtime_kind="TrainingRuntime", trainer={"image": "x"}),
        INVALID_RUNTIME,
        ["TrainingRuntime/h-rt-numnodes is invalid: spec.mlPolicy.numNodes: must be greater than or equal to 1"],
    ),
}


def runtime(name: str, *, spec: dict[str, Any], labels: dict[str, str] | None = None) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name}
    if labels:
        metadata["labels"] = labels
    return {"apiVersion": TRAINER, "kind": "TrainingRuntime", "metadata": metadata, "spec": spec}


def rjob(
    name: str, containers: list[str], *, ancestor: str | None = "trainer", replicas: int | None = None
) -> dict[str, Any]:
    template: dict[str, Any] = {
        "spec": {"template": {"spec": {"containers": [{"name": c, "image": "x"} for c in containers]}}}
    }
    if ancestor:
        template["metadata"] = {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": ancestor}}
    job: dict[str, Any] = {"name": name, "template": template}
    if replicas is not None:
        job["replicas"] = replicas
    return job


def bad_runtimes() -> list[dict[str, Any]]:
    """Namespaced runtimes; none carries the webhook-validation=disabled label, so the checks apply."""
    return [
        runtime(
            "h-rt-replicas",
            spec={
                "mlPolicy": {"numNodes": 1, "torch": {}},
                "template": {"spec": {"replicatedJobs": [rjob("node", ["node"], replicas=2)]}},
            },
        ),
        runtime(
            "h-rt-container",
            spec={
                "mlPolicy": {"numNodes": 1, "torch": {}},
                "template": {"spec": {"replicatedJobs": [rjob("node", ["main"])]}},
            },
        ),
        runtime(
            "h-rt-numnodes",
            spec={
                "mlPolicy": {"numNodes": 0, "torch": {}},
                "template": {"spec": {"replicatedJobs": [rjob("node", ["node"])]}},
            },
        ),
        runtime(
            "h-mpi-launcher-only",
            spec={
                "mlPolicy": {"numNodes": 1, "mpi": {"runLauncherAsNode": True}},
                "template": {"spec": {"replicatedJobs": [rjob("launcher", ["node"])]}},
            },
        ),
        runtime(
            "h-mpi-no-impl",
            spec={
                "mlPolicy": {"numNodes": 1, "mpi": {"mpiImplementation": ""}},
                "template": {
                    "spec": {"replicatedJobs": [rjob("launcher", ["node"]), rjob("node", ["node"], ancestor=None)]}
                },
            },
        ),
    ]


# ---------------------------------------------------------------------------------------------- bus


def valid_apply(
    namespace: str, name: str, *, kind: str = "jobset", uid: str = "00000000-0000-0000-0000-000000000000"
) -> dict[str, Any]:
    """A well-formed JobSet apply message, as a dict to be broken on purpose."""
    from tjpipe.contracts.jobset import JobSet
    from tjpipe.contracts.messages import ApplyJobSet

    obj = msgspec.convert(
        {
            "apiVersion": JOBSET,
            "kind": "JobSet",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "ownerReferences": [
                    {"apiVersion": TRAINER, "kind": "TrainJob", "name": name, "uid": uid, "controller": True}
                ],
            },
            "spec": {
                "replicatedJobs": [
                    {
                        "name": "node",
                        "template": {"spec": {"template": {"spec": {"containers": [{"name": "node", "image": "x"}]}}}},
                    }
                ]
            },
        },
        JobSet,
    )
    message = ApplyJobSet(
        trainjob=ObjectKey(namespace=namespace, name=name),
        trainjob_uid=uid,
        target=Target(api_version=JOBSET, kind="JobSet", namespace=namespace, name=name),
        source_seq=1,
        source_version=1,
        object=obj,
    )
    data: dict[str, Any] = json.loads(encode(message))
    return data


def corrupt_messages(namespace: str) -> list[tuple[str, str, bytes, str]]:
    """(label, subject, payload, expected dead-letter reason) of the corrupt messages, ~600 kB at most."""
    ev = lambda name: subjects.event_subject(namespace, name)  # noqa: E731
    ap = lambda name, comp="jobset": subjects.apply_subject(namespace, name, comp)  # noqa: E731
    huge_json = json.dumps({"type": "trainjob.observed", "junk": "x" * 600_000}).encode()
    wrong_types = valid_apply(namespace, "h-msg-types")
    wrong_types["source_seq"] = "seven"
    missing = valid_apply(namespace, "h-msg-missing")
    del missing["target"]
    newer = valid_apply(namespace, "h-msg-newer")
    newer["wire_version"] = WIRE_VERSION + 1
    newer_event = {"type": "trainjob.observed", "wire_version": WIRE_VERSION + 1, "observed_at": 1}
    return [
        ("event: not JSON", ev("h-ev-garbage"), b"{not json at all", "undecodable"),
        ("event: wrong tag", ev("h-ev-tag"), b'{"type": "trainjob.exploded", "observed_at": 1}', "undecodable"),
        ("event: missing fields", ev("h-ev-missing"), b'{"type": "trainjob.observed"}', "undecodable"),
        (
            "event: wrong types",
            ev("h-ev-types"),
            b'{"type": "trainjob.observed", "trainjob": {"metadata": {"name": 5}}, "observed_at": "yesterday"}',
            "undecodable",
        ),
        ("event: huge", ev("h-ev-huge"), huge_json, "undecodable"),
        ("event: newer wire version", ev("h-ev-newer"), json.dumps(newer_event).encode(), "unsupported-version"),
        ("apply: not JSON", ap("h-msg-garbage"), b"\x00\x01 binary \xff", "undecodable"),
        ("apply: wrong tag", ap("h-msg-tag"), b'{"component": "nope"}', "undecodable"),
        ("apply: missing fields", ap("h-msg-missing"), json.dumps(missing).encode(), "undecodable"),
        ("apply: wrong types", ap("h-msg-types"), json.dumps(wrong_types).encode(), "undecodable"),
        ("apply: huge", ap("h-msg-huge"), huge_json.replace(b"trainjob.observed", b"jobset"), "undecodable"),
        ("apply: newer wire version", ap("h-msg-newer"), json.dumps(newer).encode(), "unsupported-version"),
    ]


def refused_applies(namespace: str, victim_uid: str) -> list[tuple[str, str, bytes, str, str]]:
    """(label, subject, payload, reason, error text) of applies the apiserver refuses for good."""
    # A Volcano PodGroup while Volcano's CRD is not installed: 404, "the server could not find the requested resource".
    volcano = valid_apply(namespace, "h-victim", uid=victim_uid)
    volcano["component"] = "volcano-podgroup"
    volcano["target"] = {
        "api_version": "scheduling.volcano.sh/v1beta1",
        "kind": "PodGroup",
        "namespace": namespace,
        "name": "h-victim",
    }
    volcano["object"] = {
        "apiVersion": "scheduling.volcano.sh/v1beta1",
        "kind": "PodGroup",
        "metadata": {
            "name": "h-victim",
            "namespace": namespace,
            "ownerReferences": [
                {"apiVersion": TRAINER, "kind": "TrainJob", "name": "h-victim", "uid": victim_uid, "controller": True}
            ],
        },
        "spec": {"minMember": 1},
    }
    # A JobSet whose body names another object than the target: the applier refuses it before any request.
    # (Its own target, h-victim-x: on h-victim's JobSet the ledger fence would skip it as older than the
    # real plan, which is right but not what this case is about.)
    renamed = valid_apply(namespace, "h-victim", uid=victim_uid)
    renamed["target"]["name"] = "h-victim-x"
    renamed["object"]["metadata"]["name"] = "somebody-else"
    # (A plan for a TrainJob that does not exist, in a namespace that does not either, is not refused but
    # skipped, with no dead letter: test_full_streams_and_old_buses.py.)
    return [
        (
            "apply: CRD not installed",
            subjects.apply_subject(namespace, "h-victim", "volcano-podgroup"),
            json.dumps(volcano).encode(),
            "permanent",
            # Precise wording ("is the CRD installed?") is test_bugs.py::test_missing_crd_dead_letter_says_so.
            "404",
        ),
        (
            "apply: name mismatch",
            subjects.apply_subject(namespace, "h-victim", "jobset"),
            json.dumps(renamed).encode(),
            "unauthorized",
            "does not name the target",
        ),
    ]


async def test_h_malformed_inputs_each_get_a_precise_outcome_and_the_pipeline_goes_on(pipeline: Pipeline) -> None:
    p = pipeline
    started = time.monotonic()
    p.start_all()
    nc = await p.connect()
    try:
        bus = nc.jetstream()
        await services_ready(bus)
        w0 = p.writes()
        for rt in bad_runtimes():
            p.create(rt)
        for body, _, _ in BAD_TRAINJOBS.values():
            p.create(body)
        victim = p.create(trainjob("h-victim", num_nodes=1, suspend=True))

        corrupt = corrupt_messages(p.namespace)
        refused = refused_applies(p.namespace, victim["metadata"]["uid"])
        sent: dict[int, tuple[str, str, bytes, str]] = {}
        # Signed by the stage's own key: these are genuine messages with bad content (forged ones are
        # tests/security's).
        for label, subject, payload, reason in corrupt:
            ack = await bus.publish(subject, payload, headers=p.sign_headers(subject, payload))
            sent[ack.seq] = (label, subject, payload, reason)
        for label, subject, payload, reason, _ in refused:
            ack = await bus.publish(subject, payload, headers=p.sign_headers(subject, payload))
            sent[ack.seq] = (label, subject, payload, reason)

        # Every bad TrainJob: its precise condition, and no JobSet.
        def outcome(name: str) -> dict[str, Any] | None:
            kind, status, reason = BAD_TRAINJOBS[name][1]
            cond = condition_of(p.get(TRAINER, "TrainJob", name), kind)
            return cond if cond and cond["status"] == status and cond["reason"] == reason else None

        conditions: dict[str, dict[str, Any]] = {}
        for name, (_, (kind, status, reason), texts) in BAD_TRAINJOBS.items():
            cond = await until(lambda name=name: outcome(name), timeout=30, what=f"{kind}={status}/{reason} on {name}")
            for text in texts:
                assert text in cond["message"], (name, cond["message"])
            conditions[name] = cond
        jobsets = p.jobsets()
        assert not set(BAD_TRAINJOBS) & set(jobsets), sorted(set(BAD_TRAINJOBS) & set(jobsets))

        # Every corrupt or refused message: a dead letter with the original bytes.
        async def letters() -> list[Any]:
            return [
                decode_dead_letter(m.data)
                for m in await stream_messages(bus, streams.DLQ.name, f"{subjects.DLQ_PREFIX}.>")
            ]

        async def all_dead() -> bool:
            found = {(dl.subject, bytes(dl.payload)) for dl in await letters()}
            return all((subject, payload) in found for _, subject, payload, _ in sent.values())

        async def not_dead() -> list[str]:
            found = {(dl.subject, bytes(dl.payload)) for dl in await letters()}
            return [label for label, subject, payload, _ in sent.values() if (subject, payload) not in found]

        try:
            await until_async(all_dead, timeout=30, what=f"{len(sent)} dead letters")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; missing: {await not_dead()}") from None
        by_key = {(dl.subject, bytes(dl.payload)): dl for dl in await letters()}
        for label, subject, payload, reason in sent.values():
            dl = by_key[(subject, payload)]
            stage = "planner" if subject.startswith(subjects.EVENTS_PREFIX) else "applier"
            assert (dl.stage, dl.reason) == (stage, reason), (label, dl.stage, dl.reason, dl.error)
            assert dl.stream_seq > 0 and dl.error, (label, dl)
        for label, subject, payload, _, text in refused:
            assert text in by_key[(subject, payload)].error, (label, by_key[(subject, payload)].error)

        # A Warning Event on the TrainJob for the apply the API server refused (an unauthorized one gets none).
        def warnings() -> list[dict[str, Any]]:
            return [
                e
                for e in p.events()
                if e["type"] == "Warning"
                and e["reason"] == "ComponentApplyFailed"
                and e["involvedObject"]["name"] == "h-victim"
                and e["involvedObject"]["uid"] == victim["metadata"]["uid"]
            ]

        events = await until(lambda: warnings(), timeout=20, what="a Warning Event")
        messages = " | ".join(e["message"] for e in events)
        assert "PodGroup h-victim" in messages or f"PodGroup {p.namespace}/h-victim" in messages, messages
        assert "does not name the target" not in messages, messages
        failed = [r for r in await results_of(bus, p.namespace) if r.action == "failed"]
        assert len(failed) >= 2, failed

        # The pipeline goes on.
        p.create(trainjob("h-good", num_nodes=3))
        await until(lambda: converged(p, ["h-good"]), timeout=30, what="the good TrainJob's JobSet")
        for name, process in p.processes.items():
            assert process.is_running(), f"{name} died: {process.log_tail()}"
        w1 = await quiet(p, bus, timeout=60)
        # h-good (1), h-victim (suspended: create + one re-apply), and the two refused JobSet applies (counted by
        # the apiserver although it answered 400 and 404).
        assert (w1 - w0).writes("jobsets") <= 5, (w1 - w0).summary()
        report(
            "h",
            seconds=round(time.monotonic() - started, 1),
            bad_trainjobs=len(BAD_TRAINJOBS),
            corrupt_messages=len(corrupt),
            refused_applies=len(refused),
            dead_letters=len(by_key),
            warning_events=len(events),
            writes=(w1 - w0).summary(),
            missing_crd=MISSING_CRD,
        )
    finally:
        await nc.close()
