"""``planner.validation``: Trainer v2.3.0's admission rules as pure functions.

Each table states one rule of ``pkg/webhooks`` or the JobSet plugin's ``Validate`` (see
``/work/shared/reference/trainer-v2.3.0.md`` §1.5 and §4), or the #3809 fix, with the exact path and message
the planner reports. Runtimes and TrainJobs are small hand-written dicts; the info is built the way the
planner builds it, by ``new_runtime_info``.
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from contracts.jobset import JobSet
from contracts.trainer import ClusterTrainingRuntime, TrainingRuntime, TrainJob, runtime_from_builtins
from planner.framework import FieldError
from planner.runtime_info import new_runtime_info
from planner.validation import (
    runtime_patches_change_errors,
    validate_runtime,
    validate_trainjob,
)

from .builders import Obj, job_patch, replicated_job, runtime_dict, runtime_patch, trainjob_dict

RJOBS = "spec.template.spec.replicatedJobs"
POD = "template.spec.template.spec"
PATCH0 = "spec.runtimePatches[0]"
PATCH0_RJOB0 = f"{PATCH0}.trainingRuntimeSpec.template.spec.replicatedJobs[0]"

MIN_ONE = "must be greater than or equal to 1"
NOT_DOMAIN_PREFIXED = 'must be a domain-prefixed path (such as "acme.io/foo")'
NOT_SUBDOMAIN = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must "
    "start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is "
    r"'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)
INVALID_PATH = r"Invalid path (regex used for validation is '[A-Za-z0-9/\-._~%!$&'()*+,;=:]+')"
RESERVED_ENV = "must not have envs for the dataset-initializer, model-initializer, node containers"
UNKNOWN_RJOB = "must not have replicated job that doesn't exist in the runtime job template"
NOT_SUSPENDED = "RuntimePatches can only be modified when the TrainJob is suspended before or after the update"


# ------------------------------------------------------------------------------------------ fixtures
# Tables keep one case per visual block, hence `fmt: skip` on them.


def container(name: str, *mounts: str, **fields: Any) -> Obj:
    out: Obj = {"name": name, "image": "img", **fields}
    if mounts:
        out["volumeMounts"] = [{"name": m, "mountPath": f"/mnt/{m}"} for m in mounts]
    return out


rjob = replicated_job  # the short name keeps the tables below one case to a line


def runtime(jobs: list[Obj], *, ml_policy: Obj | None = None, labels: dict[str, str] | None = None) -> TrainingRuntime:
    metadata: Obj = {"namespace": "team-a"}
    if labels:
        metadata["labels"] = labels
    doc = runtime_dict(jobs, name="rt", kind="TrainingRuntime", metadata=metadata, ml_policy=ml_policy)
    return msgspec.convert(doc, TrainingRuntime)


def trainjob(generation: int = 1, **spec: Any) -> TrainJob:
    doc = trainjob_dict(
        name="mnist",
        namespace="team-a",
        runtime="rt",
        runtime_kind="TrainingRuntime",
        spec=spec,
        metadata={"generation": generation},
    )
    return msgspec.convert(doc, TrainJob)


def jobs_patch(manager: str, *rjob_patches: Obj) -> Obj:
    return runtime_patch(manager, replicated_jobs=list(rjob_patches))


def pod_patch(manager: str, job: str, **pod_spec: Any) -> Obj:
    return jobs_patch(manager, job_patch(job, pod_spec=pod_spec))


def no_job(step: str, config: str) -> FieldError:
    return FieldError("spec.runtimeRef", f"must have {step} job when trainJob is configured with input {config}")


def no_container(step: str) -> FieldError:
    return FieldError("spec.runtimeRef", f"must have container with name - {step} in the {step} job")


def no_mount(step: str) -> FieldError:
    return FieldError(
        "spec.runtimeRef", f"must have volumeMount with name - initializer in container {step} of the {step} job"
    )


def active(job: str) -> FieldError:
    return FieldError(
        "spec.runtimePatches",
        f"RuntimePatches cannot be modified when the JobSet's ReplicatedJob {job} is still active",
        kind="Forbidden",
    )


NODE_ONLY = [rjob("node", [container("node")], ancestor="trainer")]
TORCHTUNE_LIKE = [
    rjob("dataset-initializer", [container("dataset-initializer", "initializer")], ancestor="dataset-initializer"),
    rjob("model-initializer", [container("model-initializer", "initializer")], ancestor="model-initializer"),
    rjob("node", [container("node", "initializer"), container("sidecar")], ancestor="trainer",
         init_containers=[container("setup")]),
]  # fmt: skip


def check(job: TrainJob, rt: TrainingRuntime) -> list[FieldError]:
    """As the planner calls it: info after patches, patch targets against the runtime's own template."""
    return validate_trainjob(job, new_runtime_info(job, rt), runtime=rt)


