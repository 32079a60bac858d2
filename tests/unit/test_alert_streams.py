"""TjpipeStreamNearFull warns before a stream refuses publishes, so it must name exactly the streams that
refuse them at their limit (discard new: the work streams), and none of the record streams, which drop their
oldest records instead and would keep it firing once the history is full."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from contracts.streams import ALL_STREAMS

RULES = Path(__file__).resolve().parents[2] / "deploy" / "components" / "monitoring" / "prometheusrule.yaml"


def test_the_near_full_alert_names_exactly_the_streams_that_refuse_publishes() -> None:
    rules = yaml.safe_load(RULES.read_text())["spec"]["groups"][0]["rules"]
    expr = next(r["expr"] for r in rules if r.get("alert") == "TjpipeStreamNearFull")
    selectors = re.findall(r'\{stream=~"([^"]+)"\}', expr)
    refusing = {spec.name for spec in ALL_STREAMS if spec.discard == "new"}
    assert len(selectors) == 2, expr
    for selector in selectors:
        assert set(selector.split("|")) == refusing, selector
