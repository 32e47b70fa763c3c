"""Control quality on the simulator, in simulated time (deterministic for a profile, scenario,
ambient and seed): a governor against the best fixed cap chosen with hindsight.

Both are measured the same way, through mcpd's own sensors every 0.2 s of simulated time: the
governing temperature and power. The best fixed cap is the highest uniform cap (one fraction of
every domain's maximum, clamped to the range the governor is allowed and snapped to the table)
over every configuration of operating points inside that range, that keeps every sample at or
below 85.0 °C and below the power limit. Work is the simulator's frequency x busy-time counter
(MHz·s) summed over domains, with each domain's share reported beside it.
"""

from __future__ import annotations

import hashlib
import json
import statistics
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from governors import DomainSteps, GovernorParams, allowed_mhz, uniform_levels
from mcpd.events import Event, EventBus
from mcpd.governor import board, domains
from mcpd.governor.actuation import domain_range
from mcpd.governor.domains import FrequencyDomain
from mcpd.governor.loop import ControlLoop
from mcpd.governor.loop_settings import LoopSettings
from mcpd.governor.power_map import PowerMapStore
from mcpd.sim import MEMORY_DIR, PROFILES, CoolingFault, LoadSchedule, Simulator
from sensors import SensorSet
from sensors.discovery import PowerOptions
from tests.support.clock import FakeClock

SCENARIOS = ("sustained", "bursts", "bursts-short", "ambient-step", "load-step")
GOVERNORS = ("hysteresis", "adaptive", "fixed")
TEMP_LIMIT_C = 85.0
MEASURE_S = 0.2
AMBIENT_STEP_C = 10.0
"""ambient-step: the air warms by this much half-way through the run."""
POWER_LIMITS_W = {"jetson-agx-orin": 30.0}
"""Power limits each board can meet inside the governed range: the seed rule's 12 W, except the
AGX Orin, whose lowest allowed clocks alone draw more than 12 W; it gets its 30 W power mode
(docs/power-modes.md)."""
DEFAULT_POWER_LIMIT_W = 12.0
YARDSTICK = "1"


@dataclass(frozen=True)
class Case:
    profile: str
    scenario: str
    ambient_c: float = 25.0
    minutes: float = 10.0
    seed: int = 0

    @property
    def power_limit_w(self) -> float:
        return POWER_LIMITS_W.get(self.profile, DEFAULT_POWER_LIMIT_W)

    def load(self) -> LoadSchedule:
        half = self.minutes * 30
        return {
            "sustained": LoadSchedule("sustained"),
            "bursts": LoadSchedule("bursts", 90.0, 60.0),
            "bursts-short": LoadSchedule("bursts", 30.0, 30.0),
            "ambient-step": LoadSchedule("sustained"),
            "load-step": LoadSchedule("step", half),
        }[self.scenario]

    def faults(self) -> list[CoolingFault]:
        if self.scenario == "ambient-step":
            return [CoolingFault("ambient", AMBIENT_STEP_C, self.minutes * 30)]
        return []


POWER_COEFFICIENTS = {"fdab0000.npu": 3600.0}
"""`[sensors] power_coefficients` for the governed runs: the simulated RK3588 NPU's node has no
`dynamic-power-coefficient` (as the real one), so its estimate would miss the NPU's 2.6 W;
3600 µW/MHz/V² is what calibrating it once against a meter gives (docs/power-estimate.md)."""


def loop_settings(case: Case, governor: str, raise_hold_ms: int = 0) -> LoopSettings:
    limit = case.power_limit_w
    if governor not in ("hysteresis", "adaptive"):
        raise ValueError(f"governor {governor!r}: expected hysteresis or adaptive")
    return LoopSettings(
        params=GovernorParams(power_high_w=limit, power_low_w=limit * 0.75),
        policy=governor,
        raise_hold_s=raise_hold_ms / 1000,
        power=PowerOptions(coefficients=POWER_COEFFICIENTS),
    )


def governed_ranges(found: Iterable[FrequencyDomain]) -> dict[str, tuple[float, float]]:
    """Each domain's range under the default clamp, exactly as the loop computes it."""
    clamp = GovernorParams()
    return {d.name: domain_range(d, clamp.min_mhz, clamp.max_mhz, None)[:2] for d in found}


def configurations(found: list[FrequencyDomain]) -> list[tuple[float, dict[str, float]]]:
    """Every distinct uniform-cap configuration inside the governed range, lowest first (the
    adaptive policy's levels): the fraction of each maximum, and each domain's cap."""
    ranges = governed_ranges(found)
    steps = [
        DomainSteps(d.name, d.max_mhz, allowed_mhz(d.available_mhz, *ranges[d.name])) for d in found
    ]
    return [(level.fraction, dict(level.caps_mhz)) for level in uniform_levels(steps)]