# ------------------------------------------------------------------------------------------ runtimes

RUNTIME_CASES: dict[str, tuple[TrainingRuntime, list[FieldError]]] = {
    "valid ancestors with replicas 1": (
        runtime([*TORCHTUNE_LIKE[:2], rjob("node", [container("node")], ancestor="trainer", replicas=1)]),
        [],
    ),
    "replicas unset means the CRD default, 1": (runtime(TORCHTUNE_LIKE), []),
    "unknown user-specified ancestor is not checked": (
        runtime([rjob("node", [container("x")], ancestor="user-specified", replicas=2)]),
        [],
    ),
    "unlabelled replicated job is not checked": (
        runtime([rjob("launcher", [container("x")], replicas=3), *NODE_ONLY]),
        [],
    ),
    "replicas other than 1 on every ancestor": (
        runtime([
            rjob("dataset-initializer", [container("dataset-initializer")], ancestor="dataset-initializer", replicas=2),
            rjob("model-initializer", [container("model-initializer")], ancestor="model-initializer", replicas=0),
            rjob("launcher", [container("launcher")], replicas=2),
            rjob("node", [container("node")], ancestor="trainer", replicas=2),
        ]),
        [
            FieldError(f"{RJOBS}[0].replicas", "always must be 1"),
            FieldError(f"{RJOBS}[1].replicas", "always must be 1"),
            FieldError(f"{RJOBS}[3].replicas", "always must be 1"),
        ],
    ),
    "required container missing for every ancestor": (
        runtime([
            rjob("dataset-initializer", [container("test")], ancestor="dataset-initializer"),
            rjob("model-initializer", [container("test")], ancestor="model-initializer"),
            rjob("node", [container("test")], ancestor="trainer"),
        ]),
        [
            FieldError(f"{RJOBS}[0].{POD}.containers",
                       "must contain the required container for the ancestor: dataset-initializer"),
            FieldError(f"{RJOBS}[1].{POD}.containers",
                       "must contain the required container for the ancestor: model-initializer"),
            FieldError(f"{RJOBS}[2].{POD}.containers", "must contain the required container for the ancestor: trainer"),
        ],
    ),
    "the container is looked up by ancestor, not by job name": (
        runtime([rjob("workers", [container("node")], ancestor="trainer"), rjob("node", [container("x")])]),
        [],
    ),
    "an init container does not satisfy the required container": (
        runtime([rjob("node", [container("main")], ancestor="trainer", init_containers=[container("node")])]),
        [FieldError(f"{RJOBS}[0].{POD}.containers", "must contain the required container for the ancestor: trainer")],
    ),
    "both rules on one replicated job": (
        runtime([rjob("node", [], ancestor="trainer", replicas=4)]),
        [
            FieldError(f"{RJOBS}[0].replicas", "always must be 1"),
            FieldError(f"{RJOBS}[0].{POD}.containers", "must contain the required container for the ancestor: trainer"),
        ],
    ),
    "webhook-validation disabled label does not skip the checks": (
        runtime([rjob("node", [container("x")], ancestor="trainer", replicas=2)],
                labels={"trainer.kubeflow.org/webhook-validation": "disabled"}),
        [
            FieldError(f"{RJOBS}[0].replicas", "always must be 1"),
            FieldError(f"{RJOBS}[0].{POD}.containers", "must contain the required container for the ancestor: trainer"),
        ],
    ),
    "#3809 mlPolicy.numNodes 0": (runtime(TORCHTUNE_LIKE, ml_policy={"numNodes": 0, "torch": {}}),
                                  [FieldError("spec.mlPolicy.numNodes", MIN_ONE)]),
    "#3809 mlPolicy.numNodes negative": (runtime(TORCHTUNE_LIKE, ml_policy={"numNodes": -2}),
                                         [FieldError("spec.mlPolicy.numNodes", MIN_ONE)]),
    "#3809 mlPolicy.numNodes 1": (runtime(TORCHTUNE_LIKE, ml_policy={"numNodes": 1}), []),
    "#3809 mlPolicy.numNodes unset": (runtime(TORCHTUNE_LIKE, ml_policy={"torch": {}}), []),
    "errors in template order, numNodes last": (
        runtime([rjob("node", [container("x")], ancestor="trainer")], ml_policy={"numNodes": 0}),
        [
            FieldError(f"{RJOBS}[0].{POD}.containers", "must contain the required container for the ancestor: trainer"),
            FieldError("spec.mlPolicy.numNodes", MIN_ONE),
        ],
    ),
}  # fmt: skip


