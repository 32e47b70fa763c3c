"""The board simulator: a plant that behaves like the board, read through mcpd's own sensors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mcpd.governor import domains
from mcpd.sim import PROFILES, STATE_FILE, CoolingFault, Fault, LoadSchedule, Simulator, plant
from mcpd.sim.faults import parse as parse_fault
from mcpd.sim.runner import ConversionWindow
from sensors import SensorSet
from sensors.discovery import PowerOptions


def simulate(tmp_path: Path, profile: str, load: str = "sustained", **kwargs: object) -> Simulator:
    simulator = Simulator(
        PROFILES[profile], tmp_path / profile, load=LoadSchedule.parse(load), **kwargs
    )  # type: ignore[arg-type]
    simulator.build()
    return simulator


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_full_load_without_governor_passes_85_within_a_minute_and_settles_above(
    tmp_path: Path, profile: str
) -> None:
    simulator = simulate(tmp_path, profile)
    sensors = SensorSet.discover(simulator.root)
    crossed_at = None
    for second in range(1, 241):
        simulator.advance(1.0)
        celsius = sensors.sample_temperatures().celsius
        assert celsius is not None
        if crossed_at is None and celsius >= 85.0:
            crossed_at = second
    assert crossed_at is not None and 20 <= crossed_at <= 65, crossed_at
    assert 95.0 <= celsius <= 110.0


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_idle_board_stays_cool(tmp_path: Path, profile: str) -> None:
    simulator = simulate(tmp_path, profile, load="idle")
    sensors = SensorSet.discover(simulator.root)
    for _ in range(300):
        simulator.advance(1.0)
    celsius = sensors.sample_temperatures().celsius
    assert celsius is not None and 30.0 <= celsius <= 45.0


def test_caps_written_by_mcpd_lower_clocks_power_and_temperature(tmp_path: Path) -> None:
    simulator = simulate(tmp_path, "jetson-orin-nano")
    sensors = SensorSet.discover(simulator.root)
    simulator.advance(1.0)
    uncapped_w = sensors.sample_powers(1.0).watts
    for domain in domains.discover(simulator.root):
        domain.change_cap(domain.max_mhz * 0.5)
    simulator.advance(1.0)
    capped_w = sensors.sample_powers(2.0).watts
    assert uncapped_w is not None and capped_w is not None
    assert capped_w < uncapped_w * 0.75
    for domain in domains.discover(simulator.root):
        cap, cur = domain.read_cap_mhz(), domain.read_cur_mhz()
        assert cap is not None and cur is not None and cur <= cap <= domain.max_mhz * 0.5
    for _ in range(240):
        simulator.advance(1.0)
    assert (sensors.sample_temperatures().celsius or 999) < 80.0


def test_power_follows_f_v_squared() -> None:
    """Halving the clock more than halves dynamic power: the voltage drops with it."""
    (big,) = [
        d for d in Simulator(PROFILES["rk3588"], "/nonexistent").domains if d.name == "policy4"
    ]
    full = plant.dynamic_power(big, 1.0, big.max_khz)
    assert full == pytest.approx(PROFILES["rk3588"].cpus[1].power_max_w)
    assert plant.dynamic_power(big, 1.0, big.max_khz // 2) < 0.5 * full
    assert plant.dynamic_power(big, 0.5, big.max_khz) == pytest.approx(0.5 * full)


def test_rapl_counters_track_plant_power_through_the_wrap(tmp_path: Path) -> None:
    simulator = simulate(tmp_path, "x86-intel")
    sensors = SensorSet.discover(simulator.root)
    zone = next(p for p in sensors.powers if p.name == "psys")
    now = 0.0
    zone.read(now)
    wrapped = False
    for _ in range(40):
        before = simulator.energy_uj["1"]
        for _ in range(20):
            simulator.tick_counters(0.005)
        simulator.advance(0.0)
        now += 0.1
        wrapped |= simulator.energy_uj["1"] < before
        assert zone.read(now) == pytest.approx(simulator.state.input_w, rel=0.02)
    assert wrapped


@pytest.mark.parametrize(
    ("stepped", "steady"),
    [
        ({"load": "step:1.0"}, {"load": "level:0.5"}),
        (
            {"ambient_c": 25.0, "faults": (CoolingFault("ambient", 10.0, 1.0),)},
            {"ambient_c": 25.0},
        ),
    ],
)
def test_a_step_in_the_schedule_is_felt_from_its_time_on(
    tmp_path: Path, stepped: dict[str, object], steady: dict[str, object]
) -> None:
    """Half load then full load at 1 s, or the air 10 °C warmer at 1 s: up to 1 s the board is
    the one without the step, and only the interval after it differs."""
    boards = [
        simulate(tmp_path / name, "x86-intel", **kwargs)
        for name, kwargs in (("stepped", stepped), ("steady", steady))
    ]
    for _ in range(8):  # 1/8 s: exactly 1 s after eight
        for board in boards:
            board.advance(0.125)
    first, second = boards
    assert first.state == second.state and first.work_mhz_s == second.work_mhz_s
    assert first.energy_j == second.energy_j and first.energy_uj == second.energy_uj
    for board in boards:
        board.advance(0.125)
    assert first.state.sink_c > second.state.sink_c


def test_energy_after_a_cap_write_is_drawn_at_the_new_caps_power(tmp_path: Path) -> None:
    """A RAPL counter counts the energy drawn: the 100 ms after the caps are lowered are counted
    at the lowered caps' power, as is the board's input energy, not at the power before them."""
    simulator = simulate(tmp_path, "x86-intel")
    sensors = SensorSet.discover(simulator.root)
    psys = next(p for p in sensors.powers if p.name == "psys")
    simulator.advance(3.0)
    psys.read(3.0)
    uncapped_w = simulator.state.input_w
    for domain in domains.discover(simulator.root):
        domain.change_cap(domain.min_mhz)
    energy_j = simulator.energy_j
    simulator.advance(0.1)
    capped_w = simulator.state.input_w
    assert capped_w < uncapped_w * 0.75
    assert psys.read(3.1) == pytest.approx(capped_w, rel=1e-4)
    assert (simulator.energy_j - energy_j) / 0.1 == pytest.approx(capped_w, rel=1e-4)


def test_no_power_meter_on_rk3588(tmp_path: Path) -> None:
    simulator = simulate(tmp_path, "rk3588")
    sensors = SensorSet.discover(simulator.root, power=PowerOptions("meter"))
    assert sensors.powers == [] and not sensors.power_plan.metered
    estimated = SensorSet.discover(simulator.root)
    assert [s.name for s in estimated.powers] == ["estimate"]
    assert estimated.power_plan.source == "estimate"


def test_fault_vanish_then_back(tmp_path: Path) -> None:
    simulator = simulate(
        tmp_path, "jetson-orin-nano", faults=[Fault("vanish", "tj-thermal", 1.0, 1.0)]
    )
    sensors = SensorSet.discover(simulator.root)
    readings = []
    for _ in range(6):
        simulator.advance(0.5)
        readings.append(
            {r.name: r.celsius for r in sensors.sample_temperatures().readings}["tj-thermal"]
        )
    assert [r is None for r in readings] == [False, True, True, False, False, False]


@pytest.mark.parametrize("kind", ["garbage", "sentinel"])
def test_fault_unreadable_values(tmp_path: Path, kind: str) -> None:
    simulator = simulate(tmp_path, "rk3588", faults=[Fault(kind, "bigcore0-thermal", 0.5)])
    sensors = SensorSet.discover(simulator.root)
    simulator.advance(1.0)
    sample = sensors.sample_temperatures()
    assert {r.name: r.celsius for r in sample.readings}["bigcore0-thermal"] is None
    assert sample.celsius is not None  # the others still govern
    assert not sensors.gone


def test_fault_stuck_value(tmp_path: Path) -> None:
    simulator = simulate(tmp_path, "x86-amd", faults=[Fault("stuck", "k10temp/Tctl", 1.0)])
    sensors = SensorSet.discover(simulator.root)
    simulator.advance(1.0)
    first = sensors.sample_temperatures().celsius
    for _ in range(30):
        simulator.advance(1.0)
    assert sensors.sample_temperatures().celsius == first
    assert simulator.state.die_c > (first or 0) + 10


def test_fault_renumbered_hwmon(tmp_path: Path) -> None:
    simulator = simulate(tmp_path, "jetson-orin-nano", faults=[Fault("renumber", "ina3221", 1.0)])
    sensors = SensorSet.discover(simulator.root)
    assert sensors.sample_powers(0.0).watts is not None
    old = sorted(p.name for p in (simulator.root / "sys/class/hwmon").iterdir())
    simulator.advance(1.5)
    assert sensors.sample_powers(1.5).watts is None and sensors.gone
    assert sorted(p.name for p in (simulator.root / "sys/class/hwmon").iterdir()) != old
    again = SensorSet.discover(simulator.root)
    assert again.sample_powers(1.6).watts == pytest.approx(simulator.state.input_w, rel=0.01)


def test_unknown_fault_sensor_names_the_valid_ones(tmp_path: Path) -> None:
    with pytest.raises(
        ValueError, match=r"no such sensor on rk3588; expected one of: .*bigcore0-thermal"
    ):
        simulate(tmp_path, "rk3588", faults=[Fault("vanish", "VDD_IN")])


@pytest.mark.parametrize(
    "spec", ["vanish", "melt:cpu-thermal", "vanish:cpu-thermal@x", "stuck:a@1+"]
)
def test_fault_spec_errors(spec: str) -> None:
    with pytest.raises(ValueError, match="fault"):
        parse_fault(spec)


def test_fault_spec() -> None:
    assert parse_fault("vanish:coretemp/Package id 0@30+2.5") == Fault(
        "vanish", "coretemp/Package id 0", 30.0, 2.5
    )
    assert parse_fault("renumber:ina3221") == Fault("renumber", "ina3221", 0.0, None)


def test_cooling_fault_specs() -> None:
    assert parse_fault("fan-stop:1.8@3600") == CoolingFault("fan-stop", 1.8, 3600.0, 0.0)
    assert parse_fault("dust:1.5@3600+21600") == CoolingFault("dust", 1.5, 3600.0, 21600.0)
    assert parse_fault("ambient:+10@600") == CoolingFault("ambient", 10.0, 600.0, 0.0)
    assert parse_fault("ambient:-5") == CoolingFault("ambient", -5.0, 0.0, 0.0)
    for spec, why in (
        ("dust:1.5@10", "dust needs \\+DURATION"),
        ("fan-stop:0.9", "factor on the resistance above 1"),
        ("ambient:hot@10", "'hot' is not a number"),
        ("ambient:50", "-40 to 40 °C"),
    ):
        with pytest.raises(ValueError, match=why):
            parse_fault(spec)


def test_a_stopped_fan_multiplies_the_rise_dust_builds_up_and_the_state_says_so(
    tmp_path: Path,
) -> None:
    """The board settles to ambient + R·P: a fan that stops makes the rise per watt `amount` times
    larger from its start; dust makes it so by the end of its duration, linearly; the state file
    names the resistance in force."""
    healthy = simulate(tmp_path / "healthy", "rk3588", "level:0.5")
    fan = simulate(
        tmp_path / "fan", "rk3588", "level:0.5", faults=[CoolingFault("fan-stop", 1.6, 100.0)]
    )
    dust = simulate(
        tmp_path / "dust", "rk3588", "level:0.5", faults=[CoolingFault("dust", 1.6, 0.0, 1200.0)]
    )
    r_th = PROFILES["rk3588"].thermal.r_th
    for _ in range(600):
        for simulator in (healthy, fan, dust):
            simulator.advance(1.0)

    def rise_per_watt(simulator: Simulator) -> float:
        return (simulator.state.die_c - simulator.ambient_c) / simulator.state.soc_w

    def state(simulator: Simulator) -> dict[str, float]:
        return dict(json.loads((simulator.root / STATE_FILE).read_text()))

    assert rise_per_watt(healthy) == pytest.approx(r_th, rel=0.001)
    assert rise_per_watt(fan) == pytest.approx(1.6 * r_th, rel=0.001)
    assert state(fan)["r_th"] == pytest.approx(1.6 * r_th, abs=1e-3)
    assert state(dust)["r_th"] == pytest.approx(1.3 * r_th, abs=1e-3)  # half way through
    for _ in range(600):
        dust.advance(1.0)
    assert state(dust)["r_th"] == pytest.approx(1.6 * r_th, abs=1e-3)
    assert state(healthy)["r_th"] == pytest.approx(r_th) and state(healthy)["ambient_c"] == 25.0


def test_load_schedules() -> None:
    bursts = LoadSchedule.parse("bursts:10/20")
    assert (
        bursts.utils(5.0)["cpu"] == 1.0
        and bursts.utils(15.0)["cpu"] < 0.1
        and bursts.utils(31.0)["cpu"] == 1.0
    )
    assert LoadSchedule.parse("idle").utils(0)["gpu"] == 0.0
    step = LoadSchedule.parse("step:300")
    assert step.utils(299.9)["gpu"] == 0.5 and step.utils(300.0)["gpu"] == 1.0
    for bad in ("busy", "bursts:0/1", "bursts:a/b", "idle:3", "step", "step:-1", "step:x"):
        with pytest.raises(
            ValueError, match=r"expected idle, sustained, bursts.*, step:AT or level:U"
        ):
            LoadSchedule.parse(bad)


def test_die_reacts_in_seconds_heatsink_over_a_minute() -> None:
    """Two thermal masses: a power step moves the die by its share of the rise within seconds,
    the rest follows with the heatsink's time constant."""
    thermal = PROFILES["rk3588"].thermal
    domains = Simulator(PROFILES["rk3588"], "/nonexistent").domains
    state = plant.initial_state(domains, thermal)
    busy, caps = tuple(1.0 for _ in domains), tuple(d.max_khz for d in domains)
    for _ in range(100):  # 10 s
        state = plant.step(state, domains, thermal, busy, caps, 0.1)
    die_rise, sink_rise = state.die_c - state.sink_c, state.sink_c - thermal.ambient_c
    full_rise = thermal.r_th * state.soc_w
    # The die trails the still-rising heatsink by about die_tau_s x its rate (~1 K/s here).
    assert 0.7 < die_rise / (thermal.die_share * full_rise) < 1.0
    assert sink_rise < 0.4 * (1 - thermal.die_share) * full_rise


