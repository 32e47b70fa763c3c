"""Status documents as the daemon makes them (mcpd.status.document), for a board that changes.

Used by the MQTT tests and the fleet benchmark in place of a running control loop: the telemetry
publisher sees exactly the document shape the daemon gives it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from mcpd import config, status
from mcpd.placement import plan
from mcpd.serving.statistics import Recorder, Timing
from mcpd.snapshot import CoolingStatus, DomainStatus, LastAction, ModelStats, Snapshot
from sensors.topology import Cpu, CpuTopology

DOMAINS = (("policy0", "cpufreq", 1510.4), ("17000000.gpu", "devfreq", 624.75))


def placement() -> status.PlacementDoc:
    """The plan for the demo model on six CPUs with nothing to tell them apart (an Orin Nano)."""
    cpus = tuple(Cpu(n, 1024, 1510400, frozenset({n}), frozenset({n}), None, 0) for n in range(6))
    demo = config.parse({"models": [{"name": "demo", "path": "demo.onnx"}]})
    return plan.make(demo, CpuTopology(cpus, frozenset(range(6))), range(6)).doc()


class FakeBoard:
    """A Jetson-like board whose temperature, caps, request count and latency histograms (a real
    recorder's, as the serving process keeps them) move with every call."""

    def __init__(self, base_c: float = 60.0, clock: Callable[[], float] = time.time) -> None:
        self.base_c = base_c
        self.clock = clock
        self.calls = 0
        self.requests = 0
        self.recorder = Recorder(wall=clock)
        """The demo model's statistics, as the serving process records them."""
        self.fail = False
        self._lock = threading.Lock()

    def __call__(self) -> status.StatusDocument:
        with self._lock:
            if self.fail:
                raise RuntimeError("status unavailable")
            self.calls += 1
            self.requests += 25
            for k in range(25):  # 1 to 8 ms, a fifth of it queued: over several buckets
                compute_ns = 800_000 * (1 + k % 8)
                queue_ns = compute_ns // 4
                self.recorder.succeeded(queue_ns + compute_ns, Timing(queue_ns, 0, compute_ns, 0))
            calls, requests = self.calls, self.requests
            latency = self.recorder.snapshot().latency
        celsius = self.base_c + (calls % 10)
        cap = 0.8 if calls % 2 else 1.0
        # Past its first four windows, the baseline learned; its state goes round, so that a
        # fleet's last messages have boards in more than one (the dashboard counts each).
        cooling_state, drift = (("normal", 1.017), ("rising", 1.27), ("degraded", 1.312))[calls % 3]
        cooling = CoolingStatus(
            cooling_state,
            r_c_per_w=round(6.41 * drift, 2),
            tau_s=41.0,
            intercept_c=0.4,
            confidence=0.93,
            baseline_c_per_w=6.41,
            drift_ratio=drift,
            since=None if cooling_state == "normal" else self.clock() - 9000,
            updated=self.clock() - 600,
            windows=5,
            rejected=1,
        )
        snapshot = Snapshot(
            ts=self.clock(),
            platform="jetson-orin",
            model="NVIDIA Jetson Orin Nano Developer Kit",
            temperature_c=celsius,
            power_w=7.5,
            power_estimated=False,
            metered=True,
            temperatures={"cpu-thermal": celsius, "gpu-thermal": celsius - 2, "tj-thermal": None},
            powers={"VDD_IN": 7.5, "VDD_CPU_GPU_CV": 3.25},
            domains=tuple(
                DomainStatus(name, kind, top * cap, top * cap, top * cap, 115.2, top)
                for name, kind, top in DOMAINS
            ),
            state="lowering" if cap < 1 else "holding",
            profile="default",
            last_action=LastAction("lower", f"{celsius:.1f} °C ≥ 85.0 °C", self.clock()),
            batch={"demo": 4},
            cooling=cooling,
        )
        models = {"demo": ModelStats(True, requests, 1, 3.2, 9.8, 2, latency=latency)}
        daemon: status.DaemonDoc = {
            "pid": 4241,
            "cpu_percent": 3.5,
            "rss_mb": 61.2,
            "uptime_s": 12.0,
            "version": "0.1.0",
            "scheduling": "normal",
        }
        loop: status.LoopDoc = {"sample_lateness": None, "sample_to_write": None}
        serving: status.ServingDoc = {
            "pid": 4242,
            "state": "ready",
            "restarts": 0,
            "last_exit": None,
            "config_error": None,
        }
        return status.document(snapshot, models, daemon, loop, serving, placement=placement())