@pytest.mark.parametrize(("rt", "want"), list(RUNTIME_CASES.values()), ids=list(RUNTIME_CASES))
def test_validate_runtime(rt: TrainingRuntime, want: list[FieldError]) -> None:
    assert validate_runtime(rt) == want


def test_validate_runtime_without_spec() -> None:
    assert validate_runtime(TrainingRuntime()) == []
    assert validate_runtime(msgspec.convert({"spec": {"template": {}}}, TrainingRuntime)) == []


# --------------------------------------------------------------------------------- shipped runtimes


@pytest.fixture(scope="module")
def shipped() -> dict[str, Obj]:
    """Trainer's ClusterTrainingRuntimes as its runtimes overlay renders them, keyed by name."""
    from tjpipe.local.crds import shipped_runtimes
    from tjpipe.local.toolchain import ToolchainMissing

    try:
        docs = shipped_runtimes()
    except ToolchainMissing as exc:
        pytest.skip(f"Go toolchain not found, cannot read Trainer's shipped runtimes: {exc}")
    except RuntimeError as exc:
        if "go mod download" not in str(exc):
            raise
        pytest.skip(f"Trainer's Go module is not available: {exc}")
    return docs


def as_runtime(doc: Obj) -> TrainingRuntime:
    """Both runtime kinds share one shape; the planner's info builder takes the namespaced class."""
    return msgspec.convert(doc, TrainingRuntime)


def test_shipped_runtimes_pass_although_their_webhook_validation_is_disabled(shipped: dict[str, Obj]) -> None:
    assert len(shipped) >= 9, sorted(shipped)
    for name, doc in shipped.items():
        assert doc["metadata"]["labels"]["trainer.kubeflow.org/webhook-validation"] == "disabled", name
        rt = runtime_from_builtins(doc)
        assert isinstance(rt, ClusterTrainingRuntime), name
        assert validate_runtime(rt) == [], name


def test_shipped_runtimes_accept_a_plain_trainjob(shipped: dict[str, Obj]) -> None:
    job = trainjob(trainer={"numNodes": 2, "numProcPerNode": 1})
    for name, doc in shipped.items():
        rt = as_runtime(doc)
        assert validate_trainjob(job, new_runtime_info(job, rt), runtime=rt) == [], name


def test_shipped_torchtune_runtimes_accept_both_initializers(shipped: dict[str, Obj]) -> None:
    job = trainjob(initializer={"dataset": {"storageUri": "hf://d"}, "model": {"storageUri": "hf://m"}})
    torchtune = [name for name in shipped if name.startswith("torchtune-")]
    assert len(torchtune) == 3, sorted(shipped)
    for name in torchtune:
        rt = as_runtime(shipped[name])
        assert validate_trainjob(job, new_runtime_info(job, rt), runtime=rt) == [], name


def test_shipped_cache_runtime_rejects_a_dataset_initializer_as_upstream_does(shipped: dict[str, Obj]) -> None:
    # Its dataset-initializer container mounts no `initializer` volume, so Trainer v2.3.0's webhook rejects
    # a TrainJob that sets spec.initializer.dataset against it; we reproduce that, not second-guess it.
    rt = as_runtime(shipped["torch-distributed-with-cache"])
    job = trainjob(initializer={"dataset": {"storageUri": "cache://db/table"}})
    assert validate_trainjob(job, new_runtime_info(job, rt), runtime=rt) == [no_mount("dataset-initializer")]


