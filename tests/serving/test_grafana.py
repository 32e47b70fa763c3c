"""The Grafana dashboards in examples/: well-formed dashboard JSON whose every PromQL expression
names only series mcpd exports (or Prometheus' own `up`), with labels those series carry."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.conftest import PROJECT
from tests.support.dashboards import expressions, references
from tests.support.metrics import exported

DASHBOARDS = sorted((PROJECT / "examples").glob("grafana-*.json"))
PROMETHEUS_LABELS = {"instance", "job"}
"""Added by Prometheus to every series it scrapes."""
PROMETHEUS_SERIES = {"up": set[str]()}
"""Written by Prometheus for every target: 1 when the scrape worked."""


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
