"""The metrics every service serves: standard collectors, build info, and label names a scrape keeps."""

from __future__ import annotations

import platform
import re

from prometheus_client import generate_latest
from prometheus_client.metrics import MetricWrapperBase

from tjpipe.plumbing import observability

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


def test_no_metric_of_ours_uses_a_label_the_scrape_adds() -> None:
    ours = [m for m in vars(observability).values() if isinstance(m, MetricWrapperBase)]
    assert observability.RETRIES in ours and len(ours) > 10
    for metric in ours:
        assert not TARGET_LABELS & set(metric._labelnames), metric
    observability.RETRIES.labels(tjpipe_service="applier").inc()
    assert 'tjpipe_retries_total{tjpipe_service="applier"}' in _exposition()
    assert not re.search(r'[{,](service|namespace|pod|job|instance)="', _exposition())