# ------------------------------------------------------------------------------ initializer checks

DATASET = {"dataset": {"storageUri": "hf://d"}}
MODEL = {"model": {"storageUri": "hf://m"}}

INITIALIZER_CASES: dict[str, tuple[Obj | None, list[Obj], list[FieldError]]] = {
    "no initializer": (None, NODE_ONLY, []),
    "initializer without dataset or model": ({}, NODE_ONLY, []),
    "dataset: no dataset-initializer job": (
        DATASET, NODE_ONLY,
        [no_job("dataset-initializer", "datasetConfig")],
    ),
    "dataset: job without the container": (
        DATASET, [rjob("dataset-initializer", [container("other", "initializer")]), *NODE_ONLY],
        [no_container("dataset-initializer")],
    ),
    "dataset: container without the initializer mount": (
        DATASET, [rjob("dataset-initializer", [container("dataset-initializer", "cache")]), *NODE_ONLY],
        [no_mount("dataset-initializer")],
    ),
    "dataset: init container passes the name check, but only a regular container's mount counts": (
        DATASET,
        [rjob("dataset-initializer", [container("x")],
              init_containers=[container("dataset-initializer", "initializer")]),
         *NODE_ONLY],
        [no_mount("dataset-initializer")],
    ),
    "dataset: found by job name, not by ancestor label": (
        DATASET, [rjob("fetch", [container("dataset-initializer", "initializer")], ancestor="dataset-initializer"),
                  *NODE_ONLY],
        [no_job("dataset-initializer", "datasetConfig")],
    ),
    "dataset: valid": (DATASET, TORCHTUNE_LIKE, []),
    "model: no model-initializer job": (
        MODEL, NODE_ONLY,
        [no_job("model-initializer", "modelConfig")],
    ),
    "model: job without the container": (
        MODEL, [rjob("model-initializer", [container("other")]), *NODE_ONLY],
        [no_container("model-initializer")],
    ),
    "model: container without the initializer mount": (
        MODEL, [rjob("model-initializer", [container("model-initializer")]), *NODE_ONLY],
        [no_mount("model-initializer")],
    ),
    "model: valid": (MODEL, TORCHTUNE_LIKE, []),
    "both missing: dataset first": (
        {**DATASET, **MODEL}, NODE_ONLY,
        [no_job("dataset-initializer", "datasetConfig"), no_job("model-initializer", "modelConfig")],
    ),
}  # fmt: skip


@pytest.mark.parametrize(("initializer", "jobs", "want"), list(INITIALIZER_CASES.values()), ids=list(INITIALIZER_CASES))
def test_initializer_requirements(initializer: Obj | None, jobs: list[Obj], want: list[FieldError]) -> None:
    job = trainjob() if initializer is None else trainjob(initializer=initializer)
    assert check(job, runtime(jobs)) == want


def test_initializer_mount_added_by_a_runtime_patch_counts() -> None:
    # Upstream checks the initializer requirements on the template after runtime patches.
    rt = runtime([rjob("dataset-initializer", [container("dataset-initializer")]), *NODE_ONLY])
    mount = {"name": "initializer", "mountPath": "/workspace/dataset"}
    patch = pod_patch("acme.io/data", "dataset-initializer", containers=[{"name": "dataset-initializer",
                                                                           "volumeMounts": [mount]}])  # fmt: skip
    assert check(trainjob(initializer=DATASET, runtimePatches=[patch]), rt) == []
    assert check(trainjob(initializer=DATASET), rt) == [no_mount("dataset-initializer")]


# ------------------------------------------------------------------------------------- patch managers

MANAGER_CASES: dict[str, tuple[str | None, list[str]]] = {
    "valid": ("kueue.k8s.io/manager", []),
    "valid nested path and allowed punctuation": ("acme.io/a/b-c_d.e~f%20:g=h", []),
    "unset": (None, ["Required value"]),
    "empty": ("", ["Required value"]),
    "no slash": ("manager", [NOT_DOMAIN_PREFIXED]),
    "empty path": ("kueue.k8s.io/", [NOT_DOMAIN_PREFIXED]),
    "empty host": ("/manager", [NOT_DOMAIN_PREFIXED]),
    "upper-case host": ("Kueue.io/manager", [NOT_SUBDOMAIN]),
    "host ends with a dash": ("acme-/manager", [NOT_SUBDOMAIN]),
    "space in path": ("acme.io/my manager", [INVALID_PATH]),
    "trailing newline in path": ("acme.io/manager\n", [INVALID_PATH]),
    "bad host and bad path": ("-acme/a b", [NOT_SUBDOMAIN, INVALID_PATH]),
    "host longer than 253": ("a" * 254 + "/m", ["must be no more than 253 characters"]),
}


