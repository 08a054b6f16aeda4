"""The monitoring kit under deploy/ as tests read it: the PromQL of the Grafana dashboard
and of the Prometheus alert rules, and the hub metrics each names."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import yaml

from tests.support.paths import REPO

DASHBOARD = REPO / "deploy" / "grafana" / "agent-reach.json"
ALERTS = REPO / "deploy" / "prometheus" / "alerts.yml"
# Grafana's interval variables, as promtool would see a query once Grafana filled them in
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h"}
_METRIC = re.compile(r"\bagentreach_[a-z0-9_]+\b")
_HISTOGRAM_PARTS = ("_bucket", "_sum", "_count")


def dashboard() -> dict[str, Any]:
    return dict(json.loads(DASHBOARD.read_text()))


def panels(board: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, those inside rows included."""
    for panel in board["panels"]:
        yield panel
        yield from panel.get("panels", [])


def dashboard_queries() -> list[str]:
    """The dashboard's PromQL, Grafana's variables filled in."""
    queries = []
    for panel in panels(dashboard()):
        for target in panel.get("targets", []):
            expr = target["expr"]
            for name, value in GRAFANA_VARIABLES.items():
                expr = expr.replace(name, value)
            queries.append(expr)
    return queries


def alert_rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def metric_names(queries: list[str]) -> set[str]:
    """The hub metrics the queries name (a histogram's series by the name it is exported as)."""
    return {name for query in queries for name in _METRIC.findall(query)}


def exported_names(exposition: str) -> set[str]:
    """The sample names in a ``/metrics`` text exposition, a histogram's whole family too."""
    names = set()
    for line in exposition.splitlines():
        if line and not line.startswith("#"):
            name = re.split(r"[{ ]", line, maxsplit=1)[0]
            names.add(name)
            for part in _HISTOGRAM_PARTS:
                if name.endswith(part):
                    names.add(name.removesuffix(part))
    return names