def test_ambient_moves_every_temperature(tmp_path: Path) -> None:
    warm = simulate(tmp_path / "warm", "rk3588", ambient_c=40.0)
    stepped = simulate(
        tmp_path / "step", "rk3588", ambient_c=25.0, faults=[CoolingFault("ambient", 15.0, 60.0)]
    )
    cool = simulate(tmp_path / "cool", "rk3588")
    for _ in range(40):
        for simulator in (warm, stepped, cool):
            simulator.advance(1.0)
    assert stepped.state.die_c == pytest.approx(cool.state.die_c, abs=0.01)
    assert warm.state.die_c > cool.state.die_c + 14.0
    for _ in range(600):
        warm.advance(1.0)
        stepped.advance(1.0)
    assert stepped.state.die_c == pytest.approx(warm.state.die_c, abs=0.1)
    sensors = SensorSet.discover(warm.root)
    assert (sensors.sample_temperatures().celsius or 0.0) > 40.0 + 30.0


def test_ina3221_window_holds_its_average_until_the_window_closes() -> None:
    window = ConversionWindow(0.14)
    assert window.add({"cpu": 1.0}, 0.10) == {"cpu": 1.0}  # nothing converted yet: as it was
    assert window.add({"cpu": 3.0}, 0.02) == {"cpu": 1.0}  # the load rose; the window is open
    assert window.add({"cpu": 3.0}, 0.02)["cpu"] == pytest.approx((0.1 + 3 * 0.04) / 0.14)
    assert window.add({"cpu": 3.0}, 0.14) == {"cpu": pytest.approx(3.0)}


