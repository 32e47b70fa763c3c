"""Section 6 of docs/sysfs.md: what real kernels do to sensor files, and how readers cope.

Error codes come from real read(2) calls through a FUSE overlay of the fixture tree.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from mcpd.governor import board, domains
from sensors import SensorSet
from sensors.hwmon import is_zone_mirror
from sensors.thermal import is_soc_zone
from tests.support.boards import BOARDS, jetson_orin_nano_jp6
from tests.support.fakesys import FakeSysfs

Overlay = Callable[[Path, dict[str, str] | Path], Path]
ZONE = "sys/devices/virtual/thermal/thermal_zone{}/temp"
INA = "sys/devices/platform/bus@0/c240000.i2c/i2c-1/1-0040/hwmon/hwmon2/{}"


@pytest.mark.parametrize("code", ["EINVAL", "ENODATA", "EAGAIN", "EIO", "ENODEV", "ETIMEDOUT"])
def test_zone_read_errors_are_unavailable_samples(
    fake: FakeSysfs, errno_overlay: Overlay, code: str
) -> None:
    """EINVAL: zone mode disabled; ENODATA; EAGAIN: mainline Tegra power-gated zone; EIO: down
    device; ENODEV; ETIMEDOUT (-110, StarFive)."""
    jetson_orin_nano_jp6(fake)
    root = errno_overlay(fake.root, {ZONE.format(8): code})  # tj-thermal
    sensors = SensorSet.discover(root)
    sample = sensors.sample_temperatures()
    readings = {r.name: r.celsius for r in sample.readings}
    assert readings["tj-thermal"] is None
    assert readings["cpu-thermal"] == 41.218
    assert sample.celsius == 41.218  # the hottest of the rest still governs
    assert not sensors.gone  # the file is there: an unavailable sample, not a vanished sensor


def test_disabled_ina3221_channel_enodata(fake: FakeSysfs, errno_overlay: Overlay) -> None:
    jetson_orin_nano_jp6(fake)
    root = errno_overlay(
        fake.root, {INA.format("curr3_input"): "ENODATA", INA.format("in3_input"): "ENODATA"}
    )
    sample = SensorSet.discover(root).sample_powers(0.0)
    assert {r.name: r.watts for r in sample.readings}["VDD_SOC"] is None
    assert sample.watts == pytest.approx(6.005248)


def test_unavailable_board_input_makes_governing_power_unknown(
    fake: FakeSysfs, errno_overlay: Overlay
) -> None:
    jetson_orin_nano_jp6(fake)
    root = errno_overlay(fake.root, {INA.format("curr1_input"): "EIO"})
    sample = SensorSet.discover(root).sample_powers(0.0)
    assert sample.watts is None


def test_rapl_energy_root_only(
    fake: FakeSysfs, errno_overlay: Overlay, caplog: pytest.LogCaptureFixture
) -> None:
    """energy_uj is 0400 since Linux 5.10 (CVE-2020-8694): EACCES for the unprivileged daemon."""
    BOARDS["x86-amd-tctl-only"](fake)
    root = errno_overlay(
        fake.root, {"sys/devices/virtual/powercap/intel-rapl/intel-rapl:0/energy_uj": "EACCES"}
    )
    sensors = SensorSet.discover(root)
    sensors.sample_powers(0.0)
    assert sensors.sample_powers(1.0).watts is None
    assert any("EACCES" in record.getMessage() for record in caplog.records)


@pytest.mark.parametrize(
    ("raw", "celsius"),
    [
        ("-256000\n", None),  # Jetson power-gated zone
        ("-32768000\n", None),  # trip placeholder value
        ("150001\n", None),
        ("-40001\n", None),
        ("-40000\n", -40.0),
        ("150000\n", 150.0),
        ("41468", 41.468),  # no newline
        ("  41468 \n", 41.468),
        ("", None),
        ("N/A\n", None),
    ],
)
def test_temperature_plausibility_and_formats(
    fake: FakeSysfs, raw: str, celsius: float | None
) -> None:
    fake.zone(0, "cpu-thermal", 40000)
    fake.file("sys/devices/virtual/thermal/thermal_zone0/temp", raw)
    sample = SensorSet.discover(fake.root).sample_temperatures()
    assert sample.readings[0].celsius == celsius
    assert sample.celsius == celsius


def test_pmic_die_constant_is_reported_but_never_governs(fake: FakeSysfs) -> None:
    fake.zone(0, "CPU-therm", 40000)
    fake.zone(1, "PMIC-Die", 100000)
    sensors = SensorSet.discover(fake.root)
    sample = sensors.sample_temperatures()
    assert {r.name: r.celsius for r in sample.readings} == {"CPU-therm": 40.0, "PMIC-Die": 100.0}
    assert sample.celsius == 40.0


def test_all_governing_sensors_unavailable_gives_unknown_temperature(fake: FakeSysfs) -> None:
    fake.zone(0, "gpu-thermal", -256000)
    fake.zone(1, "acpitz", 30000)
    assert SensorSet.discover(fake.root).sample_temperatures().celsius is None


@pytest.mark.parametrize(
    ("zone_type", "governs"),
    [
        ("cpu-thermal", True),
        ("CPU-therm", True),
        ("CPU", True),
        ("CV0", True),
        ("SOC2", True),
        ("tj", True),
        ("tj-thermal", True),
        ("AO-therm", True),
        ("Tdiode_tegra", True),
        ("soc-thermal", True),
        ("package-thermal", True),
        ("bigcore2-thermal", True),
        ("npu-thermal", True),
        ("PMIC-Die", False),
        ("thermal-fan-est", False),
        ("Tboard_tegra", False),
        ("acpitz", False),
        ("x86_pkg_temp", False),
        ("iwlwifi_1", False),
        ("INT3400 Thermal", False),
    ],
)
def test_zone_classification_across_name_drift(zone_type: str, governs: bool) -> None:
    """CPU-therm -> cpu-thermal (JP4 -> JP6), upper-case JP5 Orin names, soc -> package (RK3588)."""
    assert is_soc_zone(zone_type) is governs


def test_old_kernel_coretemp_physical_id_governs(fake: FakeSysfs) -> None:
    fake.hwmon(
        1,
        "sys/devices/platform/coretemp.0",
        "coretemp",
        {
            "temp1_label": "Physical id 0",
            "temp1_input": 61000,
            "temp2_label": "Core 0",
            "temp2_input": 60000,
        },
    )
    sensors = SensorSet.discover(fake.root)
    assert sensors.governing_names == {"coretemp/Physical id 0", "coretemp/Core 0"}
    assert sensors.sample_temperatures().celsius == 61.0


def test_two_coretemp_packages_are_told_apart(fake: FakeSysfs) -> None:
    for package in (0, 1):
        fake.hwmon(
            package + 4,
            f"sys/devices/platform/coretemp.{package}",
            "coretemp",
            {
                "temp1_label": f"Package id {package}",
                "temp1_input": 50000 + package * 1000,
                "temp2_label": "Core 0",
                "temp2_input": 49000,
            },
        )
    names = {s.name for s in SensorSet.discover(fake.root).temperatures}
    assert names == {
        "coretemp.coretemp.0/Package id 0",
        "coretemp.coretemp.0/Core 0",
        "coretemp.coretemp.1/Package id 1",
        "coretemp.coretemp.1/Core 0",
    }


@pytest.mark.parametrize(
    ("name", "mirror"),
    [
        ("soc_thermal", True),
        ("soc_thermal_0", True),
        ("package_thermal_12", True),
        ("acpitz", True),
        ("coretemp", False),
        ("nvme", False),
        ("soc_thermal_x", False),
    ],
)
def test_zone_mirror_names(name: str, mirror: bool) -> None:
    assert is_zone_mirror(name, {"soc-thermal", "package-thermal", "acpitz"}) is mirror


def test_mirror_without_its_zone_stands_in(fake: FakeSysfs) -> None:
    """A kernel without the thermal class exported still has the hwmon mirror."""
    fake.hwmon(
        0, "sys/devices/virtual/thermal/thermal_zone0", "soc_thermal", {"temp1_input": 47000}
    )
    sensors = SensorSet.discover(fake.root)
    assert sensors.governing_names == {"soc_thermal/temp1"}
    assert sensors.sample_temperatures().celsius == 47.0


def test_jp4_iio_and_jp5_hwmon_drivers_give_the_same_rails(fake: FakeSysfs, tmp_path: Path) -> None:
    """ina3221x (iio, rail_name_N, mW) became ina3221 (hwmon, inN_label, mV x mA)."""
    jp4 = {r.name for r in SensorSet.discover(fake.root).powers}
    assert jp4 == set()
    BOARDS["jetson-nano-jp4"](fake)
    assert {(p.name, p.role, p.source) for p in SensorSet.discover(fake.root).powers} == {
        ("POM_5V_IN", "input", "iio:ina3221x"),
        ("POM_5V_GPU", "rail", "iio:ina3221x"),
        ("POM_5V_CPU", "rail", "iio:ina3221x"),
    }


@pytest.mark.parametrize(
    ("name", "of_node", "governed"),
    [
        ("17000000.gpu", "gpu", True),
        ("17000000.ga10b", "ga10b", True),
        ("17000000.gv11b", None, True),
        ("57000000.gpu", None, True),
        ("fb000000.gpu", None, True),
        ("fb000000.gpu-mali", None, True),
        ("fdab0000.npu", None, True),
        ("gpu-gpc-0", None, True),
        ("dmc", None, False),
        ("fb000000.bus", "ga10b", True),
        ("ff9a0000.vpu", None, False),
    ],
)
def test_devfreq_name_drift(
    fake: FakeSysfs, name: str, of_node: str | None, governed: bool
) -> None:
    fake.devfreq(
        name, f"sys/devices/platform/{name}", (100000000, 200000000), "simple_ondemand", of_node
    )
    assert [d.name for d in domains.discover(fake.root)] == ([name] if governed else [])


def test_hwmon_renumbered_is_noticed_and_rediscovered(fake: FakeSysfs) -> None:
    """INA3221 has been seen as hwmon1, 2 and 3: after a renumbering the old path vanishes."""
    jetson_orin_nano_jp6(fake)
    sensors = SensorSet.discover(fake.root)
    assert sensors.sample_powers(0.0).watts == pytest.approx(6.005248)
    fake.renumber_hwmon("sys/devices/platform/bus@0/c240000.i2c/i2c-1/1-0040", 2, 7)
    assert sensors.sample_powers(0.1).watts is None
    assert sensors.gone
    again = SensorSet.discover(fake.root)
    assert again.sample_powers(0.2).watts == pytest.approx(6.005248)
    assert not again.gone


def test_gpu_devfreq_appearing_after_start_is_found_on_rediscovery(fake: FakeSysfs) -> None:
    """jtop#889: the Jetson GPU devfreq node can appear after the daemon starts."""
    fake.cpufreq(0, (0, 1), 115200, 1510400, (115200, 1510400))
    assert [d.name for d in domains.discover(fake.root)] == ["policy0"]
    fake.devfreq(
        "17000000.gpu",
        "sys/devices/platform/bus@0/17000000.gpu",
        (306000000, 624750000),
        "nvhost_podgov",
        "gpu",
    )
    assert [d.name for d in domains.discover(fake.root)] == ["policy0", "17000000.gpu"]


