"""Energy per inference per model: board energy attributed to the inferences run while it was
spent. Pure: energies, times and counts in, joules out; no clock, no sensors.

The control loop integrates the governing power (meter or estimate) into the board's energy
since start (`BoardEnergy`, `Snapshot.energy_j`); the serving process reports each model's request count about
once a second. Between two reports in which requests were counted, the board energy spent in
that interval is split among the models that served in it, in proportion to the time their
inferences took (requests × median latency, the best measure of busy time the report carries),
and every joule of the board is charged, static power included: this is what an inference costs
the board, not its marginal cost. Intervals without any request charge nobody (an idle board is
not an inference's cost): after `IDLE_S` without a new count the interval starts afresh. The
figures are moving sums over about `WINDOW_S`, so they follow changes of clocks and load.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

WINDOW_S = 60.0
IDLE_S = 2.0


@dataclass(frozen=True)
class Served:
    """A model's count as reported: requests since the serving process started, and the median
    latency of the last report (None before any)."""

    requests: int
    p50_ms: float | None


class BoardEnergy:
    """The board's energy since start: each power reading held until the next, a gap (a silent
    meter) counted for at most `max_gap_s`."""

    def __init__(self) -> None:
        self.joules: float | None = None
        self._last_t: float | None = None

    def add(self, watts: float, t: float, max_gap_s: float) -> None:
        if self._last_t is None or self.joules is None:
            self.joules = 0.0
        else:
            self.joules += watts * min(max(t - self._last_t, 0.0), max_gap_s)
        self._last_t = t


class EnergyAccount:
    def __init__(self) -> None:
        self._mark: tuple[float, float] | None = None
        """(board energy J, time s) where the current interval began."""
        self._counts: dict[str, int] = {}
        self._joules: dict[str, float] = {}
        self._inferences: dict[str, float] = {}

    def update(self, energy_j: float | None, ts: float, served: Mapping[str, Served]) -> None:
        counts = {name: s.requests for name, s in served.items()}
        if energy_j is None:
            self._mark, self._counts = None, counts
            return
        if self._mark is None or counts == self._counts:
            if self._mark is None or ts - self._mark[1] > IDLE_S:
                self._mark = (energy_j, ts)
            self._counts = counts
            return
        spent = max(energy_j - self._mark[0], 0.0)
        decay = math.exp(-max(ts - self._mark[1], 0.0) / WINDOW_S)
        # A count that went backwards is a restarted serving process: nothing known to charge.
        new = {
            name: count - self._counts.get(name, 0)
            for name, count in counts.items()
            if count >= self._counts.get(name, 0)
        }
        weights = {name: n * (served[name].p50_ms or 1.0) for name, n in new.items() if n > 0}
        total = sum(weights.values())
        for name in set(self._joules) | set(weights):
            share = spent * weights[name] / total if name in weights else 0.0
            self._joules[name] = self._joules.get(name, 0.0) * decay + share
            self._inferences[name] = self._inferences.get(name, 0.0) * decay + new.get(name, 0)
        self._mark, self._counts = (energy_j, ts), counts

    def joules_per_inference(self) -> dict[str, float | None]:
        return {
            name: self._joules[name] / n if n > 1e-9 else None
            for name, n in self._inferences.items()
        }