@pytest.mark.parametrize(("manager", "messages"), list(MANAGER_CASES.values()), ids=list(MANAGER_CASES))
def test_patch_manager_is_a_domain_prefixed_path(manager: str | None, messages: list[str]) -> None:
    patch = {} if manager is None else {"manager": manager}
    job = trainjob(runtimePatches=[{"manager": "acme.io/first"}, patch])
    assert check(job, runtime(NODE_ONLY)) == [FieldError("spec.runtimePatches[1].manager", m) for m in messages]


# ----------------------------------------------------------------------------------- patch targets

TARGET_CASES: dict[str, tuple[list[Obj], list[FieldError]]] = {
    "metadata-only patch": (
        [{"manager": "acme.io/m", "trainingRuntimeSpec": {"template": {"metadata": {"labels": {"a": "b"}}}}}], [],
    ),
    "replicated job without a template": ([jobs_patch("acme.io/m", {"name": "node"})], []),
    "unknown replicated job": (
        [jobs_patch("acme.io/m", {"name": "invalid"})],
        [FieldError(f"{PATCH0_RJOB0}.name", UNKNOWN_RJOB)],
    ),
    "unknown replicated job: its containers are not checked": (
        [pod_patch("acme.io/m", "invalid", containers=[{"name": "ghost", "env": [{"name": "A", "value": "1"}]}])],
        [FieldError(f"{PATCH0_RJOB0}.name", UNKNOWN_RJOB)],
    ),
    "known containers, init containers, and across the two lists": (
        [pod_patch("acme.io/m", "node",
                   containers=[{"name": "sidecar", "env": [{"name": "A", "value": "1"}]}, {"name": "setup"}],
                   initContainers=[{"name": "setup"}, {"name": "node"}],
                   nodeSelector={"pool": "gpu"})],
        [],
    ),
    "volume mounts on node are allowed": (
        [pod_patch("acme.io/m", "node",
                   containers=[{"name": "node", "volumeMounts": [{"name": "v", "mountPath": "/v"}]}])],
        [],
    ),
    "empty env on node is allowed": ([pod_patch("acme.io/m", "node", containers=[{"name": "node", "env": []}])], []),
    "unknown init container": (
        [pod_patch("acme.io/m", "node", initContainers=[{"name": "setup"}, {"name": "invalid"}])],
        [FieldError(f"{PATCH0_RJOB0}.{POD}.initContainers[1].name",
                    "must not have initContainer that doesn't exist in the runtime job node")],
    ),
    "unknown container": (
        [pod_patch("acme.io/m", "node", containers=[{"name": "invalid"}])],
        [FieldError(f"{PATCH0_RJOB0}.{POD}.containers[0].name",
                    "must not have container that doesn't exist in the runtime job node")],
    ),
    "container of another replicated job": (
        [pod_patch("acme.io/m", "model-initializer", containers=[{"name": "node"}])],
        [FieldError(f"{PATCH0_RJOB0}.{POD}.containers[0].name",
                    "must not have container that doesn't exist in the runtime job model-initializer")],
    ),
    "env on node": (
        [pod_patch("acme.io/m", "node", containers=[{"name": "node", "env": [{"name": "A", "value": "1"}]}])],
        [FieldError(f"{PATCH0_RJOB0}.{POD}.containers[0].env", RESERVED_ENV)],
    ),
    "env on dataset-initializer": (
        [pod_patch("acme.io/m", "dataset-initializer",
                   containers=[{"name": "dataset-initializer", "env": [{"name": "A", "value": "1"}]}])],
        [FieldError(f"{PATCH0_RJOB0}.{POD}.containers[0].env", RESERVED_ENV)],
    ),
    "env on model-initializer": (
        [pod_patch("acme.io/m", "model-initializer",
                   containers=[{"name": "model-initializer", "env": [{"name": "A", "value": "1"}]}])],
        [FieldError(f"{PATCH0_RJOB0}.{POD}.containers[0].env", RESERVED_ENV)],
    ),
    "env on an init container named node is not upstream's rule": (
        [pod_patch("acme.io/m", "node", initContainers=[{"name": "node", "env": [{"name": "A", "value": "1"}]}])],
        [],
    ),
    "errors name their patch, replicated job and container": (
        [
            {"manager": "bad"},
            jobs_patch(
                "acme.io/m",
                {"name": "node"},
                {"name": "node", "template": {"spec": {"template": {"spec": {"containers": [
                    {"name": "sidecar"}, {"name": "ghost"}, {"name": "node", "env": [{"name": "A", "value": "1"}]},
                ]}}}}},
                {"name": "missing"},
            ),
        ],
        [
            FieldError("spec.runtimePatches[0].manager", NOT_DOMAIN_PREFIXED),
            FieldError(f"spec.runtimePatches[1].trainingRuntimeSpec.template.spec.replicatedJobs[1].{POD}.containers[1].name",
                       "must not have container that doesn't exist in the runtime job node"),
            FieldError(f"spec.runtimePatches[1].trainingRuntimeSpec.template.spec.replicatedJobs[1].{POD}.containers[2].env",
                       RESERVED_ENV),
            FieldError("spec.runtimePatches[1].trainingRuntimeSpec.template.spec.replicatedJobs[2].name", UNKNOWN_RJOB),
        ],
    ),
}  # fmt: skip


