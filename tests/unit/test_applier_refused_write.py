"""What the applier does when the API server refuses its apply: a pure decision, one row per case."""

from __future__ import annotations

import msgspec
import pytest

from tjpipe.applier import core
from tjpipe.contracts import messages as m
from tjpipe.contracts.kube import Secret
from tjpipe.contracts.trainer import TrainJob

KEY = m.ObjectKey(namespace="ns", name="tj")


def _status() -> m.ApplyTrainJobStatus:
    return m.ApplyTrainJobStatus(
        trainjob=KEY,
        trainjob_uid="u",
        source_seq=1,
        target=m.Target(
            api_version="trainer.kubeflow.org/v1alpha1",
            kind="TrainJob",
            namespace="ns",
            name="tj",
            subresource="status",
        ),
        object=msgspec.convert({"metadata": {"name": "tj", "namespace": "ns"}}, TrainJob),
    )


def _secret(policy: m.ApplyPolicy) -> m.ApplySecret:
    return m.ApplySecret(
        trainjob=KEY,
        trainjob_uid="u",
        source_seq=1,
        target=m.Target(api_version="v1", kind="Secret", namespace="ns", name="tj-ssh"),
        policy=policy,
        object=msgspec.convert({"metadata": {"name": "tj-ssh", "namespace": "ns"}}, Secret),
    )


@pytest.mark.parametrize(
    ("status", "message", "precondition", "expected"),
    [
        # A status carries the TrainJob version it was planned from: any conflict means a newer TrainJob.
        (409, _status(), "", "stale-status"),
        (409, _status(), "7", "stale-status"),
        (422, _status(), "", "fail"),
        # The object changed between the read and the conditional write.
        (409, _secret("always"), "7", "look-again"),
        (409, _secret("if-absent"), "7", "look-again"),
        # Created by another writer between read and write: an if-absent target may just exist now.
        (409, _secret("if-absent"), "", "skip-if-created-concurrently"),
        (422, _secret("if-absent"), "", "skip-if-created-concurrently"),
        (422, _secret("if-absent"), "7", "skip-if-created-concurrently"),
        # Anything else goes to the retry tiers.
        (409, _secret("always"), "", "fail"),
        (422, _secret("always"), "7", "fail"),
        (422, _secret("while-suspended"), "", "fail"),
        (500, _secret("if-absent"), "", "fail"),
        (403, _status(), "", "fail"),
    ],
)
def test_refused_write(status: int, message: m.ObjectApply, precondition: str, expected: core.RefusedWrite) -> None:
    assert core.refused_write(status, message, precondition=precondition) == expected
