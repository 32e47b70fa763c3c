"""The series a Grafana dashboard reads: its PromQL expressions (panels and query variables), and
each series an expression selects with the label names it matches on."""

from __future__ import annotations

import re
from typing import Any

KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or",
            "unless", "offset"}  # fmt: skip


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
