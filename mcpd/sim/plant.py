"""The physics of a simulated board: power from load and clocks, temperature from power.

Pure: state in, state out, no files and no clock. The model is deliberately small:

- Each frequency domain (CPU cluster, GPU, NPU) draws dynamic power
  P = P_max * util * (f / f_max) * (V(f) / V_max)^2, with V at `v_min_ratio * V_max` up to the
  knee (`v_knee`, a fraction of the range) and linear from there to V_max at f_max (CMOS dynamic
  power is proportional to f V^2). Where a board's device tree has an OPP table, the floor and
  knee come from its end points (`voltage_ramp`); the ramp in between is the plant's own, not
  the table's steps, so an estimator that reads the table does not see the plant's curve.
- Static SoC power grows with temperature (leakage): P_static * (1 + leakage_per_c * (T - 25)).
- Two thermal masses in series: the die over the heatsink. The heatsink relaxes towards
  T_amb + (1 - die_share) * R_th * P_soc with time constant tau_s; the die towards
  T_sink + die_share * R_th * P_soc with the much shorter die_tau_s. A step in power moves the die
  by a few kelvin within seconds and the rest over a minute, as a real package does; this is what
  lets a governor borrow the die's and heatsink's heat capacity for short bursts. Each mass is
  solved exactly per step (the die against the sink at the step's start), so any step is stable.
- The rest of the board (DRAM, I/O, regulators) adds `board_w` to input power but not to the die.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class DomainModel:
    name: str
    load: str
    """Which load of the schedule drives it: "cpu", "gpu" or "npu"."""
    min_khz: int
    max_khz: int
    table_khz: tuple[int, ...]
    """Available frequencies; empty for drivers without a table (intel_pstate)."""
    power_max_w: float
    """Dynamic power at f_max, fully busy."""
    v_min_ratio: float = 0.6
    v_knee: float = 0.0


def voltage_ramp(opps: tuple[tuple[int, int], ...]) -> tuple[float, float]:
    """(v_min_ratio, v_knee) from an OPP table of (Hz, µV): the lowest voltage over the highest,
    held up to the last frequency at that voltage; (0.6, 0.0) without a table."""
    if not opps:
        return 0.6, 0.0
    low_hz, high_hz = opps[0][0], opps[-1][0]
    floor_uv, top_uv = opps[0][1], opps[-1][1]
    knee_hz = max(hz for hz, uv in opps if uv == floor_uv)
    return floor_uv / top_uv, (knee_hz - low_hz) / (high_hz - low_hz)


@dataclass(frozen=True)
class Thermal:
    ambient_c: float
    r_th: float
    """Junction-to-ambient thermal resistance, K/W."""
    tau_s: float
    """Heatsink time constant, seconds of simulated time."""
    static_w: float
    """SoC static power at 25 °C."""
    leakage_per_c: float
    board_w: float
    """Board power outside the SoC (counted in input power, not heating the die)."""
    die_share: float = 0.25
    """Fraction of R_th between the die and the heatsink (junction-to-case)."""
    die_tau_s: float = 3.0
    """Die time constant, seconds of simulated time."""


@dataclass(frozen=True)
class PlantState:
    die_c: float
    sink_c: float
    freqs_khz: tuple[int, ...]
    """Current frequency of each domain, in the order of the board's domains."""
    domain_w: tuple[float, ...]
    static_w: float
    board_w: float

    @property
    def soc_w(self) -> float:
        return sum(self.domain_w) + self.static_w

    @property
    def input_w(self) -> float:
        return self.soc_w + self.board_w


def clamp_to_table(khz: int, domain: DomainModel) -> int:
    """What the kernel runs at for a request of `khz`: within range, at a table entry not above."""
    khz = min(max(khz, domain.min_khz), domain.max_khz)
    below = [value for value in domain.table_khz if value <= khz]
    if domain.table_khz:
        return max(below) if below else domain.table_khz[0]
    return khz


def running_khz(domain: DomainModel, util: float, cap_khz: int) -> int:
    """An ondemand-like choice: frequency rises with utilisation, limited by the cap."""
    demand = domain.min_khz + util * (domain.max_khz - domain.min_khz)
    return clamp_to_table(min(round(demand), cap_khz), domain)


def dynamic_power(domain: DomainModel, util: float, khz: int) -> float:
    span = domain.max_khz - domain.min_khz
    position = (khz - domain.min_khz) / span if span else 1.0
    rise = max(0.0, (position - domain.v_knee) / (1.0 - domain.v_knee))
    v_ratio = domain.v_min_ratio + (1.0 - domain.v_min_ratio) * rise
    return domain.power_max_w * util * (khz / domain.max_khz) * v_ratio**2


def step(
    state: PlantState,
    domains: tuple[DomainModel, ...],
    thermal: Thermal,
    utils: tuple[float, ...],
    caps_khz: tuple[int, ...],
    dt_s: float,
) -> PlantState:
    """Advance the plant by dt_s of simulated time with the given utilisations and caps."""
    freqs = tuple(
        running_khz(d, u, cap) for d, u, cap in zip(domains, utils, caps_khz, strict=True)
    )
    domain_w = tuple(dynamic_power(d, u, f) for d, u, f in zip(domains, utils, freqs, strict=True))
    static_w = thermal.static_w * max(0.0, 1.0 + thermal.leakage_per_c * (state.die_c - 25.0))
    soc_w = sum(domain_w) + static_w
    sink_target = thermal.ambient_c + (1.0 - thermal.die_share) * thermal.r_th * soc_w
    sink_c = _relax(state.sink_c, sink_target, dt_s, thermal.tau_s)
    die_target = state.sink_c + thermal.die_share * thermal.r_th * soc_w
    die_c = _relax(state.die_c, die_target, dt_s, thermal.die_tau_s)
    return PlantState(die_c, sink_c, freqs, domain_w, static_w, thermal.board_w)


def _relax(value: float, target: float, dt_s: float, tau_s: float) -> float:
    return target + (value - target) * math.exp(-dt_s / tau_s)


def initial_state(domains: tuple[DomainModel, ...], thermal: Thermal) -> PlantState:
    """The board at rest: idle clocks, die at the idle steady state."""
    freqs = tuple(d.table_khz[0] if d.table_khz else d.min_khz for d in domains)
    sink = thermal.ambient_c + (1.0 - thermal.die_share) * thermal.r_th * thermal.static_w
    die = sink + thermal.die_share * thermal.r_th * thermal.static_w
    idle_w = tuple(0.0 for _ in domains)
    return PlantState(die, sink, freqs, idle_w, thermal.static_w, thermal.board_w)
