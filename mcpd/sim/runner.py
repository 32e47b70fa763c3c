"""The simulated board as a running plant: reads the caps mcpd writes, advances the physics, and
rewrites every sensor, clock and counter file.

`speed` compresses simulated thermal time (the load schedule and the thermal mass run `speed` times
faster than the wall clock) while power stays power: energy counters advance in wall-clock time,
so a reader computing watts from RAPL deltas sees the plant's true power.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import random
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from mcpd.sim import plant
from mcpd.sim.energy_model import Jiffies
from mcpd.sim.faults import CoolingFault, Fault, ambient_shift, resistance_factor
from mcpd.sim.profiles import PART_NAMES, Profile
from mcpd.sim.topology import Topology
from mcpd.sim.tree import INA3221_UPDATE_S, BoardTree, Inputs
from safefs import read_text
from sensors.sysfs import parse_int

log = logging.getLogger("mcpd.sim")

STATE_FILE = "run/mcpd-sim/state.json"
"""Relative to the root: the plant's true state, for tests and benchmarks (not a sysfs file)."""

_IDLE = {"cpu": 0.05, "gpu": 0.0, "npu": 0.0}
_HALF = {"cpu": 0.5, "gpu": 0.5, "npu": 0.5}
_BUSY = {"cpu": 1.0, "gpu": 1.0, "npu": 1.0}
_GARBAGE = "\x00\x7f#err\n"
COUNTER_TICK_S = 0.005


@dataclass(frozen=True)
class LoadSchedule:
    """idle, sustained (everything busy), bursts[:ON/OFF] seconds of simulated time, step:AT
    (everything half busy, then fully busy from AT seconds on), or level:U (everything U busy,
    0..1)."""

    kind: str
    on_s: float = 30.0
    off_s: float = 30.0

    def utils(self, sim_s: float) -> dict[str, float]:
        if self.kind == "sustained":
            return _BUSY
        if self.kind == "level":
            return dict.fromkeys(_BUSY, self.on_s)
        if self.kind == "bursts" and sim_s % (self.on_s + self.off_s) < self.on_s:
            return _BUSY
        if self.kind == "step":
            return _BUSY if sim_s >= self.on_s else _HALF
        return _IDLE

    @classmethod
    def parse(cls, spec: str) -> LoadSchedule:
        kind, _, periods = spec.partition(":")
        if kind in ("idle", "sustained") and not periods:
            return cls(kind)
        if kind == "level":
            try:
                level = float(periods)
            except ValueError:
                level = -1.0
            if 0.0 <= level <= 1.0:
                return cls(kind, level)
        if kind == "step":
            try:
                at = float(periods)
            except ValueError:
                at = -1.0
            if at >= 0:
                return cls(kind, at)
        if kind == "bursts":
            if not periods:
                return cls(kind)
            on, _, off = periods.partition("/")
            try:
                schedule = cls(kind, float(on), float(off or on))
            except ValueError:
                schedule = None
            if schedule and schedule.on_s > 0 and schedule.off_s > 0:
                return schedule
        raise ValueError(
            f"load {spec!r}: expected idle, sustained, bursts[:ON/OFF], step:AT or level:U (0..1)"
        )


