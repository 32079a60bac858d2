"""deploy/components/monitoring and the chart's monitoring values: they render, parse, fit the pods, and the
API server accepts them with the Prometheus Operator's own CRDs.

The expressions are parsed here and checked only for shape; ``tests/e2e/test_metrics.py`` checks each metric
and label they read against the ``/metrics`` of running services. The CRDs of ServiceMonitor and
PrometheusRule come from the prometheus-operator Go module (its ``example/prometheus-operator-crd``), so the
dry run validates the objects against the operator's real schema.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import promql_parser
import pytest
import yaml

from contracts.subjects import PARTITIONS
from tjpipe.local.crds import install_crds
from tjpipe.local.helm import helm_template
from tjpipe.local.kustomize import kustomize_build
from tjpipe.local.toolchain import go_module_dir

from . import REPO
from . import monitoring as m
from .test_kubeflow_install import RELEASE, RELEASE_NAMESPACE, _by_key, tool
from .test_kustomize import NAMESPACE, Obj, _client_with, _dry_run_each, _named, _of_kind, _progress

PROMETHEUS_OPERATOR_MODULE = "github.com/prometheus-operator/prometheus-operator"
PROMETHEUS_OPERATOR_VERSION = "v0.85.0"
OPERATOR_CRDS = ("monitoring.coreos.com_servicemonitors.yaml", "monitoring.coreos.com_prometheusrules.yaml")
MONITORING_KINDS = {"ServiceMonitor", "PrometheusRule"}
RUNBOOKS = REPO / "docs" / "operating.md"


def _render(tmp: Path, *components: Path) -> list[Obj]:
    """deploy/base with these components, as an overlay of one's own would add them."""
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [os.path.relpath(REPO / "deploy" / "base", tmp)],
        "components": [os.path.relpath(c, tmp) for c in components],
    }
    (tmp / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    return kustomize_build(tmp, progress=_progress)


@pytest.fixture(scope="module")
def base() -> list[Obj]:
    return kustomize_build(REPO / "deploy" / "base", progress=_progress)


@pytest.fixture(scope="module")
def monitored(tmp_path_factory: pytest.TempPathFactory) -> list[Obj]:
    return _render(tmp_path_factory.mktemp("monitored"), m.COMPONENT)


def _added(objects: list[Obj], base: list[Obj]) -> list[Obj]:
    keys = {(o["kind"], o["metadata"]["name"]) for o in base}
    return [o for o in objects if (o["kind"], o["metadata"]["name"]) not in keys]


# ------------------------------------------------------------------------------------ the expressions


@pytest.mark.parametrize("expression", m.every_expression(), ids=lambda e: e.where)
def test_every_expression_parses(expression: m.Expression) -> None:
    assert m.uses(expression.text).selectors, f"{expression.where} reads no metric"


def test_the_checker_finds_a_wrong_metric_a_wrong_label_and_bad_syntax() -> None:
    exposed = {
        "tjpipe_dead_letters_total": {"stage": {"planner"}, "reason": {"undecodable"}},
        "tjpipe_partitions_owned": {"role": {"planner", "applier"}},
    }
    wrong_name = m.Expression("x", "sum(rate(tjpipe_dead_letter_total[5m]))")
    wrong_label = m.Expression("y", 'sum by (kind) (rate(tjpipe_dead_letters_total{stag="planner"}[5m]))')
    missing = "x: tjpipe_dead_letter_total is not exposed by any service"
    assert m.problems(wrong_name, exposed, pending_allowed=True) == [missing]
    assert m.problems(wrong_label, exposed, pending_allowed=True) == [
        "y: tjpipe_dead_letters_total has no label stag",
        "y: no metric it reads has label kind",
    ]
    pending = m.Expression("z", "max by (stream) (tjpipe_stream_bytes)")
    assert m.problems(pending, exposed, pending_allowed=True) == []
    not_yet = "z: tjpipe_stream_bytes is not exposed by any service"
    assert m.problems(pending, exposed, pending_allowed=False) == [not_yet, "z: no metric it reads has label stream"]
    no_such_role = m.Expression(
        "r", 'sum(tjpipe_partitions_owned{role="plannr"}) or sum(tjpipe_partitions_owned{role="applier"})'
    )
    assert m.problems(no_such_role, exposed, pending_allowed=True) == [
        "r: no tjpipe_partitions_owned sample has role='plannr'"
    ]
    with pytest.raises(ValueError):
        promql_parser.parse("sum by (stage) (rate(tjpipe_dead_letters_total[5m])")


def test_every_alert_has_a_severity_a_summary_and_a_runbook_in_the_docs() -> None:
    runbooks = RUNBOOKS.read_text()
    alerts = [r for g in m.rules()["spec"]["groups"] for r in g["rules"]]
    names = [r["alert"] for r in alerts]
    assert len(set(names)) == len(names) >= 7
    for rule in alerts:
        assert rule["labels"]["severity"] in ("warning", "critical"), rule["alert"]
        assert {"summary", "description", "runbook"} <= set(rule["annotations"]), rule["alert"]
        assert rule["annotations"]["runbook"] == f'docs/operating.md, "Runbooks", {rule["alert"]}', rule["alert"]
        runbook = re.search(rf"^### {rule['alert']}$", runbooks, re.MULTILINE)
        assert runbook, f"docs/operating.md has no runbook for {rule['alert']}"


def test_the_partition_count_in_the_rules_is_the_pipelines() -> None:
    (rule,) = [r for g in m.rules()["spec"]["groups"] for r in g["rules"] if r["alert"] == "TjpipePartitionsUnowned"]
    assert f"< {PARTITIONS}" in rule["expr"]


def test_the_dashboard_is_grafana_json_with_unique_panel_ids_and_a_data_source_variable() -> None:
    dashboard = m.dashboard()
    assert dashboard["uid"] == "trainjob-pipeline"
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["query"] == "prometheus"
    for panel in dashboard["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
            assert panel["targets"], panel["title"]


# ------------------------------------------------------------------------------------------- rendered


def test_the_component_adds_a_service_monitor_rules_the_dashboard_and_metrics_services(
    monitored: list[Obj], base: list[Obj]
) -> None:
    added = _added(monitored, base)
    assert sorted((o["kind"], o["metadata"]["name"]) for o in added) == sorted(
        [
            ("ServiceMonitor", "trainjob-pipeline"),
            ("PrometheusRule", "trainjob-pipeline"),
            ("ConfigMap", "tjpipe-grafana-dashboard"),
            *(("Service", f"tjpipe-{s}-metrics") for s in ("watcher", "planner", "applier", "controller", "webhook")),
        ]
    )
    assert all(o["metadata"]["namespace"] == NAMESPACE for o in added)
    base_keys = {(b["kind"], b["metadata"]["name"]) for b in base}
    assert [o for o in monitored if (o["kind"], o["metadata"]["name"]) in base_keys] == base
    dashboard = _named(monitored, "ConfigMap", "tjpipe-grafana-dashboard")
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(dashboard["data"][m.DASHBOARD.name]) == m.dashboard()
    assert _named(monitored, "PrometheusRule", "trainjob-pipeline")["spec"] == m.rules()["spec"]


def _metrics_services_and_pods(objects: list[Obj]) -> Iterator[tuple[Obj, Obj]]:
    for service in _of_kind(objects, "Service"):
        if service["metadata"]["name"].endswith("-metrics"):
            selector = service["spec"]["selector"]
            for deployment in _of_kind(objects, "Deployment"):
                template = deployment["spec"]["template"]
                if selector.items() <= template["metadata"]["labels"].items():
                    yield service, template


@pytest.mark.parametrize("layout", ["three services", "one process"])
def test_the_service_monitor_finds_every_process_and_its_metrics_port(
    layout: str, base: list[Obj], tmp_path: Path
) -> None:
    components = (m.COMPONENT,) if layout == "three services" else (m.COMPONENT, tool.ONE_PROCESS)
    objects = _render(tmp_path, *components)
    monitor = _named(objects, "ServiceMonitor", "trainjob-pipeline")
    wanted = monitor["spec"]["selector"]["matchLabels"]
    selected = [s for s in _of_kind(objects, "Service") if wanted.items() <= s["metadata"].get("labels", {}).items()]
    assert all(s["metadata"]["name"].endswith("-metrics") for s in selected)
    assert monitor["spec"]["endpoints"][0]["honorLabels"] is True  # keeps kubeflow_trainer_*'s namespace label
    found = {service["metadata"]["name"]: template for service, template in _metrics_services_and_pods(objects)}
    stages = ["webhook", *(["watcher", "planner", "applier"] if layout == "three services" else ["controller"])]
    assert sorted(found) == sorted(f"tjpipe-{s}-metrics" for s in stages)
    for template in found.values():
        ports = {p["name"] for c in template["spec"]["containers"] for p in c.get("ports", [])}
        assert "metrics" in ports
    (down,) = [r for g in m.rules()["spec"]["groups"] for r in g["rules"] if r["alert"] == "TjpipeStageDown"]
    job_pattern = re.search(r'job=~"([^"]+)"', down["expr"])
    assert job_pattern is not None
    for name in found:
        assert bool(re.fullmatch(job_pattern[1], name)) == (name != "tjpipe-webhook-metrics"), name


def test_the_chart_leaves_monitoring_out_by_default_and_renders_the_component_when_asked(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    chart = tool.assemble_chart(tmp_path_factory.mktemp("chart") / RELEASE, progress=_progress)
    plain = helm_template(chart, release=RELEASE, namespace=RELEASE_NAMESPACE, progress=_progress)
    assert not [o for o in plain if o["kind"] in MONITORING_KINDS or o["metadata"]["name"].endswith("-metrics")]
    on = [
        "--set",
        "monitoring.serviceMonitor.enabled=true",
        "--set",
        "monitoring.prometheusRule.enabled=true",
        "--set",
        "monitoring.grafanaDashboard.enabled=true",
    ]
    full = helm_template(chart, release=RELEASE, namespace=RELEASE_NAMESPACE, extra_args=on, progress=_progress)
    expected = tool.render_overlay(components=(m.COMPONENT,), progress=_progress)
    assert _by_key(full) == _by_key(expected)
    only_rules = helm_template(
        chart, release=RELEASE, namespace=RELEASE_NAMESPACE, extra_args=on[2:4], progress=_progress
    )
    plain_keys = set(_by_key(plain))
    assert [o["kind"] for o in only_rules if o not in plain] == ["PrometheusRule"]
    assert set(_by_key(only_rules)) >= plain_keys


# ------------------------------------------------------------------------------------ the API server


@pytest.fixture(scope="module")
def operator_crds() -> list[Obj]:
    module = go_module_dir(PROMETHEUS_OPERATOR_MODULE, PROMETHEUS_OPERATOR_VERSION)
    folder = module / "example" / "prometheus-operator-crd"
    return [yaml.safe_load((folder / name).read_text()) for name in OPERATOR_CRDS]


@pytest.mark.cluster
def test_the_api_server_accepts_the_monitoring_objects_with_the_operators_crds(
    kube: Any, monitored: list[Obj], base: list[Obj], operator_crds: list[Obj]
) -> None:
    with kube.api_client() as api_client:
        install_crds(api_client, operator_crds)
    iterator = _client_with(kube, [_named(base, "Namespace", NAMESPACE)])
    client, known = next(iterator)
    rejected, warnings = _dry_run_each(client, known, _added(monitored, base))
    assert rejected == []
    assert warnings == []
