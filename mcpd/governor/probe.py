"""`mcpd probe`: a one-shot look at the board, as a table or as JSON for scripts.

The JSON shape is a stable interface: platform, temperatures [{name, source, celsius|null}],
powers [{name, source, watts|null}], temperature_c, power_w, power_estimated, domains
[{name, kind, min_mhz, max_mhz, cap_mhz, available_mhz}]; plus model and power_source; cpus
[{cpu, capacity, max_mhz, cluster, siblings, core_type, node}] and placement (the plan for the
config's models: mcpd.status.PlacementDoc). The command adds execution_providers, gpu_warning and
openvino (mcpd.cli.probe: this package never imports onnxruntime or openvino).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from mcpd.config import Config
from mcpd.governor import board, domains
from mcpd.placement import plan
from sensors import SensorSet
from sensors.cpulist import format_list
from sensors.discovery import AUTO_POWER, PowerOptions
from sensors.topology import CpuTopology

SAMPLE_GAP_S = 0.1
"""Counter-based power (RAPL) needs two samples."""


def probe(
    root: str | Path,
    governing_temperatures: Sequence[str] = (),
    governing_powers: Sequence[str] = (),
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    power: PowerOptions = AUTO_POWER,
    config: Config | None = None,
) -> dict[str, Any]:
    """`config`'s models are placed (none by default)."""
    detected = board.detect(root)
    topology = CpuTopology.from_sysfs(root)
    sensors = SensorSet.discover(root, governing_temperatures, governing_powers, power)
    found = domains.discover(root)
    sensors.sample_powers(clock())
    sleep(SAMPLE_GAP_S)
    temperatures = sensors.sample_temperatures()
    powers = sensors.sample_powers(clock())
    return {
        "platform": detected.platform,
        "model": detected.model,
        "temperatures": [
            {
                "name": r.name,
                "source": r.source,
                "celsius": r.celsius,
                "governs": r.name in sensors.governing_names,
            }
            for r in temperatures.readings
        ],
        "powers": [
            {"name": r.name, "source": r.source, "watts": _round(r.watts)} for r in powers.readings
        ],
        "temperature_c": temperatures.celsius,
        "power_w": _round(powers.watts),
        "power_estimated": powers.estimated,
        "power_source": sensors.power_plan.reason,
        "domains": [
            {
                "name": d.name,
                "kind": d.kind,
                "min_mhz": d.min_mhz,
                "max_mhz": d.max_mhz,
                "cap_mhz": d.read_cap_mhz(),
                "available_mhz": list(d.available_mhz),
            }
            for d in found
        ],
        "cpus": [
            {
                "cpu": cpu.number,
                "capacity": cpu.capacity,
                "max_mhz": None if cpu.max_khz is None else cpu.max_khz / 1000,
                "cluster": format_list(cpu.cluster),
                "siblings": format_list(cpu.siblings),
                "core_type": cpu.core_type,
                "node": cpu.node,
            }
            for cpu in topology.cpus
        ],
        "placement": plan.make(config or Config(), topology, os.sched_getaffinity(0)).doc(),
    }


def _round(watts: float | None) -> float | None:
    return None if watts is None else round(watts, 3)


def _fmt(value: float | None, digits: int = 1) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def _openvino(report: dict[str, Any] | None) -> str:
    """`2026.4.1: CPU (Intel(R) Xeon(R) Processor: BF16, FP32, INT8; bf16 by default)`"""
    if report is None:
        return "not installed"
    devices = [
        f"{d['name']} ({d['full_name']}: {', '.join(d['capabilities'])}; "
        f"{d['default_precision']} by default)"
        for d in report["devices"]
    ]
    return f"{report['version']}: {', '.join(devices) or 'no devices'}"


def format_table(result: dict[str, Any]) -> str:
    lines = [
        f"platform     {result['platform']}" + (f"  ({result['model']})" if result["model"] else "")
    ]
    lines.append(f"temperature  {_fmt(result['temperature_c'])} °C  (hottest governing sensor)")
    note = result["power_source"] + (", estimated" if result["power_estimated"] else "")
    power = "none" if result["power_w"] is None else f"{result['power_w']:.2f} W"
    lines.append(f"power        {power}  ({note})")
    if "execution_providers" in result:  # added by the command (mcpd.cli.probe)
        providers = result["execution_providers"]
        named = ", ".join(providers) if providers is not None else "no onnxruntime"
        lines.append(f"providers    {named}")
    if "openvino" in result:  # added by the command too
        lines.append(f"openvino     {_openvino(result['openvino'])}")
    if result.get("gpu_warning"):
        lines.append(f"warning      {result['gpu_warning']}")
    lines.append("")
    lines.append(f"{'TEMPERATURE':<28} {'SOURCE':<22} {'°C':>7}  GOVERNS")
    for t in result["temperatures"]:
        lines.append(
            f"{t['name']:<28} {t['source']:<22} {_fmt(t['celsius']):>7}  {'yes' if t['governs'] else ''}"
        )
    if result["powers"]:
        lines.append("")
        lines.append(f"{'POWER':<28} {'SOURCE':<22} {'W':>7}")
        for p in result["powers"]:
            lines.append(f"{p['name']:<28} {p['source']:<22} {_fmt(p['watts'], 2):>7}")
    lines += _cpus_table(result["cpus"], result["placement"])
    if result["domains"]:
        lines.append("")
        lines.append(
            f"{'DOMAIN':<16} {'KIND':<8} {'MIN MHz':>8} {'MAX MHz':>8} {'CAP MHz':>8}  STEPS"
        )
        for d in result["domains"]:
            steps = str(len(d["available_mhz"])) if d["available_mhz"] else "continuous"
            lines.append(
                f"{d['name']:<16} {d['kind']:<8} {d['min_mhz']:>8.1f} {d['max_mhz']:>8.1f} "
                f"{_fmt(d['cap_mhz']):>8}  {steps}"
            )
    return "\n".join(lines)


def _cpus_table(cpus: list[dict[str, Any]], placement: dict[str, Any]) -> list[str]:
    """The CPUs by kind (`4-7  capacity 1024, 2400 MHz, clusters 4-5 6-7`) and the plan."""
    kinds: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for cpu in cpus:
        key = (cpu["capacity"], cpu["max_mhz"], cpu["core_type"], cpu["node"])
        kinds.setdefault(key, []).append(cpu)
    lines = ["", f"{'CPUS':<16} {'CAPACITY':>8} {'MAX MHz':>8} {'TYPE':<5} {'NODE':>4}  CLUSTERS"]
    for (capacity, max_mhz, core_type, node), members in kinds.items():
        clusters = " ".join(sorted({cpu["cluster"] for cpu in members}))
        lines.append(
            f"{format_list(cpu['cpu'] for cpu in members):<16} {_fmt(capacity, 0):>8} "
            f"{_fmt(max_mhz, 0):>8} {core_type or '-':<5} {_fmt(node, 0):>4}  {clusters}"
        )
    lines.append(f"placement    {placement['note']}")
    for name, part in (("governor", placement["governor"]), ("models", placement["models_cpus"])):
        if part["skipped"]:
            lines.append(f"             {name} not placed here: {part['skipped']}")
    return lines
