"""Thermal headroom and time to throttle for applications. Pure arithmetic on readings and times
given to it: no sensors, no clock.

Headroom is 1.0 at the throttle threshold (`[governor] temp_high_c`), 0.0 thirty degrees below
it, linear in between and beyond it: Android's normalization of thermal headroom
(docs/thermal-headroom.md), so an application written against getThermalHeadroom reads mcpd's
the same way.

Time to throttle comes from a thermal model fitted to the board's own recent history: a package
is a fast mass (the die, seconds) over a slow one (the heatsink, minutes), both heated by the
power the board draws, so in 1 s steps the governing temperature follows the second-order model
T[k+1] = a1·T[k] + a2·T[k−1] + b0·P[k+1] + b1·P[k] + b2·P[k−1] + c (two time constants: the
roots of z² − a1·z − a2; the ambient and thermal resistances in the b and c; P[k+1] because a
second's mean temperature already feels that second's power). Its six coefficients are a
linear least-squares fit over the last `HISTORY_S` of 1 s means; the power is the governing
power (meter or estimate), so every change of load or caps in that history teaches the model
rather than breaking it. The forecast runs the model forward with the power held where it is now
and says when it reaches the threshold: 0 at or above it, None while the board cools, for the
two seconds after a step in power (the newest means straddle it), when the model levels off below the threshold within `HORIZON_S`, or when the fit is not a stable
two-mass system (too little history or no change in it yet). The power is held where it is, plus
what it has grown per kelvin since the last step (leakage: the same load draws more when hot,
and near the threshold that decides whether the board gets there at all). Without any power
reading the model has no power terms: it then assumes the power does not change.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

HEADROOM_WINDOW_C = 30.0

HISTORY_S = 300
"""Seconds of 1 s means the model is fitted on."""
MIN_HISTORY_S = 30
HORIZON_S = 1800
REFRESH_S = 1.0
RIDGE = 1e-6
POWER_STEP = 0.1
"""No forecast while the last two seconds' power differs by more than this fraction."""
LEAKAGE_MIN_S = 10
LEAKAGE_MIN_RISE_C = 3.0
LEAKAGE_MAX = 0.01
"""At most 1 % of the power per kelvin (silicon leakage roughly doubles every 20-30 K, on a
share of the power that is rarely more than a third)."""


def headroom(temp_c: float | None, threshold_c: float) -> float | None:
    if temp_c is None:
        return None
    return 1.0 - (threshold_c - temp_c) / HEADROOM_WINDOW_C


def solve(matrix: list[list[float]], vector: list[float]) -> list[float] | None:
    """Gaussian elimination with partial pivoting; None for a singular system."""
    n = len(vector)
    rows = [[*matrix[i], vector[i]] for i in range(n)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(rows[r][col]))
        if abs(rows[pivot][col]) < 1e-12:
            return None
        rows[col], rows[pivot] = rows[pivot], rows[col]
        for r in range(col + 1, n):
            factor = rows[r][col] / rows[col][col]
            rows[r] = [a - factor * b for a, b in zip(rows[r], rows[col], strict=True)]
    x = [0.0] * n
    for r in reversed(range(n)):
        x[r] = (rows[r][n] - sum(rows[r][c] * x[c] for c in range(r + 1, n))) / rows[r][r]
    return x


def fit(temps: Sequence[float], powers: Sequence[float] | None) -> list[float] | None:
    """(a1, a2, c) or (a1, a2, b0, b1, b2, c) by least squares over 1 s means."""
    rows, targets = [], []
    for k in range(1, len(temps) - 1):
        power = [] if powers is None else [powers[k + 1], powers[k], powers[k - 1]]
        rows.append([temps[k], temps[k - 1], *power, 1.0])
        targets.append(temps[k + 1])
    if not rows:
        return None
    n = len(rows[0])
    matrix = [[sum(r[i] * r[j] for r in rows) for j in range(n)] for i in range(n)]
    for i in range(n):
        matrix[i][i] += RIDGE * len(rows)  # near-collinear columns (a board at rest) stay solvable
    vector = [sum(r[i] * y for r, y in zip(rows, targets, strict=True)) for i in range(n)]
    return solve(matrix, vector)


def stable(a1: float, a2: float) -> bool:
    """Both roots of z² − a1·z − a2 real, in (0, 1): two masses relaxing, nothing oscillating."""
    discriminant = a1 * a1 + 4 * a2
    if discriminant < 0:
        return False
    roots = ((a1 - math.sqrt(discriminant)) / 2, (a1 + math.sqrt(discriminant)) / 2)
    return all(0.0 < root < 1.0 for root in roots)