def test_offline_cpu_policy(fake: FakeSysfs) -> None:
    """nvpmodel offlines cores: scaling_cur_freq may be non-numeric, the policy may vanish."""
    rel = fake.cpufreq(4, (4, 5), 115200, 1510400, (115200, 1510400))
    fake.file(f"{rel}/scaling_cur_freq", "<unknown>\n")
    (domain,) = domains.discover(fake.root)
    assert domain.read_cur_mhz() is None
    shutil.rmtree(fake.root / rel)
    assert domain.read_cap_mhz() is None
    with pytest.raises(domains.DomainWriteError):
        domain.change_cap(500)


def test_device_tree_and_release_formats(fake: FakeSysfs) -> None:
    fake.device_tree(
        ("nvidia,p3768-0000+p3767-0005-super", "nvidia,p3767-0005", "nvidia,tegra234"), "X\0"
    )
    fake.file("etc/nv_tegra_release", "# R36 (release), REVISION: 4.7, GCID: 1\n")
    detected = board.detect(fake.root)
    assert detected.compatible == (
        "nvidia,p3768-0000+p3767-0005-super",
        "nvidia,p3767-0005",
        "nvidia,tegra234",
    )
    assert (detected.platform, detected.l4t) == ("jetson-orin", "R36.4.7")


