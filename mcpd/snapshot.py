"""What the daemon knows at one moment, as immutable values shared between threads.

The control loop publishes a new `Snapshot` after every decision (a reference swap, so readers on
other threads never see a half-updated one); the inference server and the telemetry publisher read
the newest one. `ModelStats` come from the inference server.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class DomainStatus:
    name: str
    kind: str
    cap_mhz: float | None
    """The cap in force (read back from sysfs)."""
    cur_mhz: float | None
    target_mhz: float
    """The governor's continuous target; the cap is this snapped to the frequency table."""
    min_mhz: float
    max_mhz: float
    """The range the governor moves this domain in (config ∩ hardware)."""


@dataclass(frozen=True)
class LastAction:
    action: str
    reason: str
    ts: float


@dataclass(frozen=True)
class Snapshot:
    ts: float
    """Unix time of the newest sample."""
    platform: str
    model: str | None
    temperature_c: float | None
    power_w: float | None
    power_estimated: bool
    metered: bool
    """False where the board has no power meter (power_w is then always None)."""
    temperatures: Mapping[str, float | None]
    powers: Mapping[str, float | None]
    domains: tuple[DomainStatus, ...]
    state: str
    """starting, lowering, raising, holding, fail-safe or paused."""
    profile: str
    """The governor profile in force ("default": the [governor] values)."""
    last_action: LastAction | None
    batch: Mapping[str, int]
    """Current batch size per model, set by the governor."""
    headroom: float | None = None
    """1.0 at the throttle threshold, 0.0 thirty degrees below (mcpd/governor/thermal_forecast.py)."""
    seconds_to_throttle: float | None = None
    """Forecast time until the governing temperature reaches the threshold; None when cooling or
    not heading there (mcpd/governor/thermal_forecast.py). Filled in when the status document is
    made, off the control loop's thread."""
    external_cap_changes: int = 0
    """Caps found changed by another program since start (mcpd followed them)."""
    policy: str = "hysteresis"
    power_source: str | None = None
    energy_j: float | None = None
    """Board energy since the loop started (the governing power integrated); None without power."""
    """"meter", "estimate" (sensors/estimate.py) or None (no power known)."""


@dataclass(frozen=True)
class ModelStats:
    ready: bool
    requests: int = 0
    errors: int = 0
    p50_ms: float | None = None
    p99_ms: float | None = None
    queue_depth: int = 0
    detail: Mapping[str, object] = field(default_factory=dict)
