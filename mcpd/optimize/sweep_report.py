"""`mcpd bench`'s output: the table (or one JSON document) of every point with its Pareto mark, the
CPU flags that decide what each precision costs, what was not applicable and why, and the plot."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mcpd.optimize.interface import OptimizeError
from mcpd.optimize.pareto import Point
from mcpd.optimize.runners import CPU_FLAGS, NotApplicable

if TYPE_CHECKING:  # sweep imports this module
    from mcpd.optimize.sweep import Measurement


def render(
    results: Sequence[Measurement],
    optimal: Sequence[Point],
    skipped: Sequence[NotApplicable],
    cpu_flags: Sequence[str],
    as_json: bool,
) -> str:
    on_frontier = {p.label for p in optimal}
    if as_json:
        doc: dict[str, Any] = {
            "cpu_flags": list(cpu_flags),
            "points": [{**asdict(m), "pareto": m.point.label in on_frontier} for m in results],
            "frontier": [asdict(p) for p in optimal],
            "not_applicable": [asdict(s) for s in skipped],
        }
        return json.dumps(doc, indent=2)
    lines = [
        f"cpu flags: {' '.join(cpu_flags) or 'none of ' + ' '.join(CPU_FLAGS)}",
        f"{'model':<24} {'runtime':<11} {'prec':<4} {'batch':>5} {'threads':>7} {'streams':>7} "
        f"{'caps':>5} {'items/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'W':>7} {'mJ/item':>8}  pareto",
    ]
    for m in results:
        mark = "*" if m.point.label in on_frontier else ""
        held = "-" if m.cap_fraction is None else f"{m.cap_fraction:g}"
        watts = "-" if m.watts is None else f"{m.watts:.2f}" + ("~" if m.power_estimated else "")
        energy = "-" if m.joules_per_item is None else f"{m.joules_per_item * 1000:.2f}"
        lines.append(
            f"{m.model:<24} {m.runtime:<11} {m.precision or '-':<4} {m.batch:>5} {m.threads:>7} "
            f"{m.streams:>7} {held:>5} {m.throughput:>9.1f} {m.p50_ms:>8.2f} {m.p99_ms:>8.2f} "
            f"{watts:>7} {energy:>8}  {mark}"
        )
    lines += [f"{s.runtime} {s.precision}: not applicable: {s.reason}" for s in skipped]
    return "\n".join(lines)


def plot(results: Sequence[Measurement], optimal: Sequence[Point], target: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise OptimizeError("--plot needs matplotlib: pip install matplotlib") from None
    figure, axes = plt.subplots(figsize=(7, 4.5))
    for series in dict.fromkeys(_series(m) for m in results):
        mine = [m for m in results if _series(m) == series]
        axes.scatter([m.p50_ms for m in mine], [m.throughput for m in mine], label=series)
    axes.plot(
        [p.latency_ms for p in optimal],
        [p.throughput for p in optimal],
        "k--",
        label="Pareto frontier",
    )
    axes.set_xlabel("latency p50 per batch (ms)")
    axes.set_ylabel("throughput (items/s)")
    axes.legend()
    figure.tight_layout()
    figure.savefig(target, dpi=120)
    plt.close(figure)


def _series(m: Measurement) -> str:
    """One colour per model file, runtime and precision."""
    return " ".join(part for part in (m.model, m.runtime, m.precision) if part)
