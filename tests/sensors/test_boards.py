"""Every board layout of docs/sysfs.md: exact readings, governing choices, domains, platform."""

from __future__ import annotations

import pytest

from mcpd.governor import board, domains
from sensors import SensorSet
from tests.support.boards import BOARDS
from tests.support.fakesys import FakeSysfs


@pytest.mark.parametrize("name", sorted(BOARDS))
def test_board_readings(fake: FakeSysfs, name: str) -> None:
    expected = BOARDS[name](fake)
    sensors = SensorSet.discover(fake.root)
    sensors.sample_powers(0.0)
    for zone_id, energy in expected.energy_after_1s.items():
        (fake.root / f"sys/class/powercap/intel-rapl:{zone_id}/energy_uj").write_text(f"{energy}\n")
    powers = sensors.sample_powers(1.0)
    temperatures = sensors.sample_temperatures()

    assert {r.name: r.celsius for r in temperatures.readings} == pytest.approx(
        expected.temperatures
    )
    assert sensors.governing_names == expected.governing
    assert temperatures.celsius == pytest.approx(expected.temperature_c)
    assert {r.name: r.watts for r in powers.readings} == pytest.approx(expected.powers)
    assert powers.watts == pytest.approx(expected.power_w)
    assert powers.estimated is expected.power_estimated


@pytest.mark.parametrize("name", sorted(BOARDS))
def test_board_platform_and_domains(fake: FakeSysfs, name: str) -> None:
    expected = BOARDS[name](fake)
    detected = board.detect(fake.root)
    assert detected.platform == expected.platform
    assert detected.l4t == expected.l4t
    found = {
        d.name: (d.kind, d.min_mhz, d.max_mhz, d.read_cap_mhz(), len(d.available_mhz))
        for d in domains.discover(fake.root)
    }
    assert found == expected.domains