def test_ina3221_reports_window_averages_in_whole_lsbs(tmp_path: Path) -> None:
    simulator = simulate(tmp_path, "jetson-orin-nano", load="step:1.0")
    sensors = SensorSet.discover(simulator.root)
    (rail,) = [p for p in sensors.powers if p.name == "VDD_IN"]
    now = 0.0
    for _ in range(40):
        simulator.advance(0.05)
        now += 0.05
    assert rail.read(now) == pytest.approx(simulator.state.input_w, rel=0.02)
    currents = [
        int((path.parent / path.name.replace("in", "curr", 1)).read_text())
        for path in simulator.root.glob("sys/class/hwmon/*/in[123]_input")
    ]
    assert currents and all(milliamps % 8 == 0 for milliamps in currents)


@pytest.mark.parametrize(
    ("profile", "sensor", "step_mc"),
    [("x86-intel", "coretemp", 1000), ("x86-amd", "k10temp", 125)],
)
def test_x86_temperatures_are_quantized_as_the_drivers_report(
    tmp_path: Path, profile: str, sensor: str, step_mc: int
) -> None:
    simulator = simulate(tmp_path, profile)
    values = []
    for _ in range(20):
        simulator.advance(0.5)
        values += [
            int(path.read_text())
            for path in simulator.root.glob("sys/class/hwmon/*/temp*_input")
            if (path.parent / "name").read_text().strip() == sensor
        ]
    assert len(set(values)) > 3 and all(value % step_mc == 0 for value in values)