def leakage(temps: Sequence[float], powers: Sequence[float]) -> float:
    """W/K by which the power has grown with the temperature since the last step in power (a
    board's leakage: the same load and clocks draw more when hot); 0 without a clear rise."""
    start = len(powers) - 1
    while start > 0 and abs(powers[start] - powers[start - 1]) <= POWER_STEP * abs(
        powers[start - 1]
    ):
        start -= 1
    t, p = temps[start:], powers[start:]
    if len(t) < LEAKAGE_MIN_S or max(t) - min(t) < LEAKAGE_MIN_RISE_C:
        return 0.0
    t_mean, p_mean = sum(t) / len(t), sum(p) / len(p)
    slope = sum((x - t_mean) * (y - p_mean) for x, y in zip(t, p, strict=True)) / sum(
        (x - t_mean) ** 2 for x in t
    )
    return min(max(slope, 0.0), LEAKAGE_MAX * p_mean)


def seconds_to_threshold(
    temps: Sequence[float], powers: Sequence[float] | None, threshold_c: float
) -> float | None:
    """The forecast from 1 s means (oldest first); see the module's docstring."""
    if len(temps) < MIN_HISTORY_S:
        return None
    if temps[-1] >= threshold_c:
        return 0.0
    if powers is not None and abs(powers[-1] - powers[-2]) > POWER_STEP * abs(powers[-2]):
        return None  # the power is stepping: the newest means straddle it
    coefficients = fit(temps, powers)
    if coefficients is None or not stable(coefficients[0], coefficients[1]):
        return None
    a1, a2, *rest = coefficients
    gain = 0.0 if powers is None else sum(rest[:3])
    power = 0.0 if powers is None else powers[-1]
    growth = 0.0 if powers is None else leakage(temps, powers)
    previous, current = temps[-2], temps[-1]
    for step in range(1, HORIZON_S + 1):
        drive = rest[-1] + gain * (power + growth * (current - temps[-1]))
        following = a1 * current + a2 * previous + drive
        if step == 1 and following <= current:
            return None  # cooling
        if following >= threshold_c:
            return step - 1 + (threshold_c - current) / (following - current)
        previous, current = current, following
    return None


def means(samples: Sequence[tuple[float, float]], last: float) -> list[float | None]:
    """Per-second means of (time, value) samples over the `HISTORY_S` seconds ending at `last`;
    None for a second without a sample."""
    sums = [0.0] * HISTORY_S
    counts = [0] * HISTORY_S
    for t, value in samples:
        slot = HISTORY_S - 1 - int(last - t)
        if 0 <= slot < HISTORY_S:
            sums[slot] += value
            counts[slot] += 1
    return [total / count if count else None for total, count in zip(sums, counts, strict=True)]


class ThrottleForecast:
    """The governing temperature and power of the last `HISTORY_S` (appended by the control loop),
    and the forecast made from them (asked for by the status path, on its own threads: a few
    milliseconds of fitting stay off the loop's), refreshed at most once a second."""

    def __init__(self) -> None:
        self.temps: list[tuple[float, float]] = []
        self.powers: list[tuple[float, float]] = []
        self._made: tuple[float, float | None] | None = None

    def add(self, t: float, temp_c: float) -> None:
        self._append(self.temps, t, temp_c)

    def add_power(self, t: float, watts: float) -> None:
        self._append(self.powers, t, watts)

    @staticmethod
    def _append(samples: list[tuple[float, float]], t: float, value: float) -> None:
        samples.append((t, value))
        while t - samples[0][0] > HISTORY_S:
            samples.pop(0)

    def seconds_to(self, threshold_c: float, now: float) -> float | None:
        if self._made is not None and now - self._made[0] < REFRESH_S - 1e-6:
            return self._made[1]
        forecast = self._forecast(threshold_c, now)
        self._made = (now, forecast)
        return forecast

    def _forecast(self, threshold_c: float, now: float) -> float | None:
        temps = means(list(self.temps), now)  # copies: the loop's thread appends meanwhile
        # The model needs an unbroken run of seconds with a temperature: keep the newest one.
        start = len(temps)
        while start > 0 and temps[start - 1] is not None:
            start -= 1
        run = [t for t in temps[start:] if t is not None]
        if not self.powers:
            return seconds_to_threshold(run, None, threshold_c)
        # A second without a power reading holds the one before (a meter's gap, not a change).
        powers: list[float] = []
        for watts in means(list(self.powers), now):
            powers.append(watts if watts is not None else powers[-1] if powers else math.nan)
        held = powers[start:]
        if any(math.isnan(w) for w in held):
            return None
        return seconds_to_threshold(run, held, threshold_c)
