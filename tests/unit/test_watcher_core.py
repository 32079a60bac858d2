"""``watcher.core``: runtimeRef resolution, JobSet ownership and the de-duplication message id."""

from __future__ import annotations

import msgspec
import pytest

from contracts.jobset import JobSet
from contracts.trainer import TrainingRuntime, TrainJob
from watcher import core

from .builders import Obj, owner_reference


def trainjob(runtime_ref: Obj | None, *, rv: str = "5", suspend: bool | None = None) -> TrainJob:
    spec: Obj = {}
    if runtime_ref is not None:
        spec["runtimeRef"] = runtime_ref
    if suspend is not None:
        spec["suspend"] = suspend
    return msgspec.convert(
        {"metadata": {"name": "tj", "namespace": "ns", "uid": "u-1", "resourceVersion": rv}, "spec": spec},
        TrainJob,
    )


@pytest.mark.parametrize(
    ("ref", "expected"),
    [
        ({"name": "torch"}, ("ClusterTrainingRuntime", "", "torch")),
        ({"name": "torch", "kind": "ClusterTrainingRuntime"}, ("ClusterTrainingRuntime", "", "torch")),
        ({"name": "torch", "apiGroup": "trainer.kubeflow.org"}, ("ClusterTrainingRuntime", "", "torch")),
        ({"name": "mine", "kind": "TrainingRuntime"}, ("TrainingRuntime", "ns", "mine")),
        (
            {"name": "mine", "kind": "TrainingRuntime", "apiGroup": "trainer.kubeflow.org"},
            ("TrainingRuntime", "ns", "mine"),
        ),
        ({"name": "x", "apiGroup": "example.com"}, None),
        ({"name": "x", "apiGroup": "example.com", "kind": "TrainingRuntime"}, None),
        ({"name": "x", "kind": "Deployment"}, None),
        ({"name": ""}, None),
        ({}, None),
    ],
)
def test_runtime_key_of(ref: Obj, expected: core.RuntimeKey | None) -> None:
    assert core.runtime_key_of(trainjob(ref)) == expected


def test_runtime_key_of_without_ref() -> None:
    assert core.runtime_key_of(trainjob(None)) is None
    assert core.runtime_key_of(msgspec.convert({"metadata": {"name": "tj", "namespace": "ns"}}, TrainJob)) is None


def runtime(kind: str, rv: str = "1") -> TrainingRuntime:
    metadata: Obj = {"name": "rt", "resourceVersion": rv}
    if kind == "TrainingRuntime":
        metadata["namespace"] = "ns"
    return msgspec.convert({"kind": kind, "metadata": metadata}, TrainingRuntime)


def test_runtime_key_of_runtime_matches_runtime_key_of() -> None:
    assert core.runtime_key_of_runtime(runtime("TrainingRuntime"), kind="TrainingRuntime") == (
        "TrainingRuntime",
        "ns",
        "rt",
    )
    assert core.runtime_key_of_runtime(runtime("ClusterTrainingRuntime"), kind="ClusterTrainingRuntime") == (
        "ClusterTrainingRuntime",
        "",
        "rt",
    )
    assert core.runtime_key_of_runtime(runtime("TrainingRuntime"), kind="TrainingRuntime") == core.runtime_key_of(
        trainjob({"name": "rt", "kind": "TrainingRuntime"})
    )


OWNER = owner_reference("tj", "u-1")


def jobset(owner_refs: list[Obj] | None, rv: str = "7") -> JobSet:
    metadata: Obj = {"name": "tj", "namespace": "ns", "resourceVersion": rv}
    if owner_refs is not None:
        metadata["ownerReferences"] = owner_refs
    return msgspec.convert({"metadata": metadata}, JobSet)