def run(
    case: Case,
    governor: str,
    caps: dict[str, float] | None = None,
    raise_hold_ms: int = 0,
    trace: bool = False,
    learned: Path | None = None,
) -> dict[str, object]:
    """One run: governed, or (caps given) every domain held at its cap with no governor. With
    `trace`, the result also lists every cap change the governor made: when (simulated
    seconds), which way, why, the caps it changed and the readings it decided on. With
    `learned`, the governor keeps its learned power in that folder, as the daemon does in its
    state folder, and starts from what an earlier run left there."""
    with tempfile.TemporaryDirectory(dir=MEMORY_DIR) as folder:
        sim = Simulator(
            PROFILES[case.profile],
            Path(folder) / "board",
            load=case.load(),
            seed=case.seed,
            ambient_c=case.ambient_c,
            faults=case.faults(),
        )
        sim.build()
        clock = FakeClock()
        changes: list[dict[str, object]] = []
        tick: Callable[[float], float]
        if caps is not None:
            for domain in domains.discover(sim.root):
                domain.change_cap(caps[domain.name])
            tick = lambda now: now + MEASURE_S  # noqa: E731
        else:
            events = EventBus()

            def changed(event: Event) -> None:
                if event.kind == "governor" and event.data.get("caps"):
                    caps = {name: c["new_mhz"] for name, c in event.data["caps"].items()}
                    changes.append(
                        {
                            "t": round(clock.now, 2),
                            "action": event.data["action"],
                            "reason": event.data["reason"],
                            "caps_mhz": caps,
                            "temperature_c": event.data["temperature_c"],
                            "power_w": event.data["power_w"],
                        }
                    )

            events.subscribe(changed)
            loop = ControlLoop(
                sim.root,
                board.detect(sim.root),
                loop_settings(case, governor, raise_hold_ms),
                events=events,
                baseline=None,
                power_map=None if learned is None else PowerMapStore(learned),
                clock=clock,
            )
            loop.start()  # the caps brought into the governed range before the board's first step
            tick = loop.tick
        # The board's meters, never the estimator; a board without one (RK3588) is measured by
        # the plant's true input power, what a meter on its supply would read.
        meter = SensorSet.discover(sim.root, power=PowerOptions("meter"))
        temps: list[float] = []
        powers: list[tuple[float, float]] = []
        # The first sample at MEASURE_S: at 0 the registers still hold the board before the caps.
        wake, next_measure = 0.0, MEASURE_S
        while clock.now < case.minutes * 60:
            sim.advance(wake - clock.now)
            clock.now = wake
            wake = tick(clock.now)
            if clock.now >= next_measure - 1e-9:
                temps.append(meter.sample_temperatures().celsius or 999.0)
                watts = (
                    meter.sample_powers(clock.now).watts
                    if meter.power_plan.metered
                    else sim.state.input_w
                )
                if watts is not None:
                    powers.append((clock.now, watts))
                next_measure += MEASURE_S
        work = sum(sim.work_mhz_s.values())
    limit = case.power_limit_w
    return {
        "work": round(work, 1),
        "work_by_domain": {name: round(w, 1) for name, w in sim.work_mhz_s.items()},
        "peak_c": round(max(temps), 2),
        "seconds_above_85": round(sum(MEASURE_S for t in temps if t > TEMP_LIMIT_C), 1),
        "seconds_above_86": round(sum(MEASURE_S for t in temps if t > 86.0), 1),
        "peak_w": round(max(w for _, w in powers), 2) if powers else None,
        "seconds_over_power_limit": round(sum(MEASURE_S for _, w in powers if w >= limit), 1),
        "seconds_over_power_limit_after_1s": round(
            sum(MEASURE_S for t, w in powers if w >= limit and t > 1.0), 1
        ),
        "cap_changes_per_min": round(len(changes) / case.minutes, 2),
        "joules_per_work": round(sim.energy_j / work, 6) if work else None,
        **({"trace": changes} if trace else {}),
    }


def feasible(result: dict[str, object]) -> bool:
    return result["seconds_above_85"] == 0 and result["seconds_over_power_limit"] == 0


def configurations_for(profile: str) -> list[tuple[float, dict[str, float]]]:
    with tempfile.TemporaryDirectory(dir=MEMORY_DIR) as folder:
        sim = Simulator(PROFILES[profile], Path(folder) / "board")
        sim.build()
        return configurations(domains.discover(sim.root))