def test_speed_compresses_thermal_time_not_power(tmp_path: Path) -> None:
    slow = simulate(tmp_path / "slow", "jetson-orin-nano")
    fast = simulate(tmp_path / "fast", "jetson-orin-nano", speed=10.0)
    for _ in range(10):
        slow.advance(1.0)
        fast.advance(0.1)
    assert fast.state.die_c == pytest.approx(slow.state.die_c, abs=0.01)
    assert fast.elapsed_s == pytest.approx(1.0)


def test_state_file_and_sim_command(tmp_path: Path) -> None:
    root = tmp_path / "board"
    sim = [sys.executable, "-m", "mcpd", "sim", "--profile", "rk3588", "--root", str(root)]
    bad = subprocess.run(
        [*sim, "--fault", "vanish:nope"], capture_output=True, text=True, timeout=30
    )
    assert bad.returncode == 2 and "no such sensor" in bad.stderr
    hot = subprocess.run([*sim, "--ambient", "99"], capture_output=True, text=True, timeout=30)
    assert hot.returncode == 2 and "--ambient 99: expected -40 to 60 °C" in hot.stderr
    process = subprocess.Popen([*sim, "--speed", "20", "--ambient", "40"])
    try:
        state_file = root / STATE_FILE
        deadline = 200
        while deadline and not (
            state_file.exists() and json.loads(state_file.read_text())["elapsed_s"] >= 2.0
        ):
            deadline -= 1
            subprocess.run(["sleep", "0.05"], check=True)
        state = json.loads(state_file.read_text())
        assert state["profile"] == "rk3588" and state["sim_s"] >= 40.0 and state["die_c"] > 60.0
        assert state["ambient_c"] == 40.0
    finally:
        process.terminate()
        assert process.wait(timeout=10) == 0


