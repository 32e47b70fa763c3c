"""`mcpctl fleet --from URL`: the fleet table from a time-series store instead of from every message.

A fleet's telemetry at 1 Hz is a message per board per second (1 338 bytes each: 1.3 GB/s at a
million boards), more than one reader can follow; a store that ingests it (`mcpctl ingest`, into
VictoriaMetrics or Prometheus) answers the table in a few instant queries of the Prometheus HTTP API
(`GET /api/v1/query`, https://prometheus.io/docs/prometheus/latest/querying/api/), which both
speak. The series are the board's own /metrics names (docs/metrics.md), labelled by `device`. A
table of every board moves the work to the store (16 s a refresh at 50 000 boards on two cores,
BENCHMARKS.md); `--top N` has the store pick the N hottest (`topk`) and asks only for them.

Each query is plain PromQL, so one URL serves for either store. VictoriaMetrics hides the last 30 s
of samples from queries unless started with `-search.latencyOffset=0s` (its default delays them
for scrapes in flight); a board silent for longer than the store's lookback (5 min on both by
default) has no sample at the query's time and drops out of the store's part of the table.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

DEVICE = "instance"
"""The label that names the board in the store (the one `mcpctl ingest` writes)."""
TIMEOUT_S = 10.0
HERTZ_PER_MHZ = 1e6

# Each query's {only} is empty, or a matcher of the boards asked for (`--top`).
SEEN = f"max by ({DEVICE}) (timestamp(mcpd_governor_state{{only}}))"
"""When each board's last sample was taken: every board has the governor's state series."""
TEMPERATURE = "mcpd_temperature_celsius{only}"
POWER = "mcpd_power_watts{only}"
CAPS = "mcpd_domain_cap_hertz{only}"
GOVERNOR = "mcpd_governor_state{only} == 1"
REQUESTS = f"sum by ({DEVICE}) (rate(mcpd_inference_requests_total{{only}}[1m]))"
"""Requests per second over the last minute, every model together (the telemetry's
`requests_per_s` is since the previous message)."""
BOARD = "mcpd_board_info{only}"
COOLING = "mcpd_cooling_state{only} == 1"
DRIFT = "mcpd_cooling_drift_ratio{only}"
HOTTEST = "topk({top}, mcpd_temperature_celsius)"
_DEVICE_ID = re.compile(r"^[A-Za-z0-9_-]+$")
"""What `[mqtt] device_id` may be (mcpd.config), and so safe in a regular expression as it is."""

Sample = tuple[dict[str, str], float]


class StoreError(Exception):
    """The store could not be asked, or did not answer as the API says; the message says which."""


def query(url: str, promql: str, timeout: float = TIMEOUT_S) -> list[Sample]:
    """The instant vector `promql` evaluates to now: (labels, value) per series."""
    address = f"{url.rstrip('/')}/api/v1/query?{urllib.parse.urlencode({'query': promql})}"
    try:
        with urllib.request.urlopen(address, timeout=timeout) as answer:
            body = json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        raise StoreError(f"{url} answered {exc.code} to {promql!r}: {_said(exc)}") from None
    except (urllib.error.URLError, OSError) as exc:
        why = getattr(exc, "reason", None) or exc
        raise StoreError(f"cannot query {url}: {why}") from None
    except ValueError:
        raise StoreError(f"{url} answered {promql!r} with something that is not JSON") from None
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, dict) or data.get("resultType") != "vector":
        raise StoreError(f"{url} answered {promql!r} without an instant vector")
    samples = []
    for series in data.get("result", []):
        try:
            samples.append((dict(series["metric"]), float(series["value"][1])))
        except (KeyError, IndexError, TypeError, ValueError):
            continue  # a series we cannot read is one row less, not a failed table
    return samples


def _said(error: urllib.error.HTTPError) -> str:
    try:
        return str(json.loads(error.read()).get("error", error.reason))
    except (ValueError, AttributeError):
        return str(error.reason)


def read(
    url: str, top: int = 0, timeout: float = TIMEOUT_S
) -> dict[str, tuple[float, dict[str, Any]]]:
    """device -> (Unix time of its last sample, its numbers shaped as a telemetry message); with
    `top`, for the `top` hottest boards only, which the store picks (topk), so that a refresh
    costs the reader as much for a million boards as for `top`."""
    _checked(url)
    only = ""
    if top:
        hottest = [
            labels.get(DEVICE, "") for labels, _ in query(url, HOTTEST.format(top=top), timeout)
        ]
        named = [device for device in hottest if _DEVICE_ID.match(device)]
        if not named:
            return {}
        only = f'{{{DEVICE}=~"{"|".join(named)}"}}'

    def ask(promql: str) -> list[Sample]:
        return query(url, promql.format(only=only), timeout)

    seen = {labels[DEVICE]: at for labels, at in ask(SEEN) if DEVICE in labels}
    bodies: dict[str, dict[str, Any]] = {device: {"domains": {}} for device in seen}

    def each(promql: str) -> list[tuple[dict[str, Any], dict[str, str], float]]:
        return [
            (bodies[labels[DEVICE]], labels, value)
            for labels, value in ask(promql)
            if labels.get(DEVICE) in bodies
        ]

    for body, _, value in each(TEMPERATURE):
        body["temperature_c"] = value
    for body, _, value in each(POWER):
        body["power_w"] = value
    for body, labels, value in each(CAPS):
        body["domains"][labels.get("domain", "")] = {"cap_mhz": value / HERTZ_PER_MHZ}
    for body, labels, _ in each(GOVERNOR):
        body["governor"] = {"state": labels.get("state")}
    for body, _, value in each(REQUESTS):
        body["requests_per_s"] = round(value, 3)
    for body, labels, _ in each(BOARD):
        body["platform"] = labels.get("platform")
    for body, labels, _ in each(COOLING):
        body.setdefault("cooling", {})["state"] = labels.get("state")
    for body, _, value in each(DRIFT):
        body.setdefault("cooling", {})["drift_ratio"] = value
    return {device: (seen[device], bodies[device]) for device in seen}


def _checked(url: str) -> None:
    if urllib.parse.urlsplit(url).scheme not in ("http", "https"):
        raise StoreError(f"{url!r} is not an http:// or https:// URL")
