"""The progress record's wire form: what the history server reads back, and the versions it refuses."""

from __future__ import annotations

import msgspec
import pytest

from contracts import streams, subjects
from contracts.messages import ObjectKey, UnsupportedVersion
from contracts.progress import ProgressReported, decode_progress, encode_progress
from contracts.trainer import Metric, TrainerStatus


def _record() -> ProgressReported:
    return ProgressReported(
        trainjob=ObjectKey(namespace="team-a", name="mnist"),
        trainjob_uid="uid-1",
        pod="mnist-node-0-0-abcde",
        pod_uid="pod-uid",
        service_account="default",
        trainer_status=TrainerStatus(
            progress_percentage=40,
            estimated_remaining_seconds=120,
            metrics=[Metric(name="loss", value="0.25")],
            last_updated_time="2026-12-03T22:00:00Z",
        ),
        received_at=1_796_335_200.5,
        updated_at=1_796_335_200.0,
    )


def test_a_record_round_trips_with_trainers_field_names_inside() -> None:
    data = encode_progress(_record())
    assert decode_progress(data) == _record()
    body = msgspec.json.decode(data)
    assert body["type"] == "progress.reported"
    assert body["trainer_status"] == {
        "progressPercentage": 40,
        "estimatedRemainingSeconds": 120,
        "metrics": [{"name": "loss", "value": "0.25"}],
        "lastUpdatedTime": "2026-12-03T22:00:00Z",
    }


def test_a_newer_major_version_is_refused_and_an_added_field_ignored() -> None:
    body = msgspec.json.decode(encode_progress(_record()))
    with pytest.raises(UnsupportedVersion):
        decode_progress(msgspec.json.encode({**body, "wire_version": 2}))
    assert decode_progress(msgspec.json.encode({**body, "added_later": 1})) == _record()


def test_the_subject_names_the_trainjob_and_the_stream_keeps_it_as_a_record() -> None:
    subject = subjects.progress_subject("team-a", "mnist")
    assert subjects.trainjob_of_subject(subject) == ("team-a", "mnist")
    assert subject == subjects.trainjob_progress_filter("team-a", "mnist")
    assert subject.startswith(streams.PROGRESS.subjects[0].removesuffix(">"))
    assert streams.PROGRESS in streams.RECORD_STREAMS and streams.PROGRESS.discard == "old"
