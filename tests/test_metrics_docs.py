"""The metrics page, its alert rules and the Grafana dashboard name only
metrics that a scrape really has, and the page documents every one of them."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from kumiflow_django.observability import metrics

DOCS = Path(__file__).resolve().parent.parent / "docs"
PAGE = (DOCS / "metrics.md").read_text()
NAME = re.compile(r"\bkumiflow_[a-z_]+")
SUFFIXES = ("_total", "_bucket", "_sum", "_count", "_created")


@pytest.fixture
def exposed(db) -> set[str]:
    """The names of the samples and families of a scrape."""
    with metrics.isolated() as registry:
        names = set()
        for family in registry.collect():
            names.add(family.name)
            names.update(sample.name for sample in family.samples)
            if family.type == "counter":
                names.add(family.name + "_total")
            if family.type == "histogram":
                names.update(family.name + suffix for suffix in SUFFIXES)
        return names


def base(name: str) -> str:
    for suffix in SUFFIXES:
        if name.endswith(suffix):
            return name.removesuffix(suffix)
    return name


def expressions() -> list[tuple[str, str]]:
    found = []
    for block in re.findall(r"```yaml\n(.*?)```", PAGE, re.S):
        config = yaml.safe_load(block)
        for group in config.get("groups", []):
            found += [(rule["alert"], rule["expr"]) for rule in group["rules"]]
    dashboard = json.loads((DOCS / "grafana-dashboard.json").read_text())
    for panel in dashboard["panels"]:
        found += [(panel["title"], target["expr"]) for target in panel.get("targets", [])]
    return found


def test_the_alerts_and_the_dashboard_query_metrics_that_exist(exposed):
    found = expressions()
    assert len(found) > 20
    for where, expr in found:
        named = NAME.findall(expr)
        assert named or "up{" in expr, where
        for name in named:
            assert name in exposed, f"{where}: {name} is not exposed"


def test_the_page_documents_every_metric(exposed):
    documented = {base(name) for name in NAME.findall(PAGE)}
    for name in {base(n) for n in exposed}:
        assert name in documented, f"{name} is not on docs/metrics.md"


def test_the_dashboard_is_importable():
    dashboard = json.loads((DOCS / "grafana-dashboard.json").read_text())
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    assert dashboard["templating"]["list"][0]["type"] == "datasource"
    for panel in dashboard["panels"]:
        assert set(panel["gridPos"]) == {"h", "w", "x", "y"}
        for target in panel.get("targets", []):
            assert target["datasource"]["uid"] == "${datasource}"
