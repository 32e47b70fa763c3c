"""Power where there is no meter: the Energy Model formula, its device-tree, /proc/stat and
devfreq adapters, and the estimator as the daemon uses it on the simulated boards."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import tomllib

from mcpd.config import ConfigError, parse
from mcpd.sim import PROFILES, LoadSchedule, Simulator
from sensors import SensorSet, cpustat, devfreq_load, devicetree
from sensors.discovery import PowerOptions
from sensors.power_model import (
    LEARN_WEIGHT,
    Activity,
    DomainModel,
    Opp,
    dynamic_watts,
    estimate_watts,
    learned_static,
    volts_at,
)

A76 = DomainModel(
    "policy4", 416.0, 2, (Opp(408_000_000, 675_000), Opp(2_016_000_000, 925_000), Opp(2_400_000_000, 1_000_000))
)  # fmt: skip


def test_dynamic_power_is_the_energy_models_c_v2_f() -> None:
    # 416 µW/MHz/V² × 1.0 V² × 2400 MHz × 2 busy cores (docs/power-estimate.md).
    assert dynamic_watts(A76, Activity(2_400_000, 2.0)) == pytest.approx(1.9968)
    assert dynamic_watts(A76, Activity(2_016_000, 1.0)) == pytest.approx(416 * 0.925**2 * 2016e-6)
    assert dynamic_watts(A76, Activity(2_400_000, 5.0)) == pytest.approx(1.9968)  # ≤ units
    assert estimate_watts((A76,), {}, 3.0) == 3.0  # no activity this interval: idle
    assert estimate_watts((A76,), {"policy4": Activity(2_400_000, 1.0)}, 3.0) == pytest.approx(
        3.9984
    )


def test_voltage_is_that_of_the_lowest_opp_at_or_above_the_frequency() -> None:
    assert volts_at(A76.opps, 408_000) == 0.675
    assert volts_at(A76.opps, 1_200_000) == 0.925
    assert volts_at(A76.opps, 3_000_000) == 1.0


def test_static_term_is_learned_at_idle_only() -> None:
    assert learned_static(None, 5.0, 0.5, busiest=0.05) == 4.5
    assert learned_static(4.0, 5.0, 0.5, busiest=0.05) == pytest.approx(4.0 + LEARN_WEIGHT * 0.5)
    assert learned_static(4.0, 12.0, 0.5, busiest=0.9) == 4.0  # under load the model could hide
    assert learned_static(None, 12.0, 0.5, busiest=0.9) is None


def test_proc_stat_parse_and_busy_fractions(tmp_path: Path) -> None:
    # proc(5): user nice system idle iowait irq softirq steal guest guest_nice.
    head = "cpu  300 0 100 600 0 0 0 0 0 0\ncpu0 200 0 50 250 0 0 0 0 0 0\n"
    assert cpustat.parse(head + "cpu1 100 0 50 350 0 0 0 0 0 0\nintr 1 2 3\n") == {
        0: (250, 500),
        1: (150, 500),
    }
    assert cpustat.parse("cpu0 x y\ncpu1 1 2\n") == {}
    (tmp_path / "proc").mkdir()
    stat = cpustat.CpuStat(tmp_path)
    assert stat.busy() is None  # missing file
    (tmp_path / "proc/stat").write_text(head)
    assert stat.busy() is None  # the first read starts the interval
    (tmp_path / "proc/stat").write_text("cpu0 275 0 50 275 10 0 0 0 0 0\n")
    assert stat.busy() == {0: pytest.approx(75 / 110)}


def test_devfreq_load_rockchip_format() -> None:
    assert devfreq_load.parse("22@300000000Hz") == devfreq_load.DevfreqLoad(0.22, 300_000)
    assert devfreq_load.parse("429496@1000000000Hz") == devfreq_load.DevfreqLoad(1.0, 1_000_000)
    for bad in (None, "", "22", "22@300000000", "-1@3Hz", "007@3Hz", "22@Hz"):
        assert devfreq_load.parse(bad) is None


def rk3588(tmp_path: Path, load: str = "sustained") -> Simulator:
    sim = Simulator(PROFILES["rk3588"], tmp_path / "board", load=LoadSchedule.parse(load))
    sim.build()
    return sim


def test_device_tree_energy_model_of_the_simulated_rk3588(tmp_path: Path) -> None:
    sim = rk3588(tmp_path)
    node = devicetree.cpu_node(sim.root, 4)
    model = devicetree.energy_model(sim.root, "policy4", node, 2)
    assert isinstance(model, DomainModel)
    assert (model.coefficient, len(model.opps)) == (416.0, 11)
    assert volts_at(model.opps, 2_016_000) == 0.925
    gpu = devicetree.energy_model(
        sim.root, "gpu", devicetree.devfreq_node(sim.root, "fb000000.gpu"), 1
    )
    assert isinstance(gpu, DomainModel) and gpu.coefficient == 2982.0
    npu_node = devicetree.devfreq_node(sim.root, "fdab0000.npu")
    assert devicetree.energy_model(sim.root, "npu", npu_node, 1) == (
        "npu: no dynamic-power-coefficient in the device tree"
    )
    phandles = [p.read_bytes() for p in (sim.root / "proc/device-tree").rglob("phandle")]
    assert len(phandles) == len(set(phandles)) == 5  # unique, as dtc makes them
    configured = devicetree.energy_model(sim.root, "npu", npu_node, 1, 3600.0)
    assert isinstance(configured, DomainModel) and configured.coefficient == 3600.0
    # A truncated property is not a value.
    (node / "operating-points-v2").resolve().write_bytes(b"\x00\x00\x11")
    assert devicetree.read_cells(node / "operating-points-v2") is None
    assert devicetree.energy_model(sim.root, "policy4", node, 2) == (
        "policy4: no OPP table with voltages in the device tree"
    )


def test_rk3588_governs_on_the_estimate_within_ten_percent(tmp_path: Path) -> None:
    sim = rk3588(tmp_path, "level:0.5")
    options = PowerOptions(coefficients={"fdab0000.npu": 3600.0})
    sensors = SensorSet.discover(sim.root, power=options)
    assert sensors.power_plan.source == "estimate" and sensors.power_plan.estimated
    now, watts = 0.0, None
    for _ in range(30):
        sim.advance(0.1)
        now += 0.1
        watts = sensors.sample_powers(now).watts
    assert watts == pytest.approx(sim.state.input_w, rel=0.1)
    meter_only = SensorSet.discover(sim.root, power=PowerOptions("meter"))
    assert meter_only.power_plan.source is None and meter_only.estimator is None


def test_a_coefficient_for_no_domain_is_reported_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    sim = rk3588(tmp_path)
    options = PowerOptions(coefficients={"fdab0000.nppu": 3600.0})
    with caplog.at_level(logging.WARNING, "mcpd.sensors"):
        SensorSet.discover(sim.root, power=options)
        SensorSet.discover(sim.root, power=options)
    assert caplog.messages == [
        "[sensors] power_coefficients: no domain 'fdab0000.nppu' on this board"
    ]


def test_a_meter_wins_unless_the_estimate_is_forced(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    sim = Simulator(PROFILES["jetson-orin-nano"], tmp_path / "board")
    sim.build()
    assert SensorSet.discover(sim.root).power_plan.source == "meter"
    with caplog.at_level(logging.ERROR, "mcpd.sensors"):
        forced = SensorSet.discover(sim.root, power=PowerOptions("estimate"))
    # A Jetson's device tree has no Energy Model: the meter stays, and the log says why.
    assert forced.power_plan.source == "meter"
    assert '[sensors] power = "estimate", but no domain can be estimated' in caplog.text


def test_the_estimator_learns_its_static_term_from_a_meter_at_idle(tmp_path: Path) -> None:
    sim = rk3588(tmp_path, "idle")
    sensors = SensorSet.discover(sim.root, power=PowerOptions("estimate", static_w=1.0))
    estimator = sensors.estimator
    assert estimator is not None and estimator.static_w == 1.0
    now = 0.0
    for _ in range(30):
        sim.advance(0.1)
        now += 0.1
        sensors.sample_powers(now)
        estimator.learn(sim.state.input_w)
    assert estimator.learned and estimator.static_w == pytest.approx(3.9, abs=0.2)
    assert sensors.sample_powers(now).watts == pytest.approx(sim.state.input_w, rel=0.03)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('power = "guess"', "sensors.power"),
        ("estimate_static_w = -1.0", "sensors.estimate_static_w"),
        ('power_coefficients = {"fdab0000.npu" = 0.0}', "sensors.power_coefficients"),
    ],
)
def test_bad_power_settings_are_named(text: str, expected: str) -> None:
    with pytest.raises(ConfigError) as error:
        parse(tomllib.loads(f"[sensors]\n{text}\n"), "mcpd.toml")
    assert expected in str(error.value)


def test_power_settings_reach_the_sensors() -> None:
    text = '[sensors]\npower = "estimate"\nestimate_static_w = 2.5\n'
    config = parse(tomllib.loads(text + 'power_coefficients = {"fdab0000.npu" = 3600.0}\n'))
    assert config.sensors.power_options() == PowerOptions("estimate", 2.5, {"fdab0000.npu": 3600.0})


def test_mcpctl_top_marks_an_estimated_power() -> None:
    from mcpd.ctl.top import render
    from tests.support.serving_server import status_document

    frame = render({**status_document(), "power_source": "estimate"}, None, 0)
    assert "power 7.25 W est.   governor holding" in frame
