"""The monitoring component's PromQL, read the way Prometheus and Grafana read it, and checked against metrics.

Every expression of the Grafana dashboard (panel targets and the namespace variable's ``label_values``) and
of the PrometheusRule is parsed with a real PromQL parser (the ``promql-parser`` package, a port of
Prometheus' own grammar); what the parsed expression selects — each metric name, each label it matches on,
groups by or joins on — is then checked against the samples a scrape of the running services returned.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import promql_parser
import yaml

from . import REPO

COMPONENT = REPO / "deploy" / "components" / "monitoring"
DASHBOARD = COMPONENT / "trainjob-pipeline-dashboard.json"
RULES = COMPONENT / "prometheusrule.yaml"

TARGET_LABELS = frozenset({"job", "instance", "namespace", "pod", "service", "container", "endpoint"})
"""What the ServiceMonitor's scrape adds to every series (Prometheus Operator's target labels)."""
SYNTHETIC = {"up": frozenset()}
"""Series Prometheus makes itself for every target, with the target labels only."""
PENDING = {"tjpipe_stream_bytes": "stream", "tjpipe_stream_max_bytes": "stream"}
"""Gauges another branch (h-streams) adds; until it lands they are allowed absent from a scrape, with this label."""

_GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$__range": "1h", "$__interval": "30s", "$namespace": "team-a"}
_LABEL_VALUES = re.compile(r"^label_values\((?P<metric>[a-zA-Z_:][a-zA-Z0-9_:]*)\s*,\s*(?P<label>[a-zA-Z_]\w*)\)$")


@dataclass(frozen=True)
class Expression:
    where: str
    text: str


@dataclass
class Uses:
    """What one expression reads: per metric the labels its selector matches on, and the labels it groups by."""

    selectors: dict[str, set[str]] = field(default_factory=dict)
    grouping: set[str] = field(default_factory=set)
    equal: dict[str, set[tuple[str, str]]] = field(default_factory=dict)
    """Per metric the (label, value) pairs its selector asks for exactly, e.g. ``role="planner"``."""


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def rules() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(RULES.read_text())
    return loaded


def dashboard_expressions() -> Iterator[Expression]:
    for panel in dashboard()["panels"]:
        for target in panel.get("targets", []):
            yield Expression(f"dashboard panel {panel['title']!r} {target['refId']}", target["expr"])


def variable_queries() -> Iterator[tuple[str, str, str]]:
    """(variable, metric, label) of each ``label_values`` query variable."""
    for variable in dashboard()["templating"]["list"]:
        if variable["type"] == "query":
            match = _LABEL_VALUES.match(variable["query"]["query"])
            assert match, f"variable {variable['name']}: not a label_values(metric, label) query"
            yield variable["name"], match["metric"], match["label"]


def rule_expressions() -> Iterator[Expression]:
    for group in rules()["spec"]["groups"]:
        for rule in group["rules"]:
            yield Expression(f"rule {rule.get('alert') or rule.get('record')}", rule["expr"])


def every_expression() -> list[Expression]:
    return [*dashboard_expressions(), *rule_expressions()]


def as_promql(text: str) -> str:
    """Grafana's variables replaced by values of the kind Grafana puts there."""
    for variable, value in _GRAFANA_VARIABLES.items():
        text = text.replace(variable, value)
    assert "$" not in text, f"an unknown Grafana variable in {text!r}"
    return text


def uses(text: str) -> Uses:
    """Parse one expression (raises on a syntax error) and collect what it reads."""
    found = Uses()
    _walk(promql_parser.parse(as_promql(text)), found)
    return found