class ConversionWindow:
    """What an INA3221 reports: the average of its conversions over one update interval, replaced
    at the end of each interval (docs/sensor-timing.md), not the instantaneous power."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self.published: dict[str, float] | None = None
        self._joules: dict[str, float] = {}
        self._seconds = 0.0

    def add(self, part_w: dict[str, float], dt_s: float) -> dict[str, float]:
        """Accumulate dt_s at part_w; return the values the registers hold now."""
        for part, watts in part_w.items():
            self._joules[part] = self._joules.get(part, 0.0) + watts * dt_s
        self._seconds += dt_s
        if self.published is None:
            self.published = dict(part_w)
        if self._seconds >= self.interval_s:
            self.published = {part: j / self._seconds for part, j in self._joules.items()}
            self._joules, self._seconds = {}, 0.0
        return self.published


class Simulator:
    def __init__(
        self,
        profile: Profile,
        root: str | Path,
        *,
        speed: float = 1.0,
        load: LoadSchedule = LoadSchedule("sustained"),
        faults: Iterable[Fault | CoolingFault] = (),
        seed: int = 0,
        ambient_c: float | None = None,
        topology: Topology | None = None,
    ) -> None:
        """`topology` stands in for the profile's CPU topology (mcpd.sim.topology.host: this
        machine's, so that a placement plan made on the board names CPUs this machine has)."""
        if speed <= 0:
            raise ValueError("speed must be positive")
        if topology is not None:
            profile = dataclasses.replace(profile, topology=topology)
        self.profile = profile
        self.root = Path(root)
        self.speed = speed
        self.load = load
        self.faults = tuple(f for f in faults if isinstance(f, Fault))
        self.cooling_faults = tuple(f for f in faults if isinstance(f, CoolingFault))
        self.ambient_c = profile.thermal.ambient_c if ambient_c is None else ambient_c
        """The air before any cooling fault changes it."""
        self.tree = BoardTree(profile, self.root)
        self.domains = tuple(
            plant.DomainModel(
                f"policy{p.number}",
                "cpu",
                p.min_khz,
                p.max_khz,
                p.table_khz,
                p.power_max_w,
                *plant.voltage_ramp(p.energy_model.opps if p.energy_model else ()),
            )
            for p in profile.cpus
        ) + tuple(
            plant.DomainModel(
                d.name,
                d.load,
                d.table_hz[0] // 1000,
                d.table_hz[-1] // 1000,
                tuple(f // 1000 for f in d.table_hz),
                d.power_max_w,
                *plant.voltage_ramp(d.energy_model.opps if d.energy_model else ()),
            )
            for d in profile.devfreqs
        )
        self.sim_s = 0.0
        self.state = plant.initial_state(self.domains, self._thermal())
        self.caps_khz = tuple(d.max_khz for d in self.domains)
        # Start RAPL counters 20 J below their wrap so every run exercises the wraparound early.
        start = profile.rapl_max_energy_uj - 20_000_000
        self.energy_uj = {zone.zone_id: start for zone in profile.rapl}
        self.elapsed_s = 0.0
        self.work_mhz_s = {d.name: 0.0 for d in self.domains}
        self.energy_j = 0.0
        """Board input energy over simulated time: what the joules-per-work figures divide."""
        self.meter = ConversionWindow(INA3221_UPDATE_S)
        self.jiffies = Jiffies(tuple(cpu for p in profile.cpus for cpu in p.cpus))
        self.utils = _IDLE
        self._rng = random.Random(seed)
        self._renumbered: set[Fault] = set()
        self._state_written = -1.0
        self._inputs: Inputs | None = None
        self._written: dict[str, str | None] = {}

    def build(self) -> None:
        self.tree.build()
        known = {dynamic.sensor for dynamic in self.tree.dynamics}
        for fault in self.faults:
            names = set(self.tree.hwmon_dirs) if fault.kind == "renumber" else known
            if fault.sensor not in names:
                raise ValueError(
                    f"fault {fault.kind}:{fault.sensor}: no such sensor on {self.profile.name}; "
                    f"expected one of: {', '.join(sorted(names))}"
                )
        self.step(0.0)

    def _read_caps(self) -> tuple[int, ...]:
        caps = []
        for domain, previous in zip(self.domains, self.caps_khz, strict=True):
            path, per_khz = self.tree.cap_paths[domain.name]
            try:
                raw = parse_int(read_text(self.root / path))
            except OSError:
                raw = None
            caps.append(previous if raw is None else raw // per_khz)
        return tuple(caps)

    def advance(self, wall_dt: float) -> None:
        """Advance everything by wall_dt seconds under the caps written so far: the plant, and
        the energy counters at the power it draws under them."""
        self.step(wall_dt, counted_s=wall_dt)

    def step(self, wall_dt: float, counted_s: float = 0.0) -> None:
        """Advance the plant by wall_dt seconds and the energy counters by counted_s at its new
        power, then rewrite every value."""
        self.elapsed_s += wall_dt
        sim_dt = wall_dt * self.speed
        # The load and the air over an interval are the schedule's at its start: a step at T is
        # felt from T on, not over the interval that ends at T.
        self.utils = self.load.utils(self.sim_s)
        utils = tuple(self.utils.get(d.load, 0.0) for d in self.domains)
        self.caps_khz = self._read_caps()
        thermal = self._thermal()
        self.sim_s += sim_dt
        self.state = plant.step(self.state, self.domains, thermal, utils, self.caps_khz, sim_dt)
        # Energy is what the board draws under the caps in force over the interval (a real RAPL
        # counter counts the energy consumed, Documentation/power/powercap/powercap.rst, and a cap
        # takes effect within a millisecond): the new state's power, as the INA3221 window below
        # and the plant's own heating take it. At the previous state's power, the 100 ms after a
        # cap write would read as the old caps' power and the governor would step again on it.
        self.energy_j += self.state.input_w * sim_dt
        part_w = dict.fromkeys(PART_NAMES, 0.0)
        for domain, watts in zip(self.domains, self.state.domain_w, strict=True):
            part_w[domain.load] = part_w.get(domain.load, 0.0) + watts
        part_w["static"] = self.state.static_w
        part_w["board"] = self.state.board_w
        freqs = {d.name: f for d, f in zip(self.domains, self.state.freqs_khz, strict=True)}
        for domain, util in zip(self.domains, utils, strict=True):
            self.work_mhz_s[domain.name] += freqs[domain.name] / 1000 * util * sim_dt
        cpu_util = self.utils.get("cpu", 0.0)
        self.jiffies.advance({cpu: cpu_util for cpu in self.jiffies.busy}, wall_dt)
        self._inputs = Inputs(
            die_c=self.state.die_c,
            ambient_c=thermal.ambient_c,
            part_w=part_w,
            meter_w=self.meter.add(part_w, wall_dt),
            utils=dict(self.utils),
            freqs_khz=freqs,
            energy_uj=self.energy_uj,
            noise_c=self._rng.gauss(0.0, 0.15),
            proc_stat=self.jiffies.render(),
        )
        self._accumulate_energy(counted_s)
        self._write(kinds=None)
        if self.elapsed_s - self._state_written >= 1.0 or wall_dt == 0.0:
            self._write_state()

    def _thermal(self) -> plant.Thermal:
        """The profile's thermal constants as the cooling faults have changed them by now."""
        return dataclasses.replace(
            self.profile.thermal,
            ambient_c=self.ambient_c + ambient_shift(self.cooling_faults, self.sim_s),
            r_th=self.profile.thermal.r_th * resistance_factor(self.cooling_faults, self.sim_s),
        )

    def _accumulate_energy(self, wall_dt: float) -> None:
        if self._inputs is None:
            return
        for zone in self.profile.rapl:
            watts = zone.share * sum(self._inputs.part_w[part] for part in zone.parts)
            joules = watts * wall_dt
            energy = self.energy_uj[zone.zone_id] + round(joules * 1e6)
            self.energy_uj[zone.zone_id] = energy % self.profile.rapl_max_energy_uj

    def tick_counters(self, wall_dt: float) -> None:
        """Advance only the energy counters, at the current power: RAPL counts continuously, so
        a reader sampling at 100 ms must not see them move in 50 ms steps."""
        self._accumulate_energy(wall_dt)
        self._write(kinds={"counter"})

    def _write(self, kinds: set[str] | None) -> None:
        active = [fault for fault in self.faults if fault.active(self.elapsed_s)]
        for fault in active:
            if fault.kind == "renumber" and fault not in self._renumbered:
                self._renumbered.add(fault)
                log.info(
                    "fault: hwmon %s renumbered to %s",
                    fault.sensor,
                    self.tree.renumber_hwmon(fault.sensor),
                )
        for dynamic in self.tree.dynamics:
            if kinds is not None and dynamic.kind not in kinds:
                continue
            faults = {fault.kind for fault in active if fault.sensor == dynamic.sensor}
            text: str | None
            if "vanish" in faults:
                (self.root / dynamic.path).unlink(missing_ok=True)
                text = None
            elif "stuck" in faults and self._written.get(dynamic.path) is not None:
                continue
            elif "garbage" in faults:
                text = _GARBAGE
            elif "sentinel" in faults and dynamic.kind == "temperature":
                text = "-256000\n"
            else:
                assert self._inputs is not None
                text = dynamic.render(self._inputs)
            # An unchanged value is not rewritten, so a reader's open descriptor stays valid.
            if text is not None and text != self._written.get(dynamic.path):
                self.tree.write(dynamic.path, text)
            self._written[dynamic.path] = text

    def snapshot(self) -> dict[str, object]:
        thermal = self._thermal()
        return {
            "profile": self.profile.name,
            "elapsed_s": round(self.elapsed_s, 3),
            "sim_s": round(self.sim_s, 3),
            "die_c": round(self.state.die_c, 3),
            "sink_c": round(self.state.sink_c, 3),
            "ambient_c": round(thermal.ambient_c, 3),
            "r_th": round(thermal.r_th, 4),
            "soc_w": round(self.state.soc_w, 3),
            "input_w": round(self.state.input_w, 3),
            "utils": dict(self.utils),
            "caps_mhz": {
                d.name: c / 1000 for d, c in zip(self.domains, self.caps_khz, strict=True)
            },
            "freqs_mhz": {
                d.name: f / 1000 for d, f in zip(self.domains, self.state.freqs_khz, strict=True)
            },
            "work_mhz_s": {name: round(work, 3) for name, work in self.work_mhz_s.items()},
        }

    def _write_state(self) -> None:
        self._state_written = self.elapsed_s
        self.tree.write(STATE_FILE, json.dumps(self.snapshot(), sort_keys=True))

    def run(self, stop: threading.Event, step_s: float = 0.05) -> None:
        """Step on wall-clock deadlines until `stop` is set, with the energy counters ticking
        every 5 ms in between."""
        tick_s = COUNTER_TICK_S if self.profile.rapl else step_s
        last_step = last_tick = deadline = time.monotonic()
        while not stop.is_set():
            deadline += tick_s
            stop.wait(max(0.0, deadline - time.monotonic()))
            now = time.monotonic()
            if now - last_step >= step_s - tick_s / 2:
                # The plant reads the caps only at its steps, so until this one the board drew
                # the power of the caps it read at the last: the ticks count that, and the
                # counters run at the new caps' power from this step on.
                self._accumulate_energy(now - last_tick)
                self.step(now - last_step)
                last_step = now
            else:
                self.tick_counters(now - last_tick)
            last_tick = now
