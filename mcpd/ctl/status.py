"""`mcpctl status`: the board and the daemon at a glance (or the whole document with --json)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

from mcpd.client import Client
from mcpd.ctl.common import add_socket, connected, number
from mcpd.subcommands import Subcommands


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
    tau = number(cooling.get("time_constant_s"), " s", 0)
    confidence = number(cooling.get("confidence"), "", 2)
    return f"{state}: {r:.2f} °C/W{against}, time constant {tau}, confidence {confidence}"


def _mqtt(doc: Mapping[str, Any]) -> list[str]:
    """Which broker telemetry goes to and since when; nothing when MQTT is off."""
    mqtt = doc.get("mqtt")
    if not mqtt:
        return []
    if not mqtt.get("broker"):
        return ["mqtt         not connected (spooling)"]
    since = datetime.fromtimestamp(mqtt["since"], timezone.utc).isoformat(timespec="seconds")
    return [f"mqtt         {mqtt['broker']} since {since}"]


def _placement(plan: Mapping[str, Any] | None) -> list[str]:
    """`placement  governor 0, serving loop 1, models 4-7 (ranked by cpu_capacity)`, and a line
    for each part skipped."""
    if not plan:
        return []
    if plan.get("mode") == "off" or not plan["governor"]["cpus"]:
        return [f"placement    {plan.get('note', '-')}"]
    parts = {
        "governor": plan["governor"],
        "serving loop": plan["serving_loop"],
        "models": plan["models_cpus"],
    }
    lines = [
        "placement    "
        + ", ".join(f"{name} {part['cpus']}" for name, part in parts.items())
        + f" (ranked by {plan.get('ranked_by')})"
    ]
    skipped = {name: part["skipped"] for name, part in parts.items() if part["skipped"]}
    lines += [f"  {name} not placed: {why}" for name, why in skipped.items()]
    return lines


def _model_cpus(placement: Mapping[str, Any] | None) -> str:
    """`4-7 x4`: the model's threads' CPUs and their count; `-` where the runtime places them."""
    if not placement or not placement.get("cpus"):
        return "-"
    skipped = " (skipped)" if placement.get("skipped") else ""
    return f"{placement['cpus']} x{placement['threads']}{skipped}"


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
        *_mqtt(doc),
        *_placement(doc.get("placement")),
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
        placed = (doc.get("placement") or {}).get("models") or {}
        lines += [
            "",
            f"{'model':<18} {'ready':<6} {'batch':>5} {'requests':>9} {'errors':>7} "
            f"{'p50 ms':>8} {'p99 ms':>8} {'queue':>6}  {'cpus':<16} runs on",
        ]
        for name, m in inference.items():
            lines.append(
                f"{name:<18} {'yes' if m.get('ready') else 'no':<6} {batch.get(name, '-'):>5} "
                f"{m.get('requests', 0):>9} {m.get('errors', 0):>7} "
                f"{number(m.get('p50_ms'), '', 2):>8} {number(m.get('p99_ms'), '', 2):>8} "
                f"{m.get('queue_depth', 0):>6}  {_model_cpus(placed.get(name)):<16} "
                f"{_runs_on(m)}"
            )
    return "\n".join(lines)


@connected
def run(args: argparse.Namespace, client: Client) -> int:
    doc = client.status()
    print(json.dumps(doc, indent=2) if args.json else format_status(doc))
    return 0


def add_parser(commands: Subcommands) -> argparse.ArgumentParser:
    parser = commands.add_parser("status", help="temperature, power, caps, governor, models")
    add_socket(parser)
    parser.add_argument("--json", action="store_true", help="the whole status document")
    return parser
