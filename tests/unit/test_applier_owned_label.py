"""The label the watcher selects ConfigMaps and Secrets by: added by the planner, repaired by the applier.

The planner adds it in one place, to ConfigMaps and Secrets only; the applier adds it to an existing
``if-absent`` object that lacks it (made by Trainer, or before the label existed) and touches nothing else.
"""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
import yaml

from applier.claim_round import owned_label_patch
from contracts import labels
from contracts import messages as m
from contracts.kube import ConfigMap, ObjectMeta, Secret
from contracts.trainer import TrainingRuntime, TrainJob
from planner.core import _labelled, plan

CASES = Path(__file__).parents[1] / "golden" / "cases"


def _plan(case: str) -> m.Plan:
    """A plan for a golden case's TrainJob and runtime (Trainer's own inputs)."""
    docs = [d for d in yaml.safe_load_all((CASES / case / "input.yaml").read_text()) if d]
    job = next(d for d in docs if d["kind"] == "TrainJob")
    runtime = next(d for d in docs if d["kind"] in ("TrainingRuntime", "ClusterTrainingRuntime"))
    observed = m.TrainJobObserved(
        trainjob=msgspec.convert(job, TrainJob),
        runtime=msgspec.convert(runtime, TrainingRuntime),
        runtime_source="live",
        observed_at=1.0,
    )
    return plan(observed, source_seq=1)


@pytest.mark.parametrize("case", ["mlx-distributed/podgroup-on", "torch-distributed/base"])
def test_every_configmap_and_secret_carries_the_label_and_nothing_else_does(case: str) -> None:
    result = _plan(case)
    kinds = set()
    for message in result.applies:
        if not isinstance(message, m.ObjectApply) or isinstance(message, m.ApplyTrainJobStatus):
            continue
        obj = msgspec.to_builtins(message.object)
        kinds.add(obj["kind"])
        found = obj["metadata"].get("labels", {}).get(labels.MANAGED_BY_LABEL)
        assert found == (labels.MANAGED_BY if obj["kind"] in labels.LABELLED_KINDS else None), obj["kind"]
    assert kinds & labels.LABELLED_KINDS, "the case should build a ConfigMap or a Secret"


def test_the_label_keeps_other_labels() -> None:
    cm = ConfigMap(api_version="v1", kind="ConfigMap", metadata=ObjectMeta(name="x", labels={"team": "a"}))
    labelled = _labelled(cm)
    assert labelled.metadata.labels == {"team": "a", labels.MANAGED_BY_LABEL: labels.MANAGED_BY}
    assert cm.metadata.labels == {"team": "a"}  # a copy; the component itself is left alone
    bare = _labelled(Secret(api_version="v1", kind="Secret"))
    assert bare.metadata.labels == {labels.MANAGED_BY_LABEL: labels.MANAGED_BY}


def test_the_selector_is_the_label() -> None:
    assert labels.OWNED_SELECTOR == "app.kubernetes.io/managed-by=trainjob-pipeline"


# ------------------------------------------------------------------------------ the applier's repair


def _secret_message(policy: m.ApplyPolicy = "if-absent", kind: str = "Secret") -> m.ApplySecret:
    return m.ApplySecret(
        object=Secret(api_version="v1", kind="Secret", metadata=ObjectMeta(name="job-flux-curve", namespace="ns")),
        target=m.Target(api_version="v1", kind=kind, namespace="ns", name="job-flux-curve"),
        trainjob=m.ObjectKey(namespace="ns", name="job"),
        trainjob_uid="uid",
        source_seq=1,
        policy=policy,
        generate="flux-curve",
    )


def _live(labels_: dict[str, str] | None) -> bytes:
    meta: dict[str, object] = {"name": "job-flux-curve", "namespace": "ns", "resourceVersion": "7"}
    if labels_ is not None:
        meta["labels"] = labels_
    return msgspec.json.encode({"apiVersion": "v1", "kind": "Secret", "metadata": meta, "data": {"curve.cert": "eA=="}})


def test_an_unlabelled_existing_if_absent_object_gets_the_label_only() -> None:
    patch = owned_label_patch(_secret_message(), _live(None))
    assert patch is not None
    assert msgspec.json.decode(patch) == {"metadata": {"labels": {labels.MANAGED_BY_LABEL: labels.MANAGED_BY}}}
    # Other labels, or a wrong value of ours, still get it.
    assert owned_label_patch(_secret_message(), _live({"team": "a"})) == patch
    assert owned_label_patch(_secret_message(), _live({labels.MANAGED_BY_LABEL: "helm"})) == patch


@pytest.mark.parametrize(
    ("message", "live"),
    [
        (_secret_message(), _live({labels.MANAGED_BY_LABEL: labels.MANAGED_BY})),  # labelled already
        (_secret_message(), None),  # absent: created with the label
        (_secret_message(policy="always"), _live(None)),  # re-applied with the label anyway
        (_secret_message(kind="JobSet"), _live(None)),  # not a labelled kind
    ],
)
def test_no_label_patch_when_none_is_needed(message: m.ApplySecret, live: bytes | None) -> None:
    assert owned_label_patch(message, live) is None


def test_replay_finds_no_change_in_a_secret_recorded_before_plans_said_when_to_send_it_again() -> None:
    """``tjpipe replay`` compares what a plan decided: when the applier sends a create-only Secret again is not
    part of it, so the records of a planner older than ``recheck`` replay unchanged."""
    from tjpipe.history_tools import compare_plans

    recorded = _secret_message()
    replayed = msgspec.structs.replace(recorded, recheck="1/d827049039f82a8b")
    assert compare_plans([recorded], [replayed]) == {}
