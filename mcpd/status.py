"""The daemon's status: the typed contract of its JSON document, the document, and one line.

The document is the payload of `GET /v2/mcpd/status` and the body of each MQTT telemetry message;
its keys are a stable interface (README, "Status document"). The TypedDicts below are that
interface, the one place it is written down: the governor builds the document with them, and the
status endpoint, the telemetry encoder and Home Assistant discovery read it through them (mypy
--strict checks every key); the metrics read it key by key, as they must also read the empty one
that stands in before the governor's first (mcpd.serving.metrics). Keys are only ever added. The
line is systemd's STATUS= and the demo's live output.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import Literal, TypedDict

from mcpd import __version__
from mcpd.latency_doc import LatencyDoc, latency_doc
from mcpd.percentiles import DurationSummary
from mcpd.snapshot import CoolingStatus, ModelStats, Snapshot, WriteFailure
from safefs import read_text

GovernorState = Literal[
    "starting",
    "lowering",
    "raising",
    "holding",
    "write-failing",
    "fail-safe",
    "paused",
    "ungoverned",
]
"""What the governor does (README, "The governor and the control loop"): `write-failing` while
the kernel refuses a cap (nothing is lowered then), `fail-safe` while a governing signal is
unknown, `ungoverned` with nothing to govern by or with."""
CoolingState = Literal["off", "learning", "normal", "rising", "degraded"]
"""The cooling's health (README, "Cooling health"): `learning` until the board has a baseline,
`rising` while its thermal resistance is over the warning but not for long enough yet,
`degraded` once it has been for `[cooling] sustained_s`, `off` when `[cooling] enabled` is false."""
ServingState = Literal["stopped", "starting", "ready", "restarting"]
"""The serving process's (mcpd.governor.supervisor): `restarting` while a crash-loop delay is
waited out."""


class WriteFailureDoc(TypedDict):
    error: str
    """The last refusal: the file and the errno, or the cap the kernel kept."""
    since: float
    """Unix time of the first refusal of this episode."""
    wanted_mhz: float
    """The target decided, retried at every decision until it is in force."""


class DomainDoc(TypedDict):
    kind: str
    """cpufreq or devfreq."""
    cap_mhz: float | None
    cur_mhz: float | None
    target_mhz: float
    """The target in force: written and read back."""
    min_mhz: float
    max_mhz: float
    write_failure: WriteFailureDoc | None
    """While the kernel refuses this domain's cap (EBUSY, a cap that reads back higher than
    written): why, since when and what is wanted; None while its caps are written."""


class ThermalDoc(TypedDict):
    headroom: float | None
    seconds_to_throttle: float | None
    """Forecast (mcpd/governor/thermal_forecast.py); None while cooling or not heading for the threshold."""


class CoolingDoc(TypedDict):
    state: CoolingState
    thermal_resistance_c_per_w: float | None
    """From the governing sensor to the air, fitted to the board's own readings (median of the
    last three windows used); None before any."""
    time_constant_s: float | None
    intercept_c: float | None
    """The governing temperature the fit gives at zero measured power: moves with the air."""
    confidence: float | None
    """0 to 1: how well the last windows agree, against the drift that would warn."""
    baseline_c_per_w: float | None
    drift_ratio: float | None
    """thermal_resistance_c_per_w / baseline_c_per_w."""
    since: float | None
    updated: float | None
    windows: int
    rejected: int


class LastActionDoc(TypedDict):
    action: str
    reason: str
    ts: float


class GovernorDoc(TypedDict):
    state: GovernorState
    policy: str
    profile: str
    external_cap_changes: int
    last_action: LastActionDoc | None


class OpenVinoDoc(TypedDict):
    device: str
    """`[models.openvino] device`: CPU, GPU, NPU or AUTO."""
    precision: str
    """The inference precision in force, read back from the compiled model: f32, bf16 or f16."""
    capabilities: list[str]
    """What OpenVINO says the device runs natively (its OPTIMIZATION_CAPABILITIES: FP32, BF16,
    INT8, FP16, …)."""


class ModelDoc(TypedDict):
    ready: bool
    requests: int
    errors: int
    p50_ms: float | None
    p99_ms: float | None
    queue_depth: int
    provider: str | None
    """The execution provider the model runs on (onnxruntime: the session's first), None for a
    backend without providers or a model not loaded."""
    optimized: object
    """What `mcpd optimize` measured for the file that serves, or None."""
    joules_per_inference: float | None
    """Board energy charged to one inference (mcpd/governor/energy.py); estimated with the power."""
    openvino: OpenVinoDoc | None
    """How OpenVINO runs the model; None for another backend or a model not loaded."""
    latency: LatencyDoc | None
    """None where the serving process has not reported them."""


class DaemonDoc(TypedDict):
    pid: int
    """The governor's."""
    cpu_percent: float
    rss_mb: float
    uptime_s: float
    version: str
    scheduling: str


class ExitDoc(TypedDict):
    pid: int | None
    """None when it could not be started."""
    reason: str
    """"signal SIGKILL", "exit code 1", …"""
    ts: float


class ServingDoc(TypedDict):
    pid: int | None
    state: ServingState
    restarts: int
    last_exit: ExitDoc | None
    config_error: str | None
    """Why the serving process does not have the newest configuration (it could not be sent, or
    serving refused it); None when it does."""


class CpusDoc(TypedDict):
    """Where the placement plan puts a process or a thread group (mcpd/placement/plan.py)."""

    cpus: str
    """A CPU list ("4-7"); "" where nothing is placed and the scheduler chooses."""
    skipped: str | None
    """Why it is not applied (CPUs this machine does not have, placement off); None when it is."""


class ModelPlacementDoc(CpusDoc):
    threads: int
    """The model's CPU threads (onnxruntime's intra-op threads, OpenVINO's inference threads);
    0 where the runtime chooses."""
    thread_cpus: list[int]
    """Thread i runs on thread_cpus[i]: the first is the model's worker thread, which runs each
    batch (onnxruntime counts it as one of its intra-op threads)."""
    configured: bool
    """Its CPUs are `[[models]] cpus`, not the plan's."""
    core_type: str | None
    """"core" (P-cores) or "atom" (E-cores) where all its CPUs are of one kind of an Intel hybrid
    part (OpenVINO's SCHEDULING_CORE_TYPE follows it); None elsewhere."""
    smt: bool
    """Two of its threads share a physical core (more threads than cores asked for)."""


class PlacementDoc(TypedDict):
    mode: Literal["auto", "off"]
    """`[daemon] placement`."""
    usable: str
    """The CPUs mcpd may use here (its affinity at start: a cpuset or `taskset` narrows it); what
    is not placed runs on them."""
    ranked_by: str
    """What tells fast CPUs from efficient ones here: "cpu_capacity", "core type", "max
    frequency", or "nothing" (every CPU alike)."""
    governor: CpusDoc
    serving_loop: CpusDoc
    """The serving process's event loop (and the threads it starts but the models')."""
    models_cpus: CpusDoc
    """The CPUs models without `cpus` of their own share out, one thread per physical core."""
    models: dict[str, ModelPlacementDoc]
    note: str
    """The plan in one sentence."""


class LoopDoc(TypedDict):
    sample_lateness: DurationSummary | None
    sample_to_write: DurationSummary | None


class MqttDoc(TypedDict):
    broker: str | None
    """HOST:PORT of the broker the board is connected to (one of `[mqtt] brokers`); None while it
    is not connected."""
    since: float | None
    """Unix time of that connection (its CONNACK); None while not connected."""


class StatusDocument(TypedDict):
    ts: float
    platform: str
    model: str | None
    temperature_c: float | None
    power_w: float | None
    power_estimated: bool
    power_source: str | None
    """"meter", "estimate" (sensors/estimate.py) or None (no power known)."""
    temperatures: dict[str, float | None]
    powers: dict[str, float | None]
    domains: dict[str, DomainDoc]
    thermal: ThermalDoc
    cooling: CoolingDoc
    governor: GovernorDoc
    batch: dict[str, int]
    inference: dict[str, ModelDoc]
    daemon: DaemonDoc
    serving: ServingDoc
    loop: LoopDoc
    mqtt: MqttDoc | None
    """The telemetry's connection; None when `[mqtt] enabled` is false."""
    placement: PlacementDoc


class DaemonStats:
    """The daemon's own CPU and memory use, the CPU since the previous call. From os.times() and
    /proc/self/statm directly: psutil, which read the same two, was 2.7 MB of the governor's
    memory and a quarter of its status refresh (BENCHMARKS.md)."""

    def __init__(self, scheduling: str = "normal") -> None:
        self.scheduling = scheduling
        """How the governor is scheduled (mcpd.governor.realtime)."""
        self._started = time.monotonic()
        self._at, self._cpu_s = self._started, _cpu_s()

    def __call__(self) -> DaemonDoc:
        now, cpu_s = time.monotonic(), _cpu_s()
        elapsed = now - self._at
        cpu = (cpu_s - self._cpu_s) / elapsed * 100 if elapsed > 0 else 0.0
        self._at, self._cpu_s = now, cpu_s
        return {
            "pid": os.getpid(),
            "cpu_percent": round(cpu, 2),
            "rss_mb": round(_rss_bytes() / 2**20, 1),
            "uptime_s": round(time.monotonic() - self._started, 1),
            "version": __version__,
            "scheduling": self.scheduling,
        }


def _provider(stats: ModelStats) -> str | None:
    provider = stats.detail.get("provider")
    return provider if isinstance(provider, str) else None


def _openvino(stats: ModelStats) -> OpenVinoDoc | None:
    detail = stats.detail
    if detail.get("backend") != "openvino":
        return None
    capabilities = detail.get("capabilities")
    return {
        "device": str(detail.get("device")),
        "precision": str(detail.get("precision")),
        "capabilities": [str(c) for c in capabilities] if isinstance(capabilities, list) else [],
    }


def _cpu_s() -> float:
    """User and system CPU time of the whole process (every thread), in seconds."""
    times = os.times()
    return times.user + times.system


def _rss_bytes() -> int:
    """Resident set size: the second field of /proc/self/statm, in pages (proc(5))."""
    return int(read_text("/proc/self/statm").split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _write_failure(failure: WriteFailure | None) -> WriteFailureDoc | None:
    if failure is None:
        return None
    return {
        "error": failure.error,
        "since": round(failure.since, 3),
        "wanted_mhz": round(failure.wanted_mhz, 1),
    }


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def _cooling(cooling: CoolingStatus) -> CoolingDoc:
    return {
        "state": cooling.state,
        "thermal_resistance_c_per_w": _round(cooling.r_c_per_w, 3),
        "time_constant_s": _round(cooling.tau_s, 1),
        "intercept_c": _round(cooling.intercept_c, 2),
        "confidence": _round(cooling.confidence, 3),
        "baseline_c_per_w": _round(cooling.baseline_c_per_w, 3),
        "drift_ratio": _round(cooling.drift_ratio, 3),
        "since": _round(cooling.since, 3),
        "updated": _round(cooling.updated, 3),
        "windows": cooling.windows,
        "rejected": cooling.rejected,
    }


def document(
    snapshot: Snapshot,
    models: Mapping[str, ModelStats],
    daemon: DaemonDoc,
    loop: LoopDoc,
    serving: ServingDoc,
    joules: Mapping[str, float | None] | None = None,
    mqtt: MqttDoc | None = None,
    *,
    placement: PlacementDoc,
) -> StatusDocument:
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
                "write_failure": _write_failure(d.write_failure),
            }
            for d in snapshot.domains
        },
        "thermal": {
            "headroom": _round(snapshot.headroom, 3),
            "seconds_to_throttle": _round(snapshot.seconds_to_throttle, 1),
        },
        "cooling": _cooling(snapshot.cooling),
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
        "inference": inference(models, joules),
        "daemon": daemon,
        "serving": serving,
        "loop": loop,
        "mqtt": mqtt,
        "placement": placement,
    }


