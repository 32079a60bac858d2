"""The metrics every service serves: standard collectors, build info, and label names a scrape keeps."""

from __future__ import annotations

import platform
import re

from prometheus_client import generate_latest
from prometheus_client.metrics import MetricWrapperBase

from contracts import streams
from contracts.messages import Transition
from plumbing import observability
from plumbing.partitions import PartitionedConsumer, partition_consumer

TARGET_LABELS = {"service", "namespace", "pod", "container", "endpoint", "job", "instance"}
"""Labels a Prometheus Operator scrape puts on every series; one of ours with such a name becomes exported_*."""


def _exposition() -> str:
    return generate_latest(observability.REGISTRY).decode()


def test_the_registry_carries_the_process_and_python_collectors() -> None:
    text = _exposition()
    for name in (
        "process_resident_memory_bytes",
        "process_cpu_seconds_total",
        "process_open_fds",
        "process_start_time_seconds",
        "python_info",
        "python_gc_collections_total",
    ):
        assert re.search(rf"^{name}(\{{.*\}})? ", text, re.MULTILINE), name


def test_build_info_names_the_version_python_and_the_service() -> None:
    observability.HealthServer(port=0, service="planner")
    version = observability.package_version()
    line = (
        f'tjpipe_build_info{{python_version="{platform.python_version()}",'
        f'tjpipe_service="planner",version="{version}"}} 1.0'
    )
    assert line in _exposition().splitlines()
    assert version != "unknown"  # the project is installed (editable or not), so its metadata is found


UPSTREAM = "kubeflow_trainer_"
"""Kubeflow Trainer's proposed lifecycle metrics keep its ``namespace`` label; the ServiceMonitor honours it."""


def test_no_metric_of_ours_uses_a_label_the_scrape_adds() -> None:
    ours = [m for m in vars(observability).values() if isinstance(m, MetricWrapperBase)]
    assert observability.RETRIES in ours and len(ours) > 10
    for metric in ours:
        if metric._name.startswith(UPSTREAM):
            assert TARGET_LABELS & set(metric._labelnames) == {"namespace"}, metric
            continue
        assert not TARGET_LABELS & set(metric._labelnames), metric
    observability.RETRIES.labels(tjpipe_service="applier").inc()
    assert 'tjpipe_retries_total{tjpipe_service="applier"}' in _exposition()
    ours_only = "\n".join(line for line in _exposition().splitlines() if not line.startswith(UPSTREAM))
    assert not re.search(r'[{,](service|namespace|pod|job|instance)="', ours_only)


def test_upstream_lifecycle_metrics_have_trainers_proposed_names_and_labels() -> None:
    """kubeflow/trainer PR #3433's names and labels, so its queries and dashboards work here too."""
    wanted = {
        "kubeflow_trainer_trainjobs_created": ("namespace", "runtime"),
        "kubeflow_trainer_trainjobs_completed": ("namespace", "runtime"),
        "kubeflow_trainer_trainjobs_failed": ("namespace", "runtime", "reason"),
        "kubeflow_trainer_trainjobs_suspended": ("namespace", "runtime"),
        "kubeflow_trainer_trainjobs_deleted": ("namespace", "runtime"),
        "kubeflow_trainer_trainjob_duration_seconds": ("namespace", "runtime", "result"),
    }
    ours = {m._name: m._labelnames for m in vars(observability).values() if isinstance(m, MetricWrapperBase)}
    assert {name: ours.get(name) for name in wanted} == wanted
    assert "# TYPE kubeflow_trainer_trainjobs_active gauge" in _exposition()


def test_transitions_go_to_their_counters_and_the_duration_by_result() -> None:
    def value(name: str, **labels: str) -> float:
        return observability.REGISTRY.get_sample_value(name, labels) or 0.0

    where = {"namespace": "obs-unit", "runtime": "torch-distributed"}
    before = {
        "completed": value("kubeflow_trainer_trainjobs_completed_total", **where),
        "failed": value("kubeflow_trainer_trainjobs_failed_total", **where, reason="DeadlineExceeded"),
        "suspended": value("kubeflow_trainer_trainjobs_suspended_total", **where),
        "complete_count": value("kubeflow_trainer_trainjob_duration_seconds_count", **where, result="Complete"),
        "failed_sum": value("kubeflow_trainer_trainjob_duration_seconds_sum", **where, result="Failed"),
    }
    observability.count_transitions(
        [
            Transition(change="completed", duration_seconds=12.0),
            Transition(change="failed", reason="DeadlineExceeded", duration_seconds=30.0),
            Transition(change="suspended"),
        ],
        namespace="obs-unit",
        runtime="torch-distributed",
    )
    assert value("kubeflow_trainer_trainjobs_completed_total", **where) == before["completed"] + 1
    assert value("kubeflow_trainer_trainjobs_failed_total", **where, reason="DeadlineExceeded") == before["failed"] + 1
    assert value("kubeflow_trainer_trainjobs_suspended_total", **where) == before["suspended"] + 1
    count = value("kubeflow_trainer_trainjob_duration_seconds_count", **where, result="Complete")
    assert count == before["complete_count"] + 1
    failed_sum = value("kubeflow_trainer_trainjob_duration_seconds_sum", **where, result="Failed")
    assert failed_sum == before["failed_sum"] + 30


def test_active_reports_what_its_source_says_and_nothing_while_unknown() -> None:
    active = observability.ActiveTrainJobs()
    assert [s for f in active.collect() for s in f.samples] == []
    active.track(lambda: None)
    assert [s for f in active.collect() for s in f.samples] == []
    active.track(lambda: {("a", "torch-distributed"): 2, ("b", "jax-distributed"): 1})
    samples = [(s.labels, s.value) for f in active.collect() for s in f.samples]
    assert samples == [
        ({"namespace": "a", "runtime": "torch-distributed"}, 2),
        ({"namespace": "b", "runtime": "jax-distributed"}, 1),
    ]


async def test_a_released_partition_leaves_no_lag_behind() -> None:
    """The replica that takes a partition over reports its lag; the old value must not stay on the dashboard."""
    durable = partition_consumer(streams.PLANNER, 3).durable
    observability.CONSUMER_LAG.labels(consumer=durable).set(500)
    consumer = PartitionedConsumer(None, None, streams.PLANNER, _no_batch, batch=1)  # type: ignore[arg-type]
    await consumer.release(3)
    assert observability.REGISTRY.get_sample_value("tjpipe_consumer_lag", {"consumer": durable}) is None
    await consumer.release(3)  # a partition released twice, or never held: nothing to remove, no error


async def _no_batch(msgs: list[object]) -> None:
    raise AssertionError("no message is delivered here")
