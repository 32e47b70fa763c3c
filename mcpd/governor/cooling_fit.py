"""The board's thermal resistance to ambient and its time constant, fitted to one window of its own
readings. Pure arithmetic on the readings given to it: no sensors, no clock.

A package is a fast mass (the die, seconds) over a slow one (the heatsink, minutes), both heated by
the power the board draws (docs/cooling-health.md). Its governing temperature is then

    T(t) = T0 + r_fast·F_fast(P)(t) + r_slow·F_slow(P)(t) + c_fast·e^(−t/τ_fast) + c_slow·e^(−t/τ_slow)

where F_τ(P) is the power through a first-order lag of time constant τ (each mass heated through
its share of the resistance), the exponentials are where the masses stood when the window began,
and T0 is the temperature the board would have at zero power as the meter counts it: the ambient,
less R times the power the meter counts that does not heat the sensor (the rest of the board). The
board's thermal resistance to ambient is R = r_fast + r_slow, its time constant τ_slow.

For given time constants the model is linear in T0, the two resistances and the two starting
offsets, so they are a least-squares fit; the time constants are searched on a grid (and the best
pair refined), keeping the pair whose fit leaves the smallest residual. This is an output-error fit:
the model is run on the power alone and compared with the temperature, so noise on the sensor
does not bias it as it biases a regression on the temperature's own past (whose gain,
Σb / (1 − Σa), divides by a number near 0 at sampling steps much shorter than the time constant).
The readings are means over `STEP_S` and the lag is solved exactly for each step's mean with the
power held at the step's mean, so the fast mass (a few seconds) need not be slower than a step.

A window's fit is used only where it is well conditioned (`assess`):

- the power changed enough: the standard deviation of its step means is at least
  `MIN_POWER_SPREAD` of their mean (a board at one steady load tells its temperature, not how the
  temperature depends on the power: the slope and the intercept cannot be told apart);
- it was steady enough: the model follows the readings within `MAX_RMS_C` (a room that warmed, a
  fan that stopped or a cooling device that switched during the window breaks the one-model
  window: it is left out, not averaged in);
- R is positive, known to within `MAX_R_STDERR` of itself, and the slow time constant is below
  the longest tried (a window a few times longer than the board's time constant).
"""

from __future__ import annotations

import math
import operator
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from mcpd.governor.thermal_forecast import solve

STEP_S = 5.0
"""Seconds of readings behind each mean the model is fitted on."""
GRID_RATIO = 1.5
FAST_TAUS_S = tuple(1.0 * GRID_RATIO**i for i in range(11))
"""The die's time constants tried first: 1 s to 58 s."""
SLOW_TAUS_S = tuple(15.0 * GRID_RATIO**i for i in range(10))
"""The heatsink's: 15 s to 577 s (a window must be a few times longer than the slowest)."""
SLOW_OVER_FAST = 3.0
"""The slow mass is at least this much slower than the fast one (else they are one mass)."""
REFINEMENTS = 4
"""Each halves the grid's step (in log τ) around the best pair: 1.5 → 1.22 → 1.11 → 1.05 → 1.03."""
MIN_POWER_SPREAD = 0.05
MAX_RMS_C = 1.0
MAX_R_STDERR = 0.02


@dataclass(frozen=True)
class WindowFit:
    r_c_per_w: float
    """Thermal resistance from the governing sensor to ambient, K/W (°C per watt)."""
    tau_s: float
    """The slow time constant: how long the board takes to settle to ambient + R·P."""
    fast_tau_s: float
    intercept_c: float
    """T0: the governing temperature the model gives at zero power, in this window's air."""
    rms_c: float
    """The residual: how far the model stays from the readings, °C."""
    r_stderr: float
    """The standard error of R from the least-squares fit (residuals taken as independent)."""


def _dot(a: Sequence[float], b: Sequence[float]) -> float:
    return float(sum(map(operator.mul, a, b)))


class _Lagged:
    """The power through one first-order lag, as means per step, and the decay of a starting
    offset (its mean per step, up to a factor); with their products with themselves and with
    the readings, which every pair this lag is in shares."""

    def __init__(
        self, temps: Sequence[float], powers: Sequence[float], tau_s: float, step_s: float
    ) -> None:
        alpha = math.exp(-step_s / tau_s)
        spread = tau_s / step_s * (1.0 - alpha)  # the mean over a step of e^(−t/τ) from its start
        state = powers[0]  # the mass as if settled at the first step's power; the decay the rest
        means, decay, left = [], [], 1.0
        for watts in powers:
            means.append(watts + (state - watts) * spread)
            decay.append(left)
            state = alpha * state + (1.0 - alpha) * watts
            left *= alpha
        self.means, self.decay = means, decay
        self.sums = (_dot([1.0] * len(means), means), _dot([1.0] * len(decay), decay))
        self.means_means, self.means_decay = _dot(means, means), _dot(means, decay)
        self.decay_decay = _dot(decay, decay)
        self.moments = (_dot(means, temps), _dot(decay, temps))