@pytest.mark.parametrize(("patches", "want"), list(TARGET_CASES.values()), ids=list(TARGET_CASES))
def test_patch_targets(patches: list[Obj], want: list[FieldError]) -> None:
    assert check(trainjob(runtimePatches=patches), runtime(TORCHTUNE_LIKE)) == want


def test_patch_targets_without_the_runtime_check_the_patched_template_as_upstream_does() -> None:
    # The merge has already added every name a patch mentions, so upstream's webhook never rejects them.
    rt = runtime(TORCHTUNE_LIKE)
    job = trainjob(
        runtimePatches=[
            jobs_patch("acme.io/m", {"name": "x"}),
            pod_patch("acme.io/n", "node", containers=[{"name": "ghost"}], initContainers=[{"name": "ghost-init"}]),
        ]
    )
    assert validate_trainjob(job, new_runtime_info(job, rt)) == []
    # Against an unpatched template (what upstream's unit tests pass), the same rules fire.
    unpatched = new_runtime_info(trainjob(), rt)
    assert [e.path for e in validate_trainjob(job, unpatched)] == [
        f"{PATCH0_RJOB0}.name",
        f"spec.runtimePatches[1].trainingRuntimeSpec.template.spec.replicatedJobs[0].{POD}.initContainers[0].name",
        f"spec.runtimePatches[1].trainingRuntimeSpec.template.spec.replicatedJobs[0].{POD}.containers[0].name",
    ]
    assert check(job, rt) == validate_trainjob(job, unpatched)


# --------------------------------------------------------------------------------- #3809 trainer counts

TRAINER_CASES: dict[str, tuple[Obj | None, list[FieldError]]] = {
    "no trainer": (None, []),
    "counts unset": ({"image": "img"}, []),
    "counts 1": ({"numNodes": 1, "numProcPerNode": 1}, []),
    "numNodes 0": ({"numNodes": 0}, [FieldError("spec.trainer.numNodes", MIN_ONE)]),
    "numNodes negative": ({"numNodes": -1}, [FieldError("spec.trainer.numNodes", MIN_ONE)]),
    "numProcPerNode 0": ({"numProcPerNode": 0}, [FieldError("spec.trainer.numProcPerNode", MIN_ONE)]),
    "both negative": (
        {"numNodes": -3, "numProcPerNode": -1},
        [FieldError("spec.trainer.numNodes", MIN_ONE), FieldError("spec.trainer.numProcPerNode", MIN_ONE)],
    ),
}


@pytest.mark.parametrize(("trainer", "want"), list(TRAINER_CASES.values()), ids=list(TRAINER_CASES))
def test_trainer_counts_are_at_least_one(trainer: Obj | None, want: list[FieldError]) -> None:
    job = trainjob() if trainer is None else trainjob(trainer=trainer)
    assert check(job, runtime(NODE_ONLY, ml_policy={"numNodes": 1, "torch": {}})) == want


