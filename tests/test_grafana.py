"""The Grafana dashboards in examples/: well-formed dashboard JSON whose every PromQL expression
names only series mcpd exports (or Prometheus' own `up`), with labels those series carry."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from mcpd.serving.metrics import Exposition
from tests.conftest import PROJECT
from tests.test_metrics import STATS, full_document

DASHBOARDS = sorted((PROJECT / "examples").glob("grafana-*.json"))
PROMETHEUS_LABELS = {"instance", "job"}
"""Added by Prometheus to every series it scrapes."""
PROMETHEUS_SERIES = {"up": set[str]()}
"""Written by Prometheus for every target: 1 when the scrape worked."""
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or",
            "unless", "offset"}  # fmt: skip


def exported() -> dict[str, set[str]]:
    """Every series name in a full scrape, with its label names."""
    body, _ = Exposition(full_document, lambda: STATS).render("")
    series: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            series.setdefault(sample.name, set()).update(sample.labels)
    return series


def expressions(dashboard: dict[str, Any]) -> list[str]:
    found = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            # label_values(SELECTOR, LABEL): the selector is PromQL, the label is a label
            call = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", variable["definition"])
            assert call, variable["definition"]
            selector, label = call.groups()
            found += [selector, f'{selector.split("{")[0]}{{{label}=~".*"}}']
    return found


def references(expr: str) -> list[tuple[str, set[str]]]:
    """(series name, label names matched on it) for every series the expression selects."""
    text = re.sub(r"\$\w+", "", expr)  # Grafana variables
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', text)  # label values
    text = re.sub(r"\[[^\]]*\]", "", text)  # range selectors
    text = re.sub(r"\b\d+(?:\.\d+)?(?:e[+-]?\d+)?\b", "", text)  # numbers
    text = re.sub(r"\b(?:by|without|on|ignoring)\s*\([^)]*\)", "", text)  # grouping label lists
    found = []
    for match in re.finditer(r"([A-Za-z_:][A-Za-z0-9_:]*)\s*(\{[^}]*\})?\s*(\()?", text):
        name, matchers, call = match.groups()
        if call or name in KEYWORDS:
            continue  # a function or aggregation
        labels = set(re.findall(r"(\w+)\s*(?:=~|!~|!=|=)", matchers or ""))
        found.append((name, labels))
    return found


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_dashboard_is_grafana_json(path: Path) -> None:
    dashboard = json.loads(path.read_text())
    assert dashboard["uid"] and dashboard["title"] and dashboard["schemaVersion"] >= 36
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    assert "datasource" in variables
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert set(panel["gridPos"]) == {"h", "w", "x", "y"}
        assert panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            used = set(re.findall(r"\$(\w+)", target["expr"])) - {"__rate_interval"}
            assert used <= variables, (panel["title"], used)


def test_both_dashboards_are_there() -> None:
    assert [p.name for p in DASHBOARDS] == ["grafana-board.json", "grafana-fleet.json"]


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_every_expression_names_exported_series_and_labels(path: Path) -> None:
    series = {**exported(), **PROMETHEUS_SERIES}
    checked = 0
    for expr in expressions(json.loads(path.read_text())):
        refs = references(expr)
        assert refs, f"no series in {expr!r}"
        for name, labels in refs:
            assert name in series, f"{path.name}: {name} in {expr!r} is not exported"
            unknown = labels - series[name] - PROMETHEUS_LABELS
            assert not unknown, f"{path.name}: {name} has no label {unknown} ({expr!r})"
            checked += 1
    assert checked >= 20


def test_the_reference_parser_catches_a_wrong_name() -> None:
    """The check above would pass vacuously if `references` found nothing."""
    refs = references(
        'histogram_quantile(0.99, sum by (model, le) (rate(mcpd_x_bucket{model=~"$m"}[5m])))'
    )
    assert refs == [("mcpd_x_bucket", {"model"})]
    assert references("count by (version) (mcpd_build_info) / 1e6") == [("mcpd_build_info", set())]


def test_fleet_latency_aggregates_buckets_across_instances() -> None:
    fleet = json.loads((PROJECT / "examples/grafana-fleet.json").read_text())
    quantiles = [e for e in expressions(fleet) if e.startswith("histogram_quantile")]
    assert quantiles
    for expr in quantiles:  # summed over every instance, keeping le: a fleet-wide quantile
        assert re.search(r"sum by \((model, )?le\) \(rate\(mcpd_\w+_seconds_bucket", expr), expr