def _walk(node: Any, found: Uses) -> None:
    if isinstance(node, promql_parser.VectorSelector):
        labels = {m.name for m in node.matchers.matchers} | {
            m.name for group in node.matchers.or_matchers for m in group
        }
        labels.discard("__name__")
        assert node.name, f"a selector without a metric name: {node}"
        found.selectors.setdefault(node.name, set()).update(labels)
        found.equal.setdefault(node.name, set()).update(
            (m.name, m.value) for m in node.matchers.matchers if m.op == promql_parser.MatchOp.Equal
        )
    elif isinstance(node, promql_parser.MatrixSelector):
        _walk(node.vector_selector, found)
    elif isinstance(node, promql_parser.AggregateExpr):
        if node.modifier is not None:
            found.grouping.update(node.modifier.labels)
        _walk(node.expr, found)
        if node.param is not None:
            _walk(node.param, found)
    elif isinstance(node, promql_parser.BinaryExpr):
        modifier = node.modifier
        if modifier is not None:
            if modifier.matching is not None:
                found.grouping.update(modifier.matching.labels)
            found.grouping.update(modifier.group_labels or ())
        _walk(node.lhs, found)
        _walk(node.rhs, found)
    elif isinstance(node, promql_parser.Call):
        for arg in node.args:
            _walk(arg, found)
    elif isinstance(node, promql_parser.ParenExpr | promql_parser.UnaryExpr | promql_parser.SubqueryExpr):
        _walk(node.expr, found)
    else:
        assert isinstance(node, promql_parser.NumberLiteral | promql_parser.StringLiteral), f"unexpected {node!r}"


Exposed = dict[str, dict[str, set[str]]]
"""Sample name -> label name -> the values its samples carry, as a scrape returned them (no values: only
declared in code, see ``exposed``)."""


def problems(expression: Expression, exposed: Exposed, *, pending_allowed: bool) -> list[str]:
    """Every metric or label the expression reads that the scrape does not have; empty when all are there."""
    used = uses(expression.text)
    out: list[str] = []
    available: set[str] = set(TARGET_LABELS)
    for metric, labels in used.selectors.items():
        if metric in SYNTHETIC:
            have = set(SYNTHETIC[metric])
        elif metric in exposed:
            have = set(exposed[metric])
            for label, value in sorted(used.equal.get(metric, ())):
                values = exposed[metric].get(label)
                if values and value not in values:
                    out.append(f"{expression.where}: no {metric} sample has {label}={value!r}")
        elif metric in PENDING and pending_allowed:
            have = {PENDING[metric]}
        else:
            out.append(f"{expression.where}: {metric} is not exposed by any service")
            continue
        available |= have
        out += [f"{expression.where}: {metric} has no label {label}" for label in sorted(labels - have - TARGET_LABELS)]
    out += [f"{expression.where}: no metric it reads has label {label}" for label in sorted(used.grouping - available)]
    return out


def declared_labels() -> dict[str, tuple[str, ...]]:
    """Each metric family the services define (their shared registry), with the label names it declares."""
    from prometheus_client.metrics import MetricWrapperBase

    import planner.webhook  # noqa: F401  (registers the webhook's metric in the shared registry)
    from plumbing import observability

    collectors = set(observability.REGISTRY._collector_to_names)
    declared = {c._name: tuple(c._labelnames) for c in collectors if isinstance(c, MetricWrapperBase)}
    declared[observability.ActiveTrainJobs.NAME] = observability.LIFECYCLE_LABELS
    return declared


_SAMPLE_SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "summary": ("_count", "_sum", "_created"),
    "info": ("_info",),
}


def exposed(texts: list[str]) -> tuple[Exposed, set[str]]:
    """What the scrapes hold: sample name -> label names seen on its samples; and the families with no sample.

    A family the services define but have not used yet (no child, so a scrape shows only its HELP and TYPE
    lines, e.g. ``tjpipe_publish_refused_total`` while no stream is full) gets the labels it declares in
    code, and is returned in the second set so a caller can say so.
    """
    from prometheus_client.parser import text_string_to_metric_families

    out: Exposed = {}
    typed: dict[str, str] = {}
    for text in texts:
        for family in text_string_to_metric_families(text):
            typed[family.name] = family.type
            for sample in family.samples:
                labels = out.setdefault(sample.name, {})
                for label, value in sample.labels.items():
                    labels.setdefault(label, set()).add(value)
    declared = declared_labels()
    empty: set[str] = set()
    for name, kind in typed.items():
        names = [name + suffix for suffix in _SAMPLE_SUFFIXES.get(kind, ("",))]
        if any(n in out for n in names) or name not in declared:
            continue
        empty.add(name)
        for sample_name in names:
            labels = set(declared[name]) | ({"le"} if sample_name.endswith("_bucket") else set())
            out[sample_name] = {label: set() for label in labels}
    return out, empty
