"""What the daemon knows at one moment, as immutable values shared between threads.

The control loop publishes a new `Snapshot` after every decision (a reference swap, so readers on
other threads never see a half-updated one); the inference server and the telemetry publisher read
the newest one. `ModelStats` come from the inference server; their `statistics` (Triton's counts,
mcpd.serving.statistics) stay in the serving process, their `latency` histograms go on to the
governor, the status document and telemetry (mcpd.ipc).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # mcpd.status imports this module
    from mcpd.status import CoolingState, GovernorState


@dataclass(frozen=True)
class WriteFailure:
    """A cap the kernel does not take: the governor's decision for the domain is not in force."""

    error: str
    """The last refusal, naming the file and the errno (or the value the kernel kept)."""
    since: float
    """Unix time of the first refusal of this episode."""
    wanted_mhz: float
    """The target decided and retried at every decision until it is written and read back."""


@dataclass(frozen=True)
class DomainStatus:
    name: str
    kind: str
    cap_mhz: float | None
    """The cap in force (read back from sysfs)."""
    cur_mhz: float | None
    target_mhz: float
    """The governor's continuous target in force (written and read back); the cap is this
    snapped to the frequency table."""
    min_mhz: float
    max_mhz: float
    """The range the governor moves this domain in (config ∩ hardware)."""
    write_failure: WriteFailure | None = None


@dataclass(frozen=True)
class LastAction:
    action: str
    reason: str
    ts: float


@dataclass(frozen=True)
class CoolingStatus:
    """The cooling's health as the status path last found it (mcpd/governor/cooling.py)."""

    state: CoolingState = "off"
    r_c_per_w: float | None = None
    """The board's thermal resistance to ambient now (the median of the last windows), K/W."""
    tau_s: float | None = None
    intercept_c: float | None = None
    confidence: float | None = None
    baseline_c_per_w: float | None = None
    drift_ratio: float | None = None
    since: float | None = None
    """Unix time the resistance went over the warning (rising, or the run that made it degraded)."""
    updated: float | None = None
    """Unix time of the end of the newest window used."""
    windows: int = 0
    rejected: int = 0
    """Windows used and not used (mcpd.governor.cooling_fit.assess) since the daemon started."""


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
    state: GovernorState
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
    cooling: CoolingStatus = CoolingStatus()
    """Filled in when the status document is made, off the control loop's thread."""


LATENCY_BUCKETS_S = tuple(0.0001 * 2**k for k in range(14))
"""Upper bounds of the latency histograms: 100 µs, 200 µs … 819.2 ms, doubling (then +Inf): a
1 ms model's requests and a 500 ms one's each spread over several buckets."""


@dataclass(frozen=True)
class Duration:
    """Triton's $duration_stat: how many times, and their total in nanoseconds."""

    count: int = 0
    ns: int = 0


@dataclass(frozen=True)
class BatchStats:
    """Triton's $batch_stat: the runs of one batch size (each duration's count is the runs)."""

    batch_size: int
    compute_input: Duration
    compute_infer: Duration
    compute_output: Duration


@dataclass(frozen=True)
class Histogram:
    """A cumulative histogram as Prometheus exposes one: `buckets[i]` counts the observations
    <= LATENCY_BUCKETS_S[i], the last one all of them (+Inf)."""

    buckets: tuple[int, ...] = (0,) * (len(LATENCY_BUCKETS_S) + 1)
    sum_s: float = 0.0

    @property
    def count(self) -> int:
        return self.buckets[-1]


@dataclass(frozen=True)
class Statistics:
    """One model's statistics since it was first configured, as Triton's statistics extension
    counts them (docs/serving-protocol.md §8.3); warm-up runs at load are not counted.

    - inference_count: batch rows run (a request of batch 8 counts 8); execution_count: batches
      run (requests the batcher put together count once). Both only for batches that succeeded.
    - last_inference_ms: Unix time, ms, of the last successful request (0: none yet).
    - success / fail: requests answered / failed (any error after the model was found ready,
      a bad request included), with their time from arrival to the response.
    - queue: successful requests' time from entering the model's queue to their batch being taken.
    - compute_input: joining the batch's inputs; compute_infer: running the model (padding a fixed
      batch included); compute_output: splitting its outputs among the requests. Per successful
      request each is its batch's time, as Triton reports a batch's compute for every request in
      it; `batches` has them per batch size and run.
    - request_latency / queue_latency / compute_latency: histograms of the successful requests'
      success, queue and compute (input + infer + output) times, for Prometheus.
    """

    inference_count: int = 0
    execution_count: int = 0
    last_inference_ms: int = 0
    success: Duration = Duration()
    fail: Duration = Duration()
    queue: Duration = Duration()
    compute_input: Duration = Duration()
    compute_infer: Duration = Duration()
    compute_output: Duration = Duration()
    batches: tuple[BatchStats, ...] = ()
    """Ordered by batch size."""
    request_latency: Histogram = Histogram()
    queue_latency: Histogram = Histogram()
    compute_latency: Histogram = Histogram()

    @property
    def latency(self) -> dict[str, Histogram]:
        """The histograms by phase, as ModelStats.latency holds them."""
        return {
            "request": self.request_latency,
            "queue": self.queue_latency,
            "compute": self.compute_latency,
        }


@dataclass(frozen=True)
class ModelStats:
    ready: bool
    requests: int = 0
    """Requests answered, errors included (statistics' success + fail)."""
    errors: int = 0
    p50_ms: float | None = None
    p99_ms: float | None = None
    queue_depth: int = 0
    detail: Mapping[str, object] = field(default_factory=dict)
    statistics: Statistics | None = None
    """The serving process's own; not sent to the governor (mcpd.serving.process)."""
    latency: Mapping[str, Histogram] = field(default_factory=dict)
    """The latency histograms by phase (mcpd.families.LATENCIES): request, queue and compute in
    the serving process; request and compute (mcpd.status.LatencyDoc: what the fleet dashboard
    reads) where they crossed to the governor and into the status document and telemetry."""