def inference(
    models: Mapping[str, ModelStats], joules: Mapping[str, float | None] | None = None
) -> dict[str, ModelDoc]:
    """The document's `inference` part: the governor fills it from the serving process's last
    report and its energy account (mcpd/governor/energy.py), the serving process from its own live
    counters and the governor's energy figures."""
    return {
        name: {
            "ready": stats.ready,
            "requests": stats.requests,
            "errors": stats.errors,
            "p50_ms": _round(stats.p50_ms, 3),
            "p99_ms": _round(stats.p99_ms, 3),
            "queue_depth": stats.queue_depth,
            # the execution provider that runs it (onnxruntime: the first the session took)
            "provider": _provider(stats),
            # precision, speedup, cosine_min, top1_agreement of what serves (`optimize`)
            "optimized": stats.detail.get("optimized"),
            # board energy attributed to this model's inferences (estimated with the power)
            "joules_per_inference": _round((joules or {}).get(name), 4),
            # device, precision in force and the device's capabilities (the openvino backend)
            "openvino": _openvino(stats),
            "latency": latency_doc(stats.latency),
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
    failing = " ".join(d.name for d in snapshot.domains if d.write_failure is not None)
    if not failing:
        parts.append(snapshot.state)
    elif snapshot.state == "write-failing":
        parts.append(f"write-failing: {failing}")
    else:
        parts.append(f"{snapshot.state}, write-failing: {failing}")
    return " | ".join(parts)
