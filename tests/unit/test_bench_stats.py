"""``bench.stats`` and ``bench.workload``: the benchmark's pure helpers, on plain values.

No timing is asserted anywhere: these check the arithmetic and the wording of the report, not speed.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

# bench/ is a tool run from the repository root (``python -m bench``), not an installed package.
_ROOT = str(Path(__file__).resolve().parents[2])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from bench import stats, workload  # noqa: E402

# ---------------------------------------------------------------------------------------- percentiles


def test_percentile_interpolates_linearly_between_closest_ranks() -> None:
    values = [4.0, 1.0, 3.0, 2.0]
    assert stats.percentile(values, 0) == 1.0
    assert stats.percentile(values, 50) == 2.5
    assert stats.percentile(values, 100) == 4.0
    assert stats.percentile(values, 25) == pytest.approx(1.75)


def test_percentile_of_one_value_and_of_none() -> None:
    assert stats.percentile([0.2], 99) == 0.2
    assert stats.percentile([], 50) is None


def test_percentile_p99_of_a_hundred_values() -> None:
    values = [float(i) for i in range(1, 101)]
    assert stats.percentile(values, 99) == pytest.approx(99.01)
    assert stats.percentile(values, 95) == pytest.approx(95.05)


def test_percentile_rejects_out_of_range() -> None:
    with pytest.raises(ValueError):
        stats.percentile([1.0], 101)


def test_summarize() -> None:
    summary = stats.summarize([1.0, 2.0, 3.0])
    assert summary["count"] == 3
    assert summary["min"] == 1.0
    assert summary["max"] == 3.0
    assert summary["mean"] == 2.0
    assert summary["p50"] == 2.0
    assert stats.summarize([])["p99"] is None


def test_ratio_and_rate_refuse_missing_or_zero_denominators() -> None:
    assert stats.ratio(30.0, 120.0) == 0.25
    assert stats.ratio(None, 1.0) is None
    assert stats.ratio(1.0, 0.0) is None
    assert stats.rate(100, 4.0) == 25.0
    assert stats.rate(100, 0.0) is None
    assert stats.rate(100, None) is None


def test_build_outcome_gives_throughput_only_when_all_were_built() -> None:
    assert stats.build_outcome(4, 4, 4, {}, 2.0) == {
        "built": 4,
        "complete": True,
        "good": 4,
        "good_percent": 100.0,
        "problem": "",
        "seconds": 2.0,
        "trainjobs_per_s": 2.0,
    }
    short = stats.build_outcome(4, 3, 3, {}, 2.0)
    assert (short["complete"], short["problem"], short["trainjobs_per_s"]) == (False, "3/4 built", None)
    problems = {f"tj-{i}": f"wrong {i}" for i in range(5)}
    wrong = stats.build_outcome(5, 5, 0, problems, 1.0)
    assert (wrong["good_percent"], wrong["problem"]) == (0.0, "wrong 0; wrong 1; wrong 2")
    assert stats.build_outcome(0, 0, 0, {}, None)["good_percent"] == 0.0


# -------------------------------------------------------------------------------------------- targets


def test_target_bounds() -> None:
    at_most = stats.Target("<=", 0.050, "s")
    assert at_most.met(0.050) is True
    assert at_most.met(0.051) is False
    assert at_most.met(None) is None
    assert at_most.describe() == "≤ 50.0 ms"
    at_least = stats.Target(">=", 20_000.0, "plans/s")
    assert at_least.met(25_000.0) is True
    assert at_least.met(19_999.0) is False
    assert at_least.describe() == "≥ 20,000 plans/s"
    assert stats.Target("==", 0.0).met(0.0) is True


def test_check_rows_carry_value_target_and_verdict() -> None:
    row = stats.check("memory", "RSS: watcher", 160.0, "MB", stats.SERVICE_RSS)
    assert (row["display"], row["target"], row["met"], row["verdict"]) == ("160.0 MB", "≤ 150.0 MB", False, "not met")
    ok = stats.check("memory", "RSS: planner", 80.0, "MB", stats.SERVICE_RSS)
    assert ok["verdict"] == "met"
    reference = stats.check("ceiling", "applies/s", 512.5, "", None)
    assert (reference["target"], reference["met"], reference["verdict"]) == (None, None, "reference")
    missing = stats.check("planner", "x", None, "plans/s", stats.PLANNER_TORCH)
    assert (missing["met"], missing["verdict"], missing["display"]) == (None, "no figure", "n/a")


def test_format_value() -> None:
    assert stats.format_value(0.0123, "s") == "12.3 ms"
    assert stats.format_value(2.5, "s") == "2.50 s"
    assert stats.format_value(12345.0) == "12,345"
    assert stats.format_value(512.4) == "512"
    assert stats.format_value(42.25) == "42.2"
    assert stats.format_value(0.5, "x") == "0.500x"
    assert stats.format_value(100.0, "%") == "100.0%"
    assert stats.format_value(None, "s") == "n/a"


# ------------------------------------------------------------------------------------ Prometheus text


def _request_line(resource: str, subresource: str, verb: str, code: str, value: int) -> str:
    """One ``apiserver_request_total`` line with every label the API server writes."""
    labels = (
        f'code="{code}",component="apiserver",dry_run="",group="g",resource="{resource}",scope="resource",'
        f'subresource="{subresource}",verb="{verb}",version="v1"'
    )
    return f"apiserver_request_total{{{labels}}} {value}"


APISERVER_TEXT = "\n".join(
    [
        "# HELP apiserver_request_total [STABLE] Counter of apiserver requests",
        "# TYPE apiserver_request_total counter",
        _request_line("jobsets", "", "APPLY", "201", 10),
        _request_line("jobsets", "", "APPLY", "200", 5),
        _request_line("trainjobs", "status", "APPLY", "200", 3),
        _request_line("configmaps", "", "LIST", "200", 2),
        'apiserver_request_total_other{resource="jobsets",verb="APPLY"} 99',
        'apiserver_request_duration_seconds_bucket{resource="jobsets",verb="APPLY",le="0.1"} 7',
    ]
)


def test_samples_reads_exact_metric_names_only() -> None:
    rows = stats.samples(APISERVER_TEXT, "apiserver_request_total")
    assert len(rows) == 4
    labels, value = rows[0]
    assert labels["resource"] == "jobsets"
    assert labels["verb"] == "APPLY"
    assert value == 10.0


def test_samples_without_labels_and_with_escaped_quotes() -> None:
    text = 'plain_total 3\nquoted_total{reason="a \\"b\\""} 2\n'
    assert stats.samples(text, "plain_total") == [({}, 3.0)]
    assert stats.samples(text, "quoted_total") == [({"reason": 'a "b"'}, 2.0)]


def test_apiserver_requests_sums_over_codes() -> None:
    counts = stats.apiserver_requests(APISERVER_TEXT)
    assert counts[("jobsets", "", "APPLY")] == 15.0
    assert counts[("trainjobs", "status", "APPLY")] == 3.0
    assert counts[("configmaps", "", "LIST")] == 2.0


def test_sum_by_and_delta() -> None:
    rows = [({"outcome": "published", "cause": "TrainJob"}, 2.0), ({"outcome": "published", "cause": "JobSet"}, 3.0)]
    assert stats.sum_by(rows, "outcome") == {("published",): 5.0}
    assert stats.delta({"a": 5.0, "b": 1.0}, {"a": 2.0, "b": 1.0, "c": 4.0}) == {"a": 3.0, "c": -4.0}


# -------------------------------------------------------------------------------- request accounting


@pytest.mark.parametrize(
    ("method", "path", "params", "content_type", "expected"),
    [
        (
            "POST",
            "/apis/trainer.kubeflow.org/v1alpha1/namespaces/a/trainjobs",
            None,
            "application/json",
            ("trainjobs", "", "POST"),
        ),
        (
            "PATCH",
            "/apis/jobset.x-k8s.io/v1alpha2/namespaces/a/jobsets/j",
            None,
            stats.APPLY_PATCH,
            ("jobsets", "", "APPLY"),
        ),
        (
            "PATCH",
            "/apis/trainer.kubeflow.org/v1alpha1/namespaces/a/trainjobs/j/status",
            None,
            stats.APPLY_PATCH,
            ("trainjobs", "status", "APPLY"),
        ),
        (
            "PATCH",
            "/api/v1/namespaces/a/configmaps/c",
            None,
            "application/merge-patch+json",
            ("configmaps", "", "PATCH"),
        ),
        ("GET", "/api/v1/namespaces/a/secrets/s", None, None, ("secrets", "", "GET")),
        ("GET", "/api/v1/namespaces/a/configmaps", {"limit": "500"}, None, ("configmaps", "", "LIST")),
        ("GET", "/apis/jobset.x-k8s.io/v1alpha2/jobsets", {"watch": "true"}, None, ("jobsets", "", "WATCH")),
        ("DELETE", "/api/v1/namespaces/a/configmaps/c", None, None, ("configmaps", "", "DELETE")),
        ("DELETE", "/api/v1/namespaces/a/configmaps", None, None, ("configmaps", "", "DELETECOLLECTION")),
        ("POST", "/api/v1/namespaces", None, None, ("namespaces", "", "POST")),
        ("GET", "/api/v1/namespaces/a", None, None, ("namespaces", "", "GET")),
        ("GET", "/metrics", None, None, None),
        ("GET", "/apis/jobset.x-k8s.io/v1alpha2", None, None, None),
    ],
)
def test_classify_request(
    method: str, path: str, params: dict[str, str] | None, content_type: str | None, expected: Any
) -> None:
    assert stats.classify_request(method, path, params=params, content_type=content_type) == expected


def test_pipeline_requests_subtract_the_benchmarks_own_and_keep_tracked_resources() -> None:
    server = {
        ("trainjobs", "", "POST"): 100.0,
        ("jobsets", "", "APPLY"): 100.0,
        ("jobsets", "", "LIST"): 3.0,
        ("namespaces", "", "POST"): 1.0,
        ("events", "", "POST"): 2.0,
    }
    own = {("trainjobs", "", "POST"): 100.0, ("jobsets", "", "LIST"): 5.0, ("namespaces", "", "POST"): 1.0}
    pipeline = stats.pipeline_requests(server, own)
    assert pipeline == {("jobsets", "", "APPLY"): 100.0}
    assert stats.writes(pipeline) == 100.0
    assert stats.by_verb(pipeline) == {"APPLY": 100.0}


def test_by_resource_verb_writes_and_per_each() -> None:
    counts = {
        ("trainjobs", "status", "APPLY"): 2.0,
        ("jobsets", "", "APPLY"): 4.0,
        ("jobsets", "", "GET"): 6.0,
    }
    assert stats.by_resource_verb(counts) == {"jobsets APPLY": 4.0, "jobsets GET": 6.0, "trainjobs/status APPLY": 2.0}
    assert stats.writes(counts) == 6.0
    assert stats.per_each({"APPLY": 6.0}, 4) == {"APPLY": 1.5}
    assert stats.per_each({"APPLY": 6.0}, 0) == {}
    assert stats.ordered_verbs({"GET", "APPLY", "ZZZ"}) == ["APPLY", "GET", "ZZZ"]


# --------------------------------------------------------------------------------------------- /proc


def test_parse_status_kib_and_mb() -> None:
    text = "Name:\tpython\nVmHWM:\t  204800 kB\nVmRSS:\t  102400 kB\n"
    assert stats.parse_status_kib(text, "VmRSS") == 102400
    assert stats.parse_status_kib(text, "VmSwap") is None
    assert stats.kib_to_mb(102400) == pytest.approx(104.8576)
    assert stats.kib_to_mb(None) is None


def test_cpu_model() -> None:
    text = "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel\t\t: 85\nmodel name\t: Intel(R) Xeon(R) CPU @ 2.20GHz\n"
    assert stats.cpu_model(text) == "Intel(R) Xeon(R) CPU @ 2.20GHz"
    assert stats.cpu_model("") == "unknown"


# ----------------------------------------------------------------------------------- checks and report


def _report() -> dict[str, Any]:
    scenarios: dict[str, Any] = {
        "floor": {
            "runs": [
                {
                    "label": "torch N=100",
                    "mix": "torch",
                    "trainjobs": 100,
                    "applies": 200,
                    "concurrency": 32,
                    "trainjobs_per_s": 200.0,
                    "latency": {"p50": 0.010, "p95": 0.020, "p99": 0.040},
                    "seconds": 0.5,
                    "requests_per_trainjob_by_verb": {"POST": 1.0, "APPLY": 2.0},
                    "cpu_seconds": {"kube-apiserver": 0.5, "etcd": 0.1, "benchmark": 0.05},
                },
                {
                    "label": "mix N=100",
                    "mix": "mix",
                    "trainjobs": 100,
                    "trainjobs_per_s": 100.0,
                    "latency": {"p50": 0.020, "p95": 0.030, "p99": 0.050},
                },
            ]
        },
        "reference": {
            "n": 1000,
            "memory_jobs": 10000,
            "trainer": {
                "settings": "TrainJob concurrency 5, client qps 50, burst 100",
                "run": {
                    "n": 1000,
                    "created": 1000,
                    "trainjobs_per_s": 50.0,
                    "latency": {"p50": 5.0, "p99": 17.0},
                    "requests_per_trainjob_by_verb": {"APPLY": 2.0, "WATCH": 0.01},
                    "writes_per_trainjob": 2.0,
                    "cpu_seconds": {"trainer-controller": 3.6, "kube-apiserver": 11.0, "nats": 0.0},
                    "controller_cpu_ms_per_trainjob": 3.6,
                    "controller_rss_mb": {"rss_mb": 70.0, "hwm_mb": 72.0},
                },
                "restart": {"writes_per_trainjob": 0.0},
                "memory": {"present": 10000, "controller_rss_mb": {"rss_mb": 100.0, "hwm_mb": 110.0}},
            },
            "pipeline": {
                # Trainer's run's keys again, other figures: both sides come from bench.reference.controller_run.
                "run": {
                    "n": 1000,
                    "created": 1000,
                    "trainjobs_per_s": 110.0,
                    "latency": {"p50": 0.5, "p99": 2.0},
                    "requests_per_trainjob_by_verb": {"APPLY": 2.0, "GET": 3.5},
                    "writes_per_trainjob": 2.0,
                    "cpu_seconds": {"watcher": 1.5, "planner": 1.2, "applier": 2.6, "nats": 2.2, "kube-apiserver": 8.8},
                    "controller_cpu_ms_per_trainjob": 7.5,
                    "controller_rss_mb": {"rss_mb": 120.0, "hwm_mb": 150.0},
                }
            },
        },
        "e2e": {
            "runs": [
                {
                    "label": "torch N=100",
                    "n": 100,
                    "good": 100,
                    "good_percent": 100.0,
                    "complete": True,
                    "verified": True,
                    "problem": "",
                    "trainjobs_per_s": 50.0,
                    "create_per_s": 300.0,
                    "latency": {"p50": 0.020, "p95": 0.060, "p99": 0.080},
                }
            ],
            "paced": {
                "label": "paced 20/s",
                "n": 100,
                "rate": 20.0,
                "good": 100,
                "good_percent": 100.0,
                "complete": True,
                "verified": True,
                "problem": "",
                "create_per_s": 20.0,
                "create_seconds": 5.0,
                "trainjobs_per_s": 19.5,
                "latency": {"p50": 0.015, "p95": 0.030, "p99": 0.045, "max": 0.05},
            },
        },
        "write_amplification": {
            "resources": list(stats.TRACKED_RESOURCES),
            "situations": [
                {
                    "name": "creation: torch N=100",
                    "trainjobs": 100,
                    "per_trainjob_by_verb": {"APPLY": 2.0},
                    "writes": 200.0,
                    "writes_per_trainjob": 2.0,
                },
                {
                    "name": "resync (watcher restart)",
                    "trainjobs": 100,
                    "per_trainjob_by_verb": {"LIST": 0.01},
                    "writes": 0.0,
                    "writes_per_trainjob": 0.0,
                    "events": {"duplicate": 100.0},
                },
                {
                    "name": "restart of every service",
                    "trainjobs": 100,
                    "per_trainjob_by_verb": {"APPLY": 0.02},
                    "writes": 2.0,
                    "writes_per_trainjob": 0.02,
                },
            ],
        },
        "planner": {
            "event": "new TrainJob",
            "seconds_per_runtime": 0.5,
            "runtimes": [
                {
                    "runtime": "torch-distributed",
                    "plans_per_cpu_s": 25_000.0,
                    "wall_plans_per_s": 24_000.0,
                    "us_per_plan": 40.0,
                    "messages_per_plan": 2,
                    "warnings": 0,
                },
                {
                    "runtime": "deepspeed-distributed",
                    "plans_per_cpu_s": 900.0,
                    "wall_plans_per_s": 800.0,
                    "us_per_plan": 1111.0,
                    "messages_per_plan": 4,
                    "warnings": 0,
                },
            ],
        },
        "memory": {
            "present": 1000,
            "created": 700,
            "services": [
                {"service": "watcher", "pid": 10, "rss_mb": 120.0, "hwm_mb": 130.0},
                {"service": "planner", "pid": 11, "rss_mb": 151.0, "hwm_mb": 160.0},
                {"service": "applier", "pid": 12, "rss_mb": 20.0, "hwm_mb": 30.0},
                {"service": "nats", "pid": 13, "rss_mb": 9.0, "hwm_mb": 9.0},
            ],
        },
    }
    stats.add_ratios(scenarios)
    return {
        "meta": {"command": "python -m bench --quick", "started": "today", "duration_s": 100.0, "backend": "local"},
        "machine": {"cores": 2, "cpu_model": "Test CPU", "memory_gib": 23.5, "python": "3.11.0"},
        "scenarios": scenarios,
        "checks": stats.build_checks(scenarios),
        "notes": ["a note"],
    }


def test_add_ratios_divides_by_the_floor_of_the_same_mix() -> None:
    run = _report()["scenarios"]["e2e"]["runs"][0]
    assert run["ratios"]["floor"] == "torch N=100"
    assert run["ratios"]["throughput"] == pytest.approx(0.25)
    assert run["ratios"]["p50"] == pytest.approx(2.0)
    assert run["ratios"]["p99"] == pytest.approx(2.0)
    scenarios: dict[str, Any] = {
        "floor": {"runs": [{"label": "mix N=9", "mix": "mix", "trainjobs_per_s": 40.0, "latency": {}}]},
        "e2e": {"runs": [{"kinds": {"torch": 3, "mpi": 3}, "trainjobs_per_s": 10.0, "latency": {}}]},
    }
    stats.add_ratios(scenarios)
    assert scenarios["e2e"]["runs"][0]["ratios"]["throughput"] == pytest.approx(0.25)


def test_add_ratios_without_a_floor_gives_none() -> None:
    scenarios: dict[str, Any] = {"e2e": {"runs": [{"trainjobs_per_s": 5.0, "latency": {"p50": 0.1}}]}}
    stats.add_ratios(scenarios)
    assert scenarios["e2e"]["runs"][0]["ratios"] == {
        "floor": None,
        "throughput": None,
        "p50": None,
        "p95": None,
        "p99": None,
    }


def test_build_checks_judges_each_targeted_figure() -> None:
    checks = {(c["section"], c["figure"]): c for c in _report()["checks"]}
    assert checks[("end to end", "paced p99 latency")]["verdict"] == "met"
    assert checks[("end to end", "torch N=100: built with the right spec")]["verdict"] == "met"
    assert checks[("end to end", "torch N=100: p99 latency")]["verdict"] == "reference"
    assert checks[("write amplification", "writes per TrainJob: creation: torch N=100")]["verdict"] == "reference"
    assert checks[("write amplification", "writes per TrainJob: resync (watcher restart)")]["verdict"] == "met"
    assert checks[("write amplification", "writes per TrainJob: restart of every service")]["verdict"] == "not met"
    assert checks[("planner", "plans/s/core: torch-distributed")]["verdict"] == "met"
    assert checks[("planner", "plans/s/core: deepspeed-distributed")]["verdict"] == "reference"
    assert checks[("memory", "RSS: watcher")]["verdict"] == "met"
    assert checks[("memory", "RSS: planner")]["verdict"] == "not met"
    assert checks[("memory", "RSS: nats")]["verdict"] == "reference"
    assert checks[("floor", "torch N=100: TrainJobs/s")]["verdict"] == "reference"


def test_versus_trainer_rows_state_both_sides_and_judge_the_ratio() -> None:
    scenarios = _report()["scenarios"]
    rows = {r["figure"]: r for r in stats.reference_rows(scenarios)}
    throughput = rows["throughput, torch N=1,000"]
    assert (throughput["trainer"], throughput["pipeline"]) == (50.0, 110.0)
    assert throughput["ratio"] == pytest.approx(2.2)
    assert throughput["judge"] == "ratio"
    cpu = rows["CPU per TrainJob, controller side"]
    assert cpu["ratio"] == pytest.approx(7.5 / 3.6)
    assert rows["CPU per TrainJob: trainer-controller"]["trainer"] == pytest.approx(3.6)
    assert rows["CPU per TrainJob: trainer-controller"]["pipeline"] is None
    assert rows["CPU per TrainJob: watcher"]["pipeline"] == pytest.approx(1.5)
    assert rows["API requests per TrainJob: GET"]["trainer"] == 0.0
    assert rows["API requests per TrainJob: GET"]["target"] is None
    assert rows["RSS, controller side, 1,000 TrainJobs"]["ratio"] == pytest.approx(120.0 / 70.0)
    # At 10,000: the memory section's watcher + planner + applier + nats against Trainer's fill.
    assert rows["RSS, controller side, 10,000 TrainJobs"]["pipeline"] == pytest.approx(120.0 + 151.0 + 20.0 + 9.0)
    assert rows["RSS, controller side, 10,000 TrainJobs"]["ratio"] == pytest.approx(3.0)
    restart = rows["writes per TrainJob on restart"]
    assert (restart["trainer"], restart["pipeline"], restart["judge"]) == (0.0, 0.02, "pipeline")
    assert rows["writes per TrainJob on resync"]["trainer"] is None


def test_versus_trainer_checks_carry_the_issue_targets() -> None:
    checks = {(c["section"], c["figure"]): c for c in _report()["checks"]}
    versus = {figure: c for (section, figure), c in checks.items() if section == "versus Trainer"}
    assert set(versus) == {
        "throughput, torch N=1,000",
        "CPU per TrainJob, controller side",
        "RSS, controller side, 1,000 TrainJobs",
        "RSS, controller side, 10,000 TrainJobs",
    }
    assert versus["throughput, torch N=1,000"]["target"] == "≥ 2.000x"
    assert versus["throughput, torch N=1,000"]["verdict"] == "met"
    assert versus["CPU per TrainJob, controller side"]["target"] == "≤ 1.000x"
    assert versus["CPU per TrainJob, controller side"]["verdict"] == "not met"
    assert versus["RSS, controller side, 1,000 TrainJobs"]["verdict"] == "met"
    assert versus["RSS, controller side, 10,000 TrainJobs"]["verdict"] == "not met"
    assert versus["RSS, controller side, 10,000 TrainJobs"]["target"] == "≤ 1.000x"


def test_the_one_process_controller_is_judged_against_trainer_as_the_three_services_are() -> None:
    report = _report()
    report["scenarios"]["reference"]["one_process"] = {
        "run": {
            "n": 1000,
            "created": 1000,
            "trainjobs_per_s": 105.0,
            "latency": {"p50": 0.6, "p99": 2.5},
            "writes_per_trainjob": 2.0,
            "cpu_seconds": {"controller": 4.0, "nats": 2.0, "kube-apiserver": 8.5},
            "controller_cpu_ms_per_trainjob": 6.0,
            "controller_rss_mb": {"rss_mb": 130.0, "hwm_mb": 140.0},
        }
    }
    tag = "one process (tjpipe controller)"
    rows = {r["figure"]: r for r in stats.reference_rows(report["scenarios"])}
    assert rows[f"throughput, {tag}"]["ratio"] == pytest.approx(105.0 / 50.0)
    assert rows[f"CPU per TrainJob, controller side, {tag}"]["ratio"] == pytest.approx(6.0 / 3.6)
    assert rows[f"CPU per TrainJob: controller, {tag}"]["pipeline"] == pytest.approx(4.0)
    assert rows[f"RSS, controller side, 1,000 TrainJobs, {tag}"]["ratio"] == pytest.approx(130.0 / 70.0)
    # The three services' rows are untouched by it.
    assert rows["RSS, controller side, 1,000 TrainJobs"]["pipeline"] == 120.0
    checks = {c["figure"]: c for c in stats.build_checks(report["scenarios"]) if c["section"] == "versus Trainer"}
    assert checks[f"throughput, {tag}"]["verdict"] == "met"
    assert checks[f"CPU per TrainJob, controller side, {tag}"]["verdict"] == "not met"
    assert checks[f"RSS, controller side, 1,000 TrainJobs, {tag}"]["verdict"] == "met"
    assert f"RSS, controller side, 1,000 TrainJobs, {tag}" in stats.render_markdown(report)


def test_versus_trainer_without_trainer_figures_has_no_verdicts() -> None:
    scenarios: dict[str, Any] = {"reference": {"n": 10, "pipeline": {"run": {"trainjobs_per_s": 5.0}}}}
    checks = stats.build_checks(scenarios)
    throughput = next(c for c in checks if c["figure"] == "throughput, torch N=10")
    assert (throughput["value"], throughput["verdict"]) == (None, "no figure")


def test_render_markdown_puts_each_figure_next_to_its_target() -> None:
    text = stats.render_markdown(_report())
    assert text.startswith("# trainjob-pipeline benchmark\n")
    for heading in (
        "## Machine",
        "## Targets",
        "## Versus Trainer v2.3.0's controller",
        "## 1. Apiserver floor",
        "## 2. End to end",
        "## 3. Write amplification",
        "## 4. Planner microbenchmark",
        "## 5. Memory",
        "## Notes",
    ):
        assert heading in text
    assert "| paced p99 latency | 45.0 ms | ≤ 50.0 ms | met |" in text
    assert "| planner | 151.0 MB | 160.0 MB | ≤ 150.0 MB | not met |" in text.replace("| 11 ", "")
    assert "Test CPU" in text
    assert "0.250" in text  # the throughput ratio
    assert "TJ/s ÷ floor | 0.250x | ≥ 0.800x | not met |" in text  # the issue's 80% target, in the table
    assert "| throughput, torch N=1,000 | 50 TJ/s | 110 TJ/s | 2.200 | ratio ≥ 2.000x | met |" in text
    assert "shipped settings (TrainJob concurrency 5, client qps 50, burst 100), leader election off" in text
    assert "| CPU per TrainJob: trainer-controller | 3.60 ms | — | n/a | — | — |" in text
    assert "| writes per TrainJob on resync | — | 0.00 writes/TJ | n/a | ≤ 0.00 writes/TJ | met |" in text
    assert "| torch N=100 | 200 | 10.0 ms / 40.0 ms | APPLY 2.00, POST 1.00 | 0 |" in text  # the floor
    # The interim bounds sit in the same table, below the long-term ones.
    assert "| interim | throughput, torch N=1,000 | 2.200x | ≥ 1.500x | met |" in text
    assert "| interim | CPU per TrainJob, controller side | 2.083x | ≤ 2.000x | not met |" in text
    assert "10 of 16 targets met." in text


def test_render_markdown_of_an_empty_report() -> None:
    text = stats.render_markdown({"meta": {}, "machine": {}, "scenarios": {}, "checks": []})
    assert "No targeted figure was measured." in text


def test_table_escapes_pipes() -> None:
    assert stats.table(["a"], [("x|y",)]) == "| a |\n|---|\n| x\\|y |"


# ------------------------------------------------------------------------------------------- workload


def test_kinds_for_round_robin() -> None:
    kinds = workload.kinds_for(7, workload.MIX)
    assert kinds == ["torch", "mpi", "gang", "torch", "mpi", "gang", "torch"]
    assert workload.kinds_for(3, workload.TORCH_ONLY) == ["torch"] * 3


def test_required_components_per_kind() -> None:
    assert workload.required_components("torch", "a") == {"configmap.a-runtime-snapshot", "jobset"}
    assert workload.required_components("mpi", "a") == {
        "configmap.a-runtime-snapshot",
        "jobset",
        "secret.a-mpi-ssh-auth",
        "configmap.a-mpi-hostfile",
    }
    assert workload.required_components("gang", "a") == {"configmap.a-runtime-snapshot", "jobset", "podgroup"}


def test_jobset_nodes_counts_node_and_launcher_pods() -> None:
    assert workload.jobset_nodes([("node", 1, 3)]) == 3
    # MPI with runLauncherAsNode: numNodes - 1 node pods and one launcher.
    assert workload.jobset_nodes([("node", None, 2), ("launcher", 1, 1)]) == 3
    assert workload.jobset_nodes([("dataset-initializer", 1, 1), ("node", 1, 4)]) == 4


def test_gang_runtime_is_torch_under_another_name_with_coscheduling() -> None:
    torch = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "ClusterTrainingRuntime",
        "metadata": {"name": "torch-distributed", "labels": {"a": "b"}, "resourceVersion": "7"},
        "spec": {"mlPolicy": {"numNodes": 1, "torch": {}}, "template": {"spec": {}}},
    }
    gang = workload.gang_runtime(torch)
    assert gang["metadata"] == {"name": workload.GANG_RUNTIME, "labels": {"a": "b"}}
    assert gang["spec"]["podGroupPolicy"] == {"coscheduling": {"scheduleTimeoutSeconds": 60}}
    assert "podGroupPolicy" not in torch["spec"]


def test_trainjob_body() -> None:
    body = workload.trainjob_body("ns", "tj-1", "mpi", 3)
    assert body["metadata"] == {"name": "tj-1", "namespace": "ns", "labels": {"tjpipe-bench/kind": "mpi"}}
    assert body["spec"]["runtimeRef"] == {"name": workload.MPI_RUNTIME}
    assert body["spec"]["trainer"]["numNodes"] == 3


# ------------------------------------------------------------------------------------------ lifecycle


def test_finished_condition_is_complete_or_failed_when_true() -> None:
    from bench.lifecycle import finished_condition

    assert finished_condition([("Created", "True"), ("Complete", "True")]) == "Complete"
    assert finished_condition([("Failed", "True")]) == "Failed"
    assert finished_condition([("Complete", "False"), ("Suspended", "True")]) is None
    assert finished_condition([]) is None


def test_a_jobset_is_finished_by_its_own_condition_types() -> None:
    from bench.lifecycle import JOBSET_DONE_CONDITIONS, finished_condition

    assert finished_condition([("StartupPolicyCompleted", "True")], JOBSET_DONE_CONDITIONS) is None
    assert finished_condition([("Completed", "True")], JOBSET_DONE_CONDITIONS) == "Completed"
    assert finished_condition([("Complete", "True")], JOBSET_DONE_CONDITIONS) is None


def test_the_finish_splits_at_the_jobset_on_one_clock() -> None:
    from bench.lifecycle import finish_breakdown

    created = {"a": 100.0, "b": 101.0, "c": 102.0}
    jobsets = {"a": ("Completed", 110.0), "b": ("Completed", 121.0), "gone": ("Completed", 50.0)}
    trainjobs = {"a": ("Complete", 110.5), "b": ("Complete", 123.0), "c": ("Complete", 130.0)}
    split = finish_breakdown(created, jobsets, trainjobs)
    # Only TrainJobs the benchmark created count, and a reaction needs both sightings ("c" has no JobSet's).
    assert split["time_to_jobset_finish"]["count"] == 2
    assert (split["time_to_jobset_finish"]["min"], split["time_to_jobset_finish"]["max"]) == (10.0, 20.0)
    assert split["finish_reaction"]["count"] == 2
    assert (split["finish_reaction"]["min"], split["finish_reaction"]["max"]) == (0.5, 2.0)


def _lifecycle_side(label: str, **figures: Any) -> dict[str, Any]:
    side: dict[str, Any] = {
        "label": label,
        "created": 500,
        "outcomes": {"Complete": 500},
        "complete_percent": 100.0,
        "seconds_to_all_complete": 80.0,
        "time_to_finish": {"p50": 30.0, "p99": 60.0},
        "time_to_jobset_finish": {"p50": 28.0, "p99": 55.0},
        "finish_reaction": {"p50": 2.0, "p99": 5.0},
        "status_writes_per_trainjob": 2.0,
        "tracked_requests_per_trainjob_by_verb": {"APPLY": 4.0},
        "tracked_writes_per_trainjob": 4.0,
        "requests_per_trainjob_by_verb": {"GET": 7.5, "APPLY": 4.0},
        "cpu_seconds": {"kube-apiserver": 10.0},
        "controller_cpu_ms_per_trainjob": 5.0,
        "controller_rss_mb": {"rss_mb": 70.0, "hwm_mb": 80.0},
    }
    side.update(figures)
    return side


def _lifecycle() -> dict[str, Any]:
    return {
        "n": 500,
        "nodes": 20,
        "pod_run_seconds": 5.0,
        "sides": ["trainer", "pipeline"],
        "trainer": _lifecycle_side(
            "Trainer v2.3.0",
            status_writes_per_trainjob=3.0,
            requests_per_trainjob_by_verb={"PUT": 3.0, "GET": 7.5},
            cpu_seconds={"trainer-controller": 2.5, "kube-apiserver": 10.0},
        ),
        "pipeline": _lifecycle_side(
            "pipeline",
            outcomes={"Complete": 499, "Failed": 1},
            complete_percent=99.8,
            seconds_to_all_complete=None,
            time_to_finish={"p50": 15.0, "p99": 90.0},
            finish_reaction={"p50": 3.0, "p99": 4.0},
            cpu_seconds={"applier": 5.0, "kube-apiserver": 12.5},
            controller_cpu_ms_per_trainjob=10.0,
            controller_rss_mb={"rss_mb": 210.0, "hwm_mb": 240.0},
            applies={"JobSet/created": 500.0},
        ),
    }


def test_lifecycle_rows_put_both_sides_and_their_ratio_in_each_row() -> None:
    rows = {r["figure"]: r for r in stats.lifecycle_rows(_lifecycle())}
    p50 = rows["create to Complete p50"]
    assert (p50["trainer"], p50["pipeline"], p50["ratio"]) == (30.0, 15.0, 0.5)
    assert rows["create to Complete p99"]["ratio"] == pytest.approx(1.5)
    assert rows["create to JobSet finished p50"]["ratio"] == 1.0
    reaction = rows["JobSet finished to TrainJob finished p50"]
    assert (reaction["trainer"], reaction["pipeline"], reaction["ratio"]) == (2.0, 3.0, 1.5)
    writes = rows["status writes per TrainJob"]
    assert (writes["ratio"], writes["judge"], writes["target"]) == (
        pytest.approx(2.0 / 3.0),
        "ratio",
        stats.VS_LIFECYCLE,
    )
    # One side's verb the other has not is a zero there, not a missing figure.
    assert rows["API requests per TrainJob, every resource: PUT"]["pipeline"] == 0.0
    assert rows["API requests per TrainJob, every resource: APPLY"]["trainer"] == 0.0
    assert rows["API requests per TrainJob, TrainJobs and components: APPLY"]["ratio"] == 1.0
    assert rows["CPU per TrainJob, controller side"]["ratio"] == 2.0
    assert rows["CPU per TrainJob: trainer-controller"]["trainer"] == pytest.approx(5.0)
    assert rows["CPU per TrainJob: trainer-controller"]["pipeline"] is None
    assert rows["CPU per TrainJob: kube-apiserver"]["ratio"] == pytest.approx(1.25)
    assert rows["RSS, controller side, all Complete"]["ratio"] == 3.0
    assert rows["peak RSS (VmHWM), controller side"]["pipeline"] == 240.0
    order = [r["figure"] for r in stats.lifecycle_rows(_lifecycle())]
    assert order.index("CPU per TrainJob: trainer-controller") < order.index("CPU per TrainJob: applier")
    assert order.index("CPU per TrainJob: applier") < order.index("CPU per TrainJob: kube-apiserver")


def test_lifecycle_checks_judge_status_writes_and_time_against_trainers() -> None:
    life = _lifecycle()
    checks = {c["figure"]: c for c in stats.build_checks({"lifecycle": life}) if c["section"] == "lifecycle"}
    assert set(checks) == {"ran to Complete", "time to all Complete", "status writes per TrainJob"}
    assert checks["ran to Complete"]["verdict"] == "not met"  # the pipeline's own figure, 499 of 500
    assert checks["status writes per TrainJob"]["value"] == pytest.approx(2.0 / 3.0)
    assert checks["status writes per TrainJob"]["target"] == "≤ 1.000x"
    assert checks["status writes per TrainJob"]["verdict"] == "met"
    assert checks["time to all Complete"]["verdict"] == "no figure"  # not every TrainJob completed
    life["pipeline"]["seconds_to_all_complete"] = 100.0
    checks = {c["figure"]: c for c in stats.build_checks({"lifecycle": life}) if c["section"] == "lifecycle"}
    assert checks["time to all Complete"]["value"] == pytest.approx(1.25)
    assert checks["time to all Complete"]["verdict"] == "not met"


def test_a_bound_decides_a_target_one_way_only() -> None:
    at_most = stats.Target("<=", 1.0, "x")
    assert at_most.met_bounded(0.8, "at most") is True
    assert at_most.met_bounded(1.2, "at most") is None
    assert at_most.met_bounded(1.2, "at least") is False
    assert at_most.met_bounded(0.8, "at least") is None
    assert at_most.met_bounded(0.8, None) is True
    at_least = stats.Target(">=", 100.0, "%")
    assert at_least.met_bounded(100.0, "at least") is True
    assert at_least.met_bounded(90.0, "at least") is None
    assert at_least.met_bounded(None, "at most") is None


def test_a_wait_that_ended_first_is_a_lower_bound_of_the_time_to_all_complete() -> None:
    life = _lifecycle()
    life["pipeline"].update(seconds_to_all_complete=72.0)
    life["trainer"].update(
        seconds_to_all_complete=None, seconds_waited=900.0, complete_percent=40.0, outcomes={"Complete": 200}
    )
    rows = {r["figure"]: r for r in stats.lifecycle_rows(life)}
    time_row = rows["time to all Complete"]
    assert (time_row["trainer"], time_row["at_least"], time_row["ratio_bound"]) == (900.0, ["trainer"], "at most")
    assert time_row["ratio"] == pytest.approx(0.08)
    checks = {c["figure"]: c for c in stats.build_checks({"lifecycle": life}) if c["section"] == "lifecycle"}
    assert (checks["time to all Complete"]["display"], checks["time to all Complete"]["verdict"]) == ("< 0.080x", "met")
    text = stats.render_markdown({"meta": {}, "machine": {}, "scenarios": {"lifecycle": life}, "checks": []})
    assert "| time to all Complete | > 900.00 s | 72.00 s | < 0.080 | ratio ≤ 1.000x | met |" in text
    # The other way round a lower bound can only fail the target.
    life["trainer"].update(seconds_to_all_complete=80.0)
    life["pipeline"].update(seconds_to_all_complete=None, seconds_waited=60.0)
    checks = {c["figure"]: c for c in stats.build_checks({"lifecycle": life}) if c["section"] == "lifecycle"}
    assert checks["time to all Complete"]["verdict"] == "no figure"
    life["pipeline"].update(seconds_waited=100.0)
    checks = {c["figure"]: c for c in stats.build_checks({"lifecycle": life}) if c["section"] == "lifecycle"}
    assert (checks["time to all Complete"]["display"], checks["time to all Complete"]["verdict"]) == (
        "> 1.250x",
        "not met",
    )


def test_lifecycle_section_renders_both_sides_with_verdicts() -> None:
    life = _lifecycle()
    life["pipeline"]["seconds_to_all_complete"] = 72.0
    scenarios = {"lifecycle": life}
    text = stats.render_markdown(
        {"meta": {}, "machine": {}, "scenarios": scenarios, "checks": stats.build_checks(scenarios)}
    )
    assert "## 6. Lifecycle on a simulated cluster, side by side with Trainer v2.3.0" in text
    assert "| time to all Complete | 80.00 s | 72.00 s | 0.900 | ratio ≤ 1.000x | met |" in text
    assert "| status writes per TrainJob | 3 writes/TJ | 2 writes/TJ | 0.667 | ratio ≤ 1.000x | met |" in text
    assert "| ran to Complete | 100.0% | 99.8% | 0.998 | ≥ 100.0% | not met |" in text
    assert "| CPU per TrainJob: applier | — | 10 ms | n/a | — | — |" in text
    assert "- pipeline: outcomes Complete 499, Failed 1 of 500 created." in text
    assert "- pipeline: apply outcomes JobSet/created=500." in text
    assert "| lifecycle | time to all Complete | 0.900x | ≤ 1.000x | met |" in text


def test_a_failed_lifecycle_side_keeps_the_other_sides_figures() -> None:
    life = _lifecycle()
    life["trainer"] = {"error": "RuntimeError('no readyz')", "cluster_start_seconds": 30.0}
    rows = {r["figure"]: r for r in stats.lifecycle_rows(life)}
    assert rows["time to all Complete"]["trainer"] is None
    assert rows["time to all Complete"]["ratio"] is None
    assert rows["status writes per TrainJob"]["pipeline"] == 2.0
    assert rows["cluster start"]["trainer"] == 30.0
    text = stats.render_markdown({"meta": {}, "machine": {}, "scenarios": {"lifecycle": life}, "checks": []})
    assert "- trainer: failed: RuntimeError('no readyz')." in text


def test_lifecycle_flags_choose_the_default_the_quick_and_the_large_run() -> None:
    from bench.runner import SCENARIOS, parse_args

    assert parse_args([]).lifecycle_jobs == 0
    default = parse_args(["--lifecycle"])
    assert (default.lifecycle_jobs, default.lifecycle_nodes, default.skip) == (500, 20, frozenset())
    assert parse_args(["--lifecycle", "--quick"]).lifecycle_jobs == 50
    large = parse_args(["--lifecycle-large"])
    assert (large.lifecycle_jobs, large.lifecycle_nodes) == (5000, 200)
    assert parse_args(["--lifecycle-large", "--lifecycle-nodes", "100"]).lifecycle_nodes == 100
    only = parse_args(["--lifecycle-only", "--lifecycle-jobs", "10"])
    assert (only.lifecycle_jobs, only.skip) == (10, frozenset(SCENARIOS))
    with pytest.raises(SystemExit):
        parse_args(["--lifecycle", "--lifecycle-jobs", "0"])


def test_the_status_flood_is_a_scenario_with_its_size_from_flags() -> None:
    from bench.runner import FLOOD, QUICK_FLOOD, parse_args

    assert parse_args([]).flood == FLOOD
    assert parse_args(["--quick"]).flood == QUICK_FLOOD
    assert parse_args(["--flood", "3x4x5"]).flood == (3, 4, 5)
    assert "status-flood" in parse_args(["--skip", "status-flood"]).skip
    for bad in ("3x4", "0x1x1", "axbxc"):
        with pytest.raises(SystemExit):
            parse_args(["--flood", bad])


def test_the_status_flood_is_shown_side_by_side_with_writes_per_update_judged_as_a_ratio() -> None:
    def side(label: str, accepted: int, seconds: float, writes: float) -> dict[str, Any]:
        return {
            "label": label,
            "accepted": accepted,
            "answers": {"200": accepted},
            "flood_s": seconds,
            "accepted_per_s": accepted / seconds,
            "latency_s": {"p50": seconds / 10, "p99": seconds / 5},
            "status_writes": writes,
            "writes_per_update": writes / accepted,
            "newest_shown": 2,
        }

    flood = {
        "trainjobs": 2,
        "pods_per_trainjob": 5,
        "updates_per_pod": 10,
        "coalesce_s": 5.0,
        "trainer": side("Trainer v2.3.0", 100, 20.0, 100),
        "pipeline": side("this project", 100, 0.5, 4),
    }
    rows = {r["figure"]: r for r in stats.status_flood_rows(flood)}
    assert rows["updates/s accepted"]["ratio"] == pytest.approx(40.0)
    assert rows["API server writes per update"]["ratio"] == pytest.approx(0.04)
    checks = stats.build_checks({"status_flood": flood})
    (judged,) = [c for c in checks if c["section"] == "status-server flood"]
    assert judged["figure"] == "API server writes per update" and judged["met"] is True
    text = stats.render_markdown({"meta": {}, "machine": {}, "scenarios": {"status_flood": flood}, "checks": checks})
    assert "## Status-server flood" in text and "2 of 2 TrainJobs show the newest update" in text
    skipped = stats.render_markdown(
        {"meta": {}, "machine": {}, "scenarios": {"status_flood": {"skipped": "needs root"}}, "checks": []}
    )
    assert "Not measured: needs root." in skipped


def test_this_pass_judges_issue_39s_bounds_beside_the_long_term_targets() -> None:
    scenarios = {**_report()["scenarios"], "lifecycle": _lifecycle()}
    checks = stats.build_checks(scenarios)
    this_pass = {c["figure"]: c for c in checks if c["section"] == stats.PASS_SECTION}
    assert set(this_pass) == {
        "throughput, torch N=1,000",
        "CPU per TrainJob, controller side",
        "lifecycle: CPU per TrainJob, controller side",
        "lifecycle: JobSet finished to TrainJob finished p50",
    }
    # 2.2x throughput meets this pass's 1.5x (and the long-term 2x); 7.5 / 3.6 ms of CPU misses 2x as it misses 1x.
    assert this_pass["throughput, torch N=1,000"]["target"] == "≥ 1.500x"
    assert this_pass["throughput, torch N=1,000"]["verdict"] == "met"
    assert this_pass["CPU per TrainJob, controller side"]["target"] == "≤ 2.000x"
    assert this_pass["CPU per TrainJob, controller side"]["verdict"] == "not met"
    assert this_pass["lifecycle: CPU per TrainJob, controller side"]["value"] == 2.0
    assert this_pass["lifecycle: CPU per TrainJob, controller side"]["verdict"] == "met"
    reaction = this_pass["lifecycle: JobSet finished to TrainJob finished p50"]
    assert (reaction["value"], reaction["target"], reaction["verdict"]) == (3.0, "≤ 1.00 s", "not met")
    long_term = {c["figure"]: c for c in checks if c["section"] == "versus Trainer"}
    assert long_term["CPU per TrainJob, controller side"]["target"] == "≤ 1.000x"