def test_trainjob_errors_in_upstream_order_then_the_3809_fix() -> None:
    job = trainjob(
        initializer={**DATASET, **MODEL},
        runtimePatches=[{"manager": "nope"}],
        trainer={"numNodes": 0},
    )
    assert check(job, runtime(NODE_ONLY)) == [
        no_job("dataset-initializer", "datasetConfig"),
        no_job("model-initializer", "modelConfig"),
        FieldError("spec.runtimePatches[0].manager", NOT_DOMAIN_PREFIXED),
        FieldError("spec.trainer.numNodes", MIN_ONE),
    ]


# ----------------------------------------------------------------------------- runtime patch updates

NODE_PATCH = pod_patch("acme.io/m", "node", nodeSelector={"pool": "a"})
OTHER_PATCH = pod_patch("acme.io/m", "node", nodeSelector={"pool": "b"})


def jobset(*active: tuple[str, int]) -> JobSet:
    status = [{"name": n, "active": a, "ready": 0, "succeeded": 0, "failed": 0, "suspended": 0} for n, a in active]
    return msgspec.convert({"metadata": {"name": "mnist"}, "status": {"replicatedJobsStatus": status}}, JobSet)


CHANGE_CASES: dict[str, tuple[Obj, Obj, JobSet | None, list[FieldError]]] = {
    "unchanged while running": (
        {"runtimePatches": [NODE_PATCH]}, {"runtimePatches": [NODE_PATCH]}, jobset(("node", 2)), [],
    ),
    "unset and empty are the same": ({}, {"runtimePatches": []}, None, []),
    "changed while running": (
        {"runtimePatches": [NODE_PATCH]}, {"runtimePatches": [OTHER_PATCH]}, None,
        [FieldError("spec.runtimePatches", NOT_SUSPENDED, kind="Forbidden")],
    ),
    "added while running, suspend explicitly false": (
        {"suspend": False}, {"suspend": False, "runtimePatches": [NODE_PATCH]}, None,
        [FieldError("spec.runtimePatches", NOT_SUSPENDED, kind="Forbidden")],
    ),
    "changed while running with active jobs: only the suspend rule": (
        {"runtimePatches": [NODE_PATCH]}, {"runtimePatches": [OTHER_PATCH]}, jobset(("node", 1)),
        [FieldError("spec.runtimePatches", NOT_SUSPENDED, kind="Forbidden")],
    ),
    "time alone changed": (
        {"runtimePatches": [{**NODE_PATCH, "time": "2026-01-01T00:00:00Z"}]},
        {"runtimePatches": [{**NODE_PATCH, "time": "2026-01-02T00:00:00Z"}]}, None,
        [FieldError("spec.runtimePatches", NOT_SUSPENDED, kind="Forbidden")],
    ),
    "changed together with suspending, no JobSet": (
        {"runtimePatches": [NODE_PATCH]}, {"suspend": True, "runtimePatches": [OTHER_PATCH]}, None, [],
    ),
    "changed together with resuming, JobSet idle": (
        {"suspend": True}, {"runtimePatches": [NODE_PATCH]}, jobset(("node", 0)), [],
    ),
    "changed while suspended, JobSet without status": (
        {"suspend": True}, {"suspend": True, "runtimePatches": [NODE_PATCH]},
        msgspec.convert({"metadata": {"name": "mnist"}}, JobSet), [],
    ),
    "changed while suspending, jobs still active": (
        {"runtimePatches": [NODE_PATCH]}, {"suspend": True, "runtimePatches": [OTHER_PATCH]},
        jobset(("dataset-initializer", 1), ("model-initializer", 0), ("node", 3)),
        [
            active("dataset-initializer"),
            active("node"),
        ],
    ),
}  # fmt: skip


@pytest.mark.parametrize(("old", "new", "js", "want"), list(CHANGE_CASES.values()), ids=list(CHANGE_CASES))
def test_runtime_patches_change(old: Obj, new: Obj, js: JobSet | None, want: list[FieldError]) -> None:
    assert runtime_patches_change_errors(trainjob(**old), trainjob(generation=2, **new), js) == want