@pytest.mark.parametrize(
    ("refs", "expected"),
    [
        ([OWNER], "tj"),
        (None, None),
        ([], None),
        ([{**OWNER, "controller": False}], None),
        ([{k: v for k, v in OWNER.items() if k != "controller"}], None),
        ([{**OWNER, "kind": "Deployment"}], None),
        ([{**OWNER, "apiVersion": "trainer.kubeflow.org/v2"}], None),
        ([{**OWNER, "apiVersion": "example.com/v1alpha1"}], None),
        ([{**OWNER, "controller": False, "name": "not-me"}, {**OWNER, "name": "me"}], "me"),
        ([{"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "x", "controller": True}, OWNER], "tj"),
    ],
)
def test_controlling_trainjob(refs: list[Obj] | None, expected: str | None) -> None:
    assert core.controlling_trainjob(jobset(refs)) == expected


def test_message_id_stable_for_same_versions() -> None:
    job, rt, js = trainjob({"name": "rt"}), runtime("ClusterTrainingRuntime"), jobset([OWNER])
    a = core.message_id(job, runtime=rt, jobset=js, runtime_kind="ClusterTrainingRuntime")
    b = core.message_id(
        trainjob({"name": "rt"}),
        runtime=runtime("ClusterTrainingRuntime"),
        jobset=jobset([OWNER]),
        runtime_kind="ClusterTrainingRuntime",
    )
    assert a == b
    assert "u-1/5" in a


def test_a_hand_edit_of_an_uncarried_component_is_no_repeat() -> None:
    job, js = trainjob({"name": "rt"}), jobset([OWNER])
    before = core.message_id(job, runtime=None, jobset=js)
    edit = core.drift_mark("ConfigMap", "MODIFIED", "rt-mpi-hostfile", "41")
    deletion = core.drift_mark("ConfigMap", "DELETED", "rt-mpi-hostfile", "41")  # may carry the edit's version
    assert edit is not None and deletion is not None
    ids = {before, *(core.message_id(job, runtime=None, jobset=js, drift=[m]) for m in (edit, deletion))}
    assert len(ids) == 3
    # Two watcher replicas name the same change alike, in whatever order they gathered it.
    other = core.drift_mark("PodGroup", "MODIFIED", "rt", "44")
    assert other is not None
    assert core.message_id(job, runtime=None, jobset=js, drift=[edit, other]) == core.message_id(
        job, runtime=None, jobset=js, drift=[other, edit, edit]
    )
    # The plan's own objects appearing, and the JobSet (its version is in the id already), make no mark.
    assert core.drift_mark("ConfigMap", "ADDED", "rt-mpi-hostfile", "40") is None
    assert core.drift_mark("JobSet", "MODIFIED", "rt", "45") is None


def test_message_id_changes_with_each_version() -> None:
    base = core.message_id(
        trainjob({"name": "rt"}),
        runtime=runtime("ClusterTrainingRuntime"),
        jobset=jobset([OWNER]),
        runtime_kind="ClusterTrainingRuntime",
    )
    variants = {
        "trainjob": core.message_id(
            trainjob({"name": "rt"}, rv="6"),
            runtime=runtime("ClusterTrainingRuntime"),
            jobset=jobset([OWNER]),
            runtime_kind="ClusterTrainingRuntime",
        ),
        "jobset": core.message_id(
            trainjob({"name": "rt"}),
            runtime=runtime("ClusterTrainingRuntime"),
            jobset=jobset([OWNER], rv="8"),
            runtime_kind="ClusterTrainingRuntime",
        ),
        "runtime": core.message_id(
            trainjob({"name": "rt"}),
            runtime=runtime("ClusterTrainingRuntime", rv="2"),
            jobset=jobset([OWNER]),
            runtime_kind="ClusterTrainingRuntime",
        ),
        "no-jobset": core.message_id(
            trainjob({"name": "rt"}),
            runtime=runtime("ClusterTrainingRuntime"),
            jobset=None,
            runtime_kind="ClusterTrainingRuntime",
        ),
        "no-runtime": core.message_id(trainjob({"name": "rt"}), runtime=None, jobset=jobset([OWNER])),
        "runtime-kind": core.message_id(
            trainjob({"name": "rt"}),
            runtime=runtime("ClusterTrainingRuntime"),
            jobset=jobset([OWNER]),
            runtime_kind="TrainingRuntime",
        ),
    }
    assert base not in variants.values()
    assert len(set(variants.values())) == len(variants)


def test_message_id_ignores_content_that_does_not_change_versions() -> None:
    a = core.message_id(trainjob({"name": "rt"}, suspend=True), runtime=None, jobset=None)
    b = core.message_id(trainjob({"name": "other"}, suspend=False), runtime=None, jobset=None)
    assert a == b == "u-1/5"


def test_is_suspended() -> None:
    job = trainjob({"name": "rt"}, suspend=True)
    assert core.is_suspended(job) is True
    assert core.is_suspended(trainjob({"name": "rt"}, suspend=False)) is False
    assert core.is_suspended(trainjob({"name": "rt"})) is False


def test_half_built_holds_only_additions_with_one_half_present() -> None:
    added = ["ConfigMap ADDED"]
    assert core.half_built(added, has_snapshot=True, has_jobset=False)
    assert core.half_built(["JobSet ADDED"], has_snapshot=False, has_jobset=True)
    assert core.half_built(["ConfigMap ADDED", "_Named ADDED"], has_snapshot=True, has_jobset=False)
    # both halves there, or neither (nothing applied yet, or a runtime with no snapshot): nothing to wait for
    assert not core.half_built(added, has_snapshot=True, has_jobset=True)
    assert not core.half_built(added, has_snapshot=False, has_jobset=False)
    # drift goes out at once, even when it leaves the TrainJob half built
    assert not core.half_built(["JobSet DELETED"], has_snapshot=True, has_jobset=False)
    assert not core.half_built(["ConfigMap ADDED", "JobSet MODIFIED"], has_snapshot=True, has_jobset=False)


def test_trainjobs_by_runtime_follows_puts_and_discards() -> None:
    torch = ("ClusterTrainingRuntime", "", "torch")
    mine = ("TrainingRuntime", "ns", "mine")
    index = core.TrainJobsByRuntime()
    index.put(("ns", "a"), torch)
    index.put(("ns", "b"), torch)
    index.put(("other", "a"), mine)  # a namespace's runtime of the same name is another runtime
    index.put(("ns", "c"), None)  # refers to no runtime the watcher follows
    assert index.trainjobs(torch) == [("ns", "a"), ("ns", "b")]
    assert index.trainjobs(mine) == [("other", "a")]
    assert index.trainjobs(("TrainingRuntime", "other", "mine")) == []
    index.put(("ns", "a"), mine)  # its runtimeRef changed
    index.put(("ns", "b"), torch)  # a change that kept the runtimeRef
    assert index.trainjobs(torch) == [("ns", "b")]
    assert index.trainjobs(mine) == [("other", "a"), ("ns", "a")]
    index.discard(("ns", "b"))
    index.discard(("ns", "b"))
    index.put(("ns", "a"), None)
    assert index.trainjobs(torch) == [] and index.trainjobs(mine) == [("other", "a")]
    assert len(index) == 1
    listed = index.trainjobs(mine)
    index.discard(("other", "a"))
    assert listed == [("other", "a")]  # a copy: the caller may publish while the index changes