def test_values_change_in_place_as_sysfs_attributes_do(tmp_path: Path) -> None:
    """A reader's kept descriptor reads each new value (pread at 0), as on a board, and the file
    is never replaced under it; anything else (the JSON state file, /proc/stat) is replaced whole,
    so that a reader never sees a new text with an old one's tail."""
    simulator = simulate(tmp_path, "rk3588")
    zone = next((simulator.root / "sys/class/thermal").iterdir()) / "temp"
    state = simulator.root / STATE_FILE
    stat = simulator.root / "proc/stat"
    fd = os.open(zone, os.O_RDONLY)
    try:
        seen, state_inodes, stat_inodes = set(), set(), set()
        for _ in range(5):
            simulator.advance(0.5)
            seen.add(os.pread(fd, 4096, 0))
            assert os.fstat(fd).st_nlink == 1
            state_inodes.add(state.stat().st_ino)
            stat_inodes.add(stat.stat().st_ino)
        assert len(seen) > 1
        assert os.pread(fd, 4096, 0) == zone.read_bytes()
        assert len(state_inodes) > 1 and len(stat_inodes) > 1
    finally:
        os.close(fd)


def test_a_simulated_run_refused_for_its_options_leaves_no_temporary_board(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from mcpd import sim
    from mcpd.cli import main

    monkeypatch.setattr(sim, "MEMORY_DIR", str(tmp_path))
    assert main(["run", "--simulate", "rk3588", "--sim-load", "nonsense"]) == 2
    assert "load 'nonsense'" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
