"""RAPL: power from energy-counter deltas, across the wraparound at max_energy_range_uj."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sensors.rapl import RaplZone, discover
from sensors.sysfs import Attribute
from tests.support.fakesys import FakeSysfs

INTEL_MAX = 262_143_328_850
AMD_MAX = 65_532_610_987


def zone(tmp_path: Path, energy: int, max_range: int | None) -> tuple[RaplZone, Path]:
    path = tmp_path / "energy_uj"
    path.write_text(f"{energy}\n")
    return RaplZone("package-0", Attribute(path), max_range, "package"), path


@given(
    max_range=st.sampled_from([INTEL_MAX, AMD_MAX]),
    start=st.integers(min_value=0, max_value=AMD_MAX - 1),
    delta=st.integers(min_value=0, max_value=50_000_000_000),
    elapsed=st.floats(min_value=0.01, max_value=1000.0),
)
def test_power_from_delta_with_at_most_one_wrap(
    tmp_path_factory: pytest.TempPathFactory, max_range: int, start: int, delta: int, elapsed: float
) -> None:
    rapl, path = zone(tmp_path_factory.mktemp("rapl"), start, max_range)
    assert rapl.read(100.0) is None  # the first read only starts the interval
    path.write_text(f"{(start + delta) % max_range}\n")
    watts = rapl.read(100.0 + elapsed)
    expected = delta / 1e6 / elapsed
    if expected <= 2000.0:
        assert watts == pytest.approx(expected, rel=1e-9, abs=1e-9)
    else:
        assert watts is None  # beyond any board: a counter reset, not power


def test_wrap_on_intel_counter(tmp_path: Path) -> None:
    rapl, path = zone(tmp_path, INTEL_MAX - 3_000_000, INTEL_MAX)
    rapl.read(0.0)
    path.write_text("7000000\n")
    assert rapl.read(0.1) == pytest.approx(100.0)


def test_unknown_range_makes_a_wrapped_sample_unavailable(tmp_path: Path) -> None:
    rapl, path = zone(tmp_path, 9_000_000, None)
    rapl.read(0.0)
    path.write_text("1000\n")
    assert rapl.read(1.0) is None
    path.write_text("2001000\n")
    assert rapl.read(2.0) == pytest.approx(2.0)


def test_a_failed_read_keeps_the_last_good_sample(tmp_path: Path) -> None:
    rapl, path = zone(tmp_path, 1_000_000, INTEL_MAX)
    rapl.read(0.0)
    path.write_text("garbage\n")
    assert rapl.read(0.1) is None
    path.write_text("3000000\n")
    assert rapl.read(1.0) == pytest.approx(2.0)


def test_same_instant_gives_no_reading(tmp_path: Path) -> None:
    rapl, path = zone(tmp_path, 1_000_000, INTEL_MAX)
    rapl.read(5.0)
    path.write_text("2000000\n")
    assert rapl.read(5.0) is None
    assert rapl.read(6.0) == pytest.approx(1.0)


def test_discovery_names_subzones_under_their_package_and_skips_mmio(fake: FakeSysfs) -> None:
    fake.rapl("0", "package-0", 1, INTEL_MAX)
    fake.rapl("0:0", "core", 1, INTEL_MAX)
    fake.rapl("1", "package-1", 1, INTEL_MAX)
    fake.rapl("1:0", "core", 1, INTEL_MAX)
    # intel-rapl-mmio duplicates package-0 on newer Intel parts.
    fake.values(
        "sys/devices/virtual/powercap/intel-rapl-mmio/intel-rapl-mmio:0",
        {"name": "package-0", "energy_uj": 1},
    )
    fake.link(
        "sys/class/powercap/intel-rapl-mmio:0",
        "sys/devices/virtual/powercap/intel-rapl-mmio/intel-rapl-mmio:0",
    )
    found = {(z.name, z.role) for z in discover(fake.root)}
    assert found == {
        ("package-0", "package"),
        ("package-0/core", "subzone"),
        ("package-1", "package"),
        ("package-1/core", "subzone"),
    }