class _Problem:
    """The least-squares problem over one window, with the products each pair of lags shares."""

    def __init__(self, temps: Sequence[float], powers: Sequence[float], step_s: float) -> None:
        self.temps = temps
        self.powers = powers
        self.step_s = step_s
        self.n = len(temps)
        self.t_sum = sum(temps)
        self.t_dot = _dot(temps, temps)
        self._lags: dict[float, _Lagged] = {}

    def lag(self, tau_s: float) -> _Lagged:
        if tau_s not in self._lags:
            self._lags[tau_s] = _Lagged(self.temps, self.powers, tau_s, self.step_s)
        return self._lags[tau_s]

    def fit(
        self, fast_tau_s: float, slow_tau_s: float
    ) -> tuple[float, list[float], list[list[float]]] | None:
        """(residual sum of squares, coefficients, normal matrix), or None when singular. The
        columns are 1, the fast lag's means, the slow one's, the fast decay, the slow one."""
        fast, slow = self.lag(fast_tau_s), self.lag(slow_tau_s)
        means_means = _dot(fast.means, slow.means)
        means_decay = _dot(fast.means, slow.decay)
        decay_means = _dot(fast.decay, slow.means)
        decay_decay = _dot(fast.decay, slow.decay)
        normal = [
            [float(self.n), fast.sums[0], slow.sums[0], fast.sums[1], slow.sums[1]],
            [fast.sums[0], fast.means_means, means_means, fast.means_decay, means_decay],
            [slow.sums[0], means_means, slow.means_means, decay_means, slow.means_decay],
            [fast.sums[1], fast.means_decay, decay_means, fast.decay_decay, decay_decay],
            [slow.sums[1], means_decay, slow.means_decay, decay_decay, slow.decay_decay],
        ]
        moments = [self.t_sum, fast.moments[0], slow.moments[0], fast.moments[1], slow.moments[1]]
        coefficients = solve(normal, moments)
        if coefficients is None:
            return None
        residual = self.t_dot - _dot(coefficients, moments)
        return max(residual, 0.0), coefficients, normal


def fit(
    temps: Sequence[float], powers: Sequence[float], step_s: float = STEP_S
) -> WindowFit | None:
    """The model fitted to the means of one window (oldest first); None when no pair of time
    constants gives a solvable fit."""
    problem = _Problem(temps, powers, step_s)
    candidates = [
        (fast, slow)
        for fast in FAST_TAUS_S
        for slow in SLOW_TAUS_S
        if slow >= SLOW_OVER_FAST * fast
    ]
    best = _best(problem, candidates)
    if best is None:
        return None
    ratio = GRID_RATIO
    for _ in range(REFINEMENTS):
        ratio **= 0.5
        fast, slow = best[0]
        around = [
            (fast * ratio**i, slow * ratio**j)
            for i in (-1, 0, 1)
            for j in (-1, 0, 1)
            if slow * ratio**j >= SLOW_OVER_FAST * fast * ratio**i
        ]
        best = _best(problem, around) or best
    (fast, slow), (residual, coefficients, normal) = best
    intercept, r_fast, r_slow = coefficients[:3]
    dof = max(problem.n - 5, 1)
    weights = solve(normal, [0.0, 1.0, 1.0, 0.0, 0.0])
    variance = residual / dof * (weights[1] + weights[2]) if weights is not None else math.inf
    return WindowFit(
        r_c_per_w=r_fast + r_slow,
        tau_s=slow,
        fast_tau_s=fast,
        intercept_c=intercept,
        rms_c=math.sqrt(residual / problem.n),
        r_stderr=math.sqrt(max(variance, 0.0)),
    )


def _best(
    problem: _Problem, candidates: Sequence[tuple[float, float]]
) -> tuple[tuple[float, float], tuple[float, list[float], list[list[float]]]] | None:
    best = None
    for pair in candidates:
        result = problem.fit(*pair)
        if result is not None and (best is None or result[0] < best[1][0]):
            best = (pair, result)
    return best


def assess(powers: Sequence[float], result: WindowFit | None) -> str | None:
    """Why a window's fit is not to be used (the rules in the module's docstring); None when it is."""
    mean = statistics.fmean(powers)
    spread = statistics.pstdev(powers) / mean if mean > 0 else 0.0
    if spread < MIN_POWER_SPREAD:
        return f"power too steady ({spread:.1%} spread, {MIN_POWER_SPREAD:.0%} needed)"
    if result is None:
        return "no fit"
    if result.r_c_per_w <= 0:
        return f"a resistance of {result.r_c_per_w:.2f} °C/W (the air or the cooling changed)"
    if result.rms_c > MAX_RMS_C:
        return f"readings {result.rms_c:.2f} °C from the model (the air or the cooling changed)"
    if result.r_stderr > MAX_R_STDERR * result.r_c_per_w:
        return f"resistance uncertain by {result.r_stderr / result.r_c_per_w:.1%}"
    if result.tau_s >= SLOW_TAUS_S[-1]:
        return f"time constant {result.tau_s:.0f} s or more: longer than a window can tell"
    return None
