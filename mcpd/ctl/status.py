"""`mcpctl status`: the board and the daemon at a glance (or the whole document with --json)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from typing import Any

from mcpd.client import Client
from mcpd.ctl.common import add_socket, connected, number


def _runs_on(model: Mapping[str, Any]) -> str:
    """onnxruntime's provider, or OpenVINO's device and precision (`OpenVINO CPU bf16`)."""
    openvino = model.get("openvino")
    if openvino:
        return f"OpenVINO {openvino['device']} {openvino['precision']}"
    return str(model.get("provider") or "-")


def _cooling(cooling: Mapping[str, Any]) -> str:
    """`normal: 6.41 °C/W (baseline 6.38, x1.00), time constant 36 s, confidence 0.97`"""
    state = cooling.get("state", "-")
    r = cooling.get("thermal_resistance_c_per_w")
    if state == "off" or r is None:
        return str(state) + ("" if state == "off" else " (no window fitted yet)")
    base = cooling.get("baseline_c_per_w")
    drift = cooling.get("drift_ratio")
    against = "" if base is None else f" (baseline {base:.2f}, x{number(drift, '', 2)})"
    return (
        f"{state}: {r:.2f} °C/W{against}, time constant {number(cooling.get('time_constant_s'), ' s', 0)}, "
        f"confidence {number(cooling.get('confidence'), '', 2)}"
    )


def format_status(doc: Mapping[str, Any]) -> str:
    power = "no meter" if doc.get("power_w") is None else number(doc["power_w"], " W", 2)
    estimated = " (estimated)" if doc.get("power_estimated") else ""
    governor = doc.get("governor") or {}
    last = governor.get("last_action")
    lines = [
        f"platform     {doc.get('platform')}  {doc.get('model') or ''}".rstrip(),
        f"temperature  {number(doc.get('temperature_c'), ' °C')}",
        f"power        {power}{estimated}",
        f"governor     {governor.get('state', '-')}"
        + (f"  (last: {last['action']}, {last['reason']})" if last else ""),
        f"cooling      {_cooling(doc.get('cooling') or {})}",
        "",
        f"{'domain':<18} {'kind':<10} {'cap MHz':>9} {'cur MHz':>9} {'range MHz':>15}",
    ]
    for name, d in (doc.get("domains") or {}).items():
        span = f"{number(d.get('min_mhz'), '', 0)}-{number(d.get('max_mhz'), '', 0)}"
        lines.append(
            f"{name:<18} {d.get('kind', ''):<10} {number(d.get('cap_mhz'), '', 0):>9} "
            f"{number(d.get('cur_mhz'), '', 0):>9} {span:>15}"
        )
    inference = doc.get("inference") or {}
    if inference:
        batch = doc.get("batch") or {}
        lines += [
            "",
            f"{'model':<18} {'ready':<6} {'batch':>5} {'requests':>9} {'errors':>7} "
            f"{'p50 ms':>8} {'p99 ms':>8} {'queue':>6}  runs on",
        ]
        for name, m in inference.items():
            lines.append(
                f"{name:<18} {'yes' if m.get('ready') else 'no':<6} {batch.get(name, '-'):>5} "
                f"{m.get('requests', 0):>9} {m.get('errors', 0):>7} "
                f"{number(m.get('p50_ms'), '', 2):>8} {number(m.get('p99_ms'), '', 2):>8} "
                f"{m.get('queue_depth', 0):>6}  {_runs_on(m)}"
            )
    return "\n".join(lines)


@connected
def run(args: argparse.Namespace, client: Client) -> int:
    doc = client.status()
    print(json.dumps(doc, indent=2) if args.json else format_status(doc))
    return 0


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser("status", help="temperature, power, caps, governor, models")
    add_socket(parser)
    parser.add_argument("--json", action="store_true", help="the whole status document")
    parser.set_defaults(func=run)