def test_errors_are_logged_once_not_per_sample(
    fake: FakeSysfs, caplog: pytest.LogCaptureFixture
) -> None:
    fake.zone(0, "gpu-thermal", 151000)  # above 150 °C: no die reads that and lives
    sensors = SensorSet.discover(fake.root)
    caplog.set_level(logging.WARNING)
    for _ in range(50):
        sensors.sample_temperatures()
    assert len(caplog.records) == 1
    assert "implausible value 151000" in caplog.records[0].getMessage()


def test_a_power_gated_zone_is_no_reading_and_no_fault(
    fake: FakeSysfs, caplog: pytest.LogCaptureFixture
) -> None:
    """A Jetson GPU zone reads -256000 whenever the GPU idles (docs/sysfs.md §6.2): an idle-busy
    GPU must not be an outage logged every time it idles, nor a fault that re-opens the file."""
    fake.zone(0, "cpu-thermal", 50000)
    gpu = fake.zone(1, "gpu-thermal", -256000)
    sensors = SensorSet.discover(fake.root)
    caplog.set_level(logging.INFO)
    seen = []
    for temp in (-256000, 61500, -256000, 62000, -256000):
        fake.values(gpu, {"temp": temp})
        seen.append({r.name: r.celsius for r in sensors.sample_temperatures().readings})
    assert [s["gpu-thermal"] for s in seen] == [None, 61.5, None, 62.0, None]
    assert [s["cpu-thermal"] for s in seen] == [50.0] * 5
    assert caplog.records == []
    assert not any(s.attributes[0].failing for s in sensors.temperatures)