def best_fixed(case: Case, start: int | None = None) -> dict[str, object]:
    """The highest configuration that is feasible with the next one up infeasible (feasibility
    falls as caps rise): {"fraction", "caps_mhz", "result"}, or {"infeasible": why} when even the
    lowest one breaks the envelope.

    Without `start`: the lowest rung checked first, then the top, then bisection. With `start`
    (another seed's answer for the same case; a seed moves only the sensor noise): that
    configuration and its neighbours, walking up while feasible or down until feasible; the same
    answer as the bisection's, with two runs where it needs five to seven."""
    options = configurations_for(case.profile)
    results: dict[int, dict[str, object]] = {}

    def ok(index: int) -> bool:
        if index not in results:
            results[index] = run(case, "fixed", options[index][1])
        return feasible(results[index])

    def answer(index: int) -> dict[str, object]:
        return {
            "fraction": options[index][0],
            "caps_mhz": options[index][1],
            "result": results[index],
        }

    top = len(options) - 1
    if start is not None:
        index = min(max(start, 0), top)
        if ok(index):
            while index < top and ok(index + 1):
                index += 1
            return answer(index)
        while index > 0 and not ok(index - 1):
            index -= 1
        if index > 0:
            return answer(index - 1)
    if not ok(0):
        return {
            "infeasible": "even the lowest configuration inside the governed range breaks "
            f"the envelope (peak {results[0]['peak_c']} °C, {results[0]['peak_w']} W)",
            "caps_mhz": options[0][1],
            "result": results[0],
        }
    if ok(top):
        return answer(top)
    good, bad = 0, top
    while bad - good > 1:
        middle = (good + bad) // 2
        if ok(middle):
            good = middle
        else:
            bad = middle
    return answer(good)


def start_index(profile: str, best: dict[str, object]) -> int:
    """Where a best fixed cap sits among its profile's configurations (0 when infeasible)."""
    fractions = [fraction for fraction, _ in configurations_for(profile)]
    fraction = best.get("fraction")
    return fractions.index(fraction) if isinstance(fraction, float) else 0


def fixed_caps(case: Case, fraction: float) -> dict[str, float]:
    """`fixed` F: every domain at F x its maximum, clamped to the governed range and snapped."""
    with tempfile.TemporaryDirectory(dir=MEMORY_DIR) as folder:
        sim = Simulator(PROFILES[case.profile], Path(folder) / "board")
        sim.build()
        found = domains.discover(sim.root)
    ranges = governed_ranges(found)
    return {
        d.name: d.snap(min(max(fraction * d.max_mhz, ranges[d.name][0]), ranges[d.name][1]))
        / d.per_mhz
        for d in found
    }


def measure(
    case: Case,
    governor: str,
    fraction: float | None = None,
    raise_hold_ms: int = 0,
    trace: bool = False,
) -> dict[str, object]:
    """The benchmark's JSON document for one case (with `trace`, the governor's cap changes)."""
    best = best_fixed(case)
    if governor == "fixed":
        result = run(case, governor, fixed_caps(case, fraction if fraction is not None else 1.0))
    else:
        result = run(case, governor, raise_hold_ms=raise_hold_ms, trace=trace)
    return document(case, governor, result, best)


def document(
    case: Case, governor: str, result: dict[str, object], best: dict[str, object]
) -> dict[str, object]:
    best_result = best["result"]
    assert isinstance(best_result, dict)
    best_work = None if "infeasible" in best else best_result["work"]
    work = result["work"]
    assert isinstance(work, float)
    return {
        "profile": case.profile,
        "scenario": case.scenario,
        "governor": governor,
        "ambient_c": case.ambient_c,
        "seed": case.seed,
        "sim_minutes": case.minutes,
        "power_limit_w": case.power_limit_w,
        **result,
        "best_fixed_work": best_work,
        "best_fixed_mhz": best["caps_mhz"],
        "best_fixed_fraction": best.get("fraction"),
        "best_fixed_peak_c": best_result["peak_c"],
        "best_fixed_peak_w": best_result["peak_w"],
        "best_fixed_joules_per_work": best_result["joules_per_work"],
        "best_fixed_work_by_domain": best_result["work_by_domain"],
        "worst_domain_ratio": None
        if best_work is None
        else worst_domain_ratio(result, best_result),
        "best_fixed_infeasible": best.get("infeasible"),
        "ratio": round(work / best_work, 4) if isinstance(best_work, float) else None,
    }


