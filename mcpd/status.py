"""The daemon's status as one JSON document and as one line.

The document is the payload of `GET /v2/mcpd/status` and the body of each MQTT telemetry message;
its keys are a stable interface (README, "Status document"). The line is systemd's STATUS= and the
demo's live output.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import Any

import psutil

from mcpd import __version__
from mcpd.state import ModelStats, Snapshot


class DaemonStats:
    """The daemon's own CPU and memory use, measured between calls."""

    def __init__(self, scheduling: str = "normal") -> None:
        self.scheduling = scheduling
        """How the governor is scheduled (mcpd.realtime)."""
        self._process = psutil.Process(os.getpid())
        self._process.cpu_percent(None)
        self._started = time.monotonic()

    def __call__(self) -> dict[str, Any]:
        with self._process.oneshot():
            cpu = self._process.cpu_percent(None)
            rss = self._process.memory_info().rss
        return {
            "pid": self._process.pid,
            "cpu_percent": round(cpu, 2),
            "rss_mb": round(rss / 2**20, 1),
            "uptime_s": round(time.monotonic() - self._started, 1),
            "version": __version__,
            "scheduling": self.scheduling,
        }


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def document(
    snapshot: Snapshot,
    models: Mapping[str, ModelStats],
    daemon: Mapping[str, Any],
    loop: Mapping[str, Any],
    serving: Mapping[str, Any],
    joules: Mapping[str, float | None] | None = None,
) -> dict[str, Any]:
    last = snapshot.last_action
    return {
        "ts": round(snapshot.ts, 3),
        "platform": snapshot.platform,
        "model": snapshot.model,
        "temperature_c": _round(snapshot.temperature_c, 2),
        "power_w": _round(snapshot.power_w, 3),
        "power_estimated": snapshot.power_estimated,
        "power_source": snapshot.power_source,
        "temperatures": {name: _round(c, 2) for name, c in snapshot.temperatures.items()},
        "powers": {name: _round(w, 3) for name, w in snapshot.powers.items()},
        "domains": {
            d.name: {
                "kind": d.kind,
                "cap_mhz": d.cap_mhz,
                "cur_mhz": d.cur_mhz,
                "target_mhz": round(d.target_mhz, 1),
                "min_mhz": d.min_mhz,
                "max_mhz": d.max_mhz,
            }
            for d in snapshot.domains
        },
        "thermal": {
            "headroom": _round(snapshot.headroom, 3),
            "seconds_to_throttle": _round(snapshot.seconds_to_throttle, 1),
        },
        "governor": {
            "state": snapshot.state,
            "policy": snapshot.policy,
            "profile": snapshot.profile,
            "external_cap_changes": snapshot.external_cap_changes,
            "last_action": None
            if last is None
            else {"action": last.action, "reason": last.reason, "ts": round(last.ts, 3)},
        },
        "batch": dict(snapshot.batch),
        "inference": inference(models, joules or {}),
        "daemon": dict(daemon),
        "serving": dict(serving),
        "loop": dict(loop),
    }


def inference(
    models: Mapping[str, ModelStats], joules: Mapping[str, float | None]
) -> dict[str, Any]:
    """The document's `inference` part: the governor fills it from the serving process's last
    report and its energy account (mcpd/energy.py), the serving process from its own live
    counters and the governor's energy figures."""
    return {
        name: {
            "ready": stats.ready,
            "requests": stats.requests,
            "errors": stats.errors,
            "p50_ms": _round(stats.p50_ms, 3),
            "p99_ms": _round(stats.p99_ms, 3),
            "queue_depth": stats.queue_depth,
            # precision, speedup, cosine_min, top1_agreement of what serves (`optimize`)
            "optimized": stats.detail.get("optimized"),
            # board energy attributed to this model's inferences (estimated with the power)
            "joules_per_inference": _round(joules.get(name), 4),
        }
        for name, stats in models.items()
    }


def line(snapshot: Snapshot) -> str:
    """`86.1 °C 13.20 W | policy0 1056 policy4 1056 17000000.gpu 420 MHz | batch demo 5 | lowering`"""
    temp = "temp n/a" if snapshot.temperature_c is None else f"{snapshot.temperature_c:.1f} °C"
    if not snapshot.metered:
        power = "no meter"
    else:
        power = "power n/a" if snapshot.power_w is None else f"{snapshot.power_w:.2f} W"
        if snapshot.power_source == "estimate":
            power += " est."
    caps = " ".join(
        f"{d.name} {d.cap_mhz:.0f}" if d.cap_mhz is not None else f"{d.name} n/a"
        for d in snapshot.domains
    )
    parts = [f"{temp} {power}", f"{caps} MHz" if caps else "no domains"]
    if snapshot.batch:
        parts.append("batch " + " ".join(f"{name} {size}" for name, size in snapshot.batch.items()))
    parts.append(snapshot.state)
    return " | ".join(parts)