def fingerprint() -> str:
    """Of what a fixed-cap result depends on: the simulator, mcpd's sensors, and the yardstick's
    version (bump YARDSTICK when run() or best_fixed() change)."""
    project = Path(__file__).resolve().parent.parent
    digest = hashlib.sha256(YARDSTICK.encode())
    for path in sorted([*project.glob("mcpd/sim/*.py"), *project.glob("sensors/*.py")]):
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def cached_best_fixed(
    case: Case, cache: Path | None, start: int | None = None
) -> dict[str, object]:
    """best_fixed, kept in `cache` (a folder) per case and code fingerprint: the governors change
    between sweeps, the yardstick does not."""
    if cache is None:
        return best_fixed(case, start)
    key = f"{case.profile}_{case.scenario}_{case.ambient_c:g}_{case.minutes:g}_{case.seed}"
    path = cache / fingerprint() / f"{key}.json"
    if path.exists():
        return dict(json.loads(path.read_text()))
    best = best_fixed(case, start)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(best))
    return best


def worst_domain_ratio(result: dict[str, object], best: dict[str, object]) -> float | None:
    """The least any one domain got relative to its share under the best fixed cap: a policy
    that wins by starving a domain shows here."""
    mine, theirs = result["work_by_domain"], best["work_by_domain"]
    assert isinstance(mine, dict) and isinstance(theirs, dict)
    ratios = [mine[name] / work for name, work in theirs.items() if work > 0]
    return round(min(ratios), 4) if ratios else None


def sweep_seeds(
    seeds: list[Case],
    governors: tuple[str, ...],
    cache: Path | None = None,
    done: frozenset[tuple[object, ...]] = frozenset(),
    warm: bool = False,
) -> list[dict[str, object]]:
    """One case over its seeds, first seed first: its best fixed cap is where the others' search
    starts. Rows whose row_key is in `done` (an interrupted sweep's) are not run again. `warm`:
    each governed run is the second of two on the same board, starting from the power the first
    learned (a daemon restarted on a board it governed before); its rows say "GOVERNOR, warm"."""
    rows = []
    start: int | None = None
    for case in seeds:
        best = cached_best_fixed(case, cache, start)
        start = start_index(case.profile, best) if start is None else start
        for governor in governors:
            label = f"{governor}, warm" if warm else governor
            if (case.profile, case.scenario, case.ambient_c, case.seed, label) in done:
                continue
            if not warm:
                rows.append(document(case, governor, run(case, governor), best))
                continue
            with tempfile.TemporaryDirectory(dir=MEMORY_DIR) as folder:
                run(case, governor, learned=Path(folder))
                result = run(case, governor, learned=Path(folder))
            rows.append(document(case, label, result, best))
    return rows


def row_key(row: dict[str, object]) -> tuple[object, ...]:
    return (row["profile"], row["scenario"], row["ambient_c"], row["seed"], row["governor"])


def median_table(rows: list[dict[str, object]]) -> list[str]:
    """One line per profile x scenario x ambient x governor, medians over seeds."""
    groups: dict[tuple[object, ...], list[dict[str, object]]] = {}
    for row in rows:
        key = (row["profile"], row["scenario"], row["ambient_c"], row["governor"])
        groups.setdefault(key, []).append(row)

    def median(items: list[dict[str, object]], field: str) -> str:
        values = [float(v) for v in (i[field] for i in items) if isinstance(v, (int, float))]
        return f"{statistics.median(values):.3g}" if values else "–"

    def ratio(items: list[dict[str, object]]) -> str:
        if all(i["best_fixed_infeasible"] for i in items):
            return "infeasible"
        return median(items, "ratio")

    lines = [
        "| profile | scenario | ambient °C | governor | ratio | peak °C | s > 86 °C | peak W "
        "| s over power limit after 1 s | cap changes/min | J/work vs best fixed "
        "| worst domain vs best fixed |",
        "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for (profile, scenario, ambient, governor), items in sorted(groups.items(), key=str):
        energy = [
            float(i["joules_per_work"]) / float(i["best_fixed_joules_per_work"])  # type: ignore[arg-type]
            for i in items
            if i["best_fixed_joules_per_work"] and i["best_fixed_infeasible"] is None
        ]
        lines.append(
            f"| {profile} | {scenario} | {ambient:g} | {governor} | {ratio(items)} "
            f"| {median(items, 'peak_c')} | {median(items, 'seconds_above_86')} "
            f"| {median(items, 'peak_w')} | {median(items, 'seconds_over_power_limit_after_1s')} "
            f"| {median(items, 'cap_changes_per_min')} "
            f"| {statistics.median(energy) if energy else float('nan'):.3f} "
            f"| {median(items, 'worst_domain_ratio')} |"
        )
    return lines


def cases(
    profiles: Iterable[str],
    scenarios: Iterable[str],
    ambients: Iterable[float],
    seeds: Iterable[int],
    minutes: float,
) -> list[Case]:
    return [
        Case(p, s, a, minutes, seed)
        for p in profiles
        for s in scenarios
        for a in ambients
        for seed in seeds
    ]
