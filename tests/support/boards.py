"""Fixture trees of real boards (transcribed from docs/sysfs.md) and the exact readings expected.

hwmon and thermal_zone numbers are deliberately scattered and differ between boards: nothing may
depend on them (docs/sysfs.md §6.5).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from tests.support.fakesys import FakeSysfs

ORIN_GPU_HZ = (
    114750000, 216750000, 318750000, 420750000, 522750000, 624750000, 726750000, 828750000,
    930750000, 1032750000, 1134750000, 1236750000, 1300500000,
)  # fmt: skip
ORIN_CPU_KHZ = (
    115200, 192000, 268800, 345600, 422400, 499200, 576000, 652800, 729600, 806400, 883200, 960000,
    1036800, 1113600, 1190400, 1267200, 1344000, 1420800, 1497600, 1574400, 1651200, 1728000,
    1804800, 1881600, 1958400, 2035200, 2112000, 2201600,
)  # fmt: skip
NANO_CPU_KHZ = (
    102000, 204000, 307200, 403200, 518400, 614400, 710400, 825600, 921600, 1036800, 1132800,
    1224000, 1326000, 1428000, 1479000,
)  # fmt: skip
NANO_GPU_HZ = (
    76800000, 153600000, 230400000, 307200000, 384000000, 460800000, 537600000, 614400000,
    691200000, 768000000, 844800000, 921600000,
)  # fmt: skip
RK_A55_KHZ = (408000, 600000, 816000, 1008000, 1200000, 1416000, 1608000, 1800000)
RK_A76_KHZ = (408000, 600000, 816000, 1008000, 1200000, 1416000, 1608000, 1800000, 2016000, 2208000)
RK_GPU_HZ = (
    300000000,
    400000000,
    500000000,
    600000000,
    700000000,
    800000000,
    900000000,
    1000000000,
)
# The RK3588's cap files the tests read most: the A76 cluster's and the NPU's.
POLICY4 = "sys/devices/system/cpu/cpufreq/policy4/scaling_max_freq"
NPU = "sys/devices/platform/fdab0000.npu/devfreq/fdab0000.npu/max_freq"
INTEL_RAPL_MAX = 262143328850
AMD_RAPL_MAX = 65532610987
JP6_RELEASE = (
    "# R36 (release), REVISION: 4.7, GCID: 42132812, BOARD: generic, EABI: aarch64, "
    "DATE: Thu Sep 18 22:54:44 UTC 2025\n# KERNEL_VARIANT: oot\n"
)
I2C1 = "sys/devices/platform/bus@0/c240000.i2c/i2c-1"


@dataclass(frozen=True)
class Expected:
    platform: str
    temperatures: dict[str, float | None]
    governing: frozenset[str]
    temperature_c: float | None
    powers: dict[str, float | None]
    power_w: float | None
    power_estimated: bool
    domains: dict[str, tuple[str, float, float, float, int]]
    """name -> (kind, min MHz, max MHz, cap MHz, table length)."""
    l4t: str | None = None
    energy_after_1s: dict[str, int] = field(default_factory=dict)
    """RAPL energy_uj values (by zone id) written before the second sample, one second later."""


def ina3221(
    fs: FakeSysfs, number: int, client: str, channels: dict[int, tuple[str | None, int, int]]
) -> None:
    """An INA3221 as the mainline hwmon driver shows it: channel -> (label, mV, mA)."""
    device = f"{I2C1}/{client}"
    fs.i2c_client(client, device, "ina3221", "ina3221")
    attrs: dict[str, str | int] = {
        "samples": 512,
        "update_interval": 140,
        "in7_label": "sum of shunt voltages",
    }
    shunt_sum = 0
    for channel, (label, millivolts, milliamps) in channels.items():
        if label is not None:
            attrs[f"in{channel}_label"] = label
        attrs[f"in{channel}_input"] = millivolts
        attrs[f"curr{channel}_input"] = milliamps
        attrs[f"in{channel + 3}_input"] = milliamps * 5  # µV over the 5 mΩ shunt
        attrs[f"shunt{channel}_resistor"] = 5000
        attrs[f"curr{channel}_max"] = 32760
        attrs[f"curr{channel}_crit"] = 32760
        attrs[f"in{channel}_enable"] = 1 if label is not None else 0
        shunt_sum += milliamps * 5
    attrs["in7_input"] = shunt_sum
    fs.hwmon(number, device, "ina3221", attrs)


def iio_ina3221x(
    fs: FakeSysfs, client: str, device: str, iio: str, rails: list[tuple[str, int, int, int]]
) -> None:
    """JetPack 4's ina3221x IIO device: rails of (name, mW, mA, mV)."""
    directory = f"{device}/{iio}"
    fs.values(directory, {"name": "ina3221x"})
    fs.link(f"sys/bus/i2c/drivers/ina3221x/{client}", device)
    for index, (name, milliwatts, milliamps, millivolts) in enumerate(rails):
        fs.values(
            directory,
            {
                f"rail_name_{index}": name,
                f"in_power{index}_input": milliwatts,
                f"in_current{index}_input": milliamps,
                f"in_voltage{index}_input": millivolts,
                f"crit_current_limit_{index}": "32760 ma",
                f"warn_current_limit_{index}": "32760 ma",
            },
        )


def jetson_orin_nano_jp6(fs: FakeSysfs) -> Expected:
    fs.device_tree(
        ("nvidia,p3768-0000+p3767-0005", "nvidia,tegra234"),
        "NVIDIA Jetson Orin Nano Engineering Reference Developer Kit Super",
    )
    fs.file("etc/nv_tegra_release", JP6_RELEASE)
    fs.cpuinfo(None, 6)
    zones = [
        ("cpu-thermal", 41218), ("gpu-thermal", -256000), ("cv0-thermal", -256000),
        ("cv1-thermal", -256000), ("cv2-thermal", -256000), ("soc0-thermal", 40156),
        ("soc1-thermal", 40468), ("soc2-thermal", 39875), ("tj-thermal", 41468),
    ]  # fmt: skip
    for number, (zone_type, temp) in enumerate(zones):
        fs.zone(number, zone_type, temp)
    ina3221(
        fs,
        2,
        "1-0040",
        {1: ("VDD_IN", 5072, 1184), 2: ("VDD_CPU_GPU_CV", 5064, 328), 3: ("VDD_SOC", 5056, 412)},
    )
    table = (*ORIN_CPU_KHZ[:19], 1510400)
    fs.cpufreq(0, (0, 1, 2, 3), 115200, 1510400, table, "tegra194")
    fs.cpufreq(4, (4, 5), 115200, 1510400, table, "tegra194")
    fs.devfreq(
        "17000000.gpu",
        "sys/devices/platform/bus@0/17000000.gpu",
        ORIN_GPU_HZ[:6],
        "nvhost_podgov",
        "gpu",
    )
    temperatures: dict[str, float | None] = {
        t: (None if v == -256000 else v / 1000) for t, v in zones
    }
    return Expected(
        platform="jetson-orin",
        temperatures=temperatures,
        governing=frozenset(temperatures),
        temperature_c=41.468,
        powers={"VDD_IN": 6.005248, "VDD_CPU_GPU_CV": 1.660992, "VDD_SOC": 2.083072},
        power_w=6.005248,
        power_estimated=False,
        domains={
            "policy0": ("cpufreq", 115.2, 1510.4, 1510.4, 20),
            "policy4": ("cpufreq", 115.2, 1510.4, 1510.4, 20),
            "17000000.gpu": ("devfreq", 114.75, 624.75, 624.75, 6),
        },
        l4t="R36.4.7",
    )


def jetson_agx_orin_jp6(fs: FakeSysfs) -> Expected:
    fs.device_tree(("nvidia,p3737-0000+p3701-0005", "nvidia,p3701-0005", "nvidia,tegra234"),
                   "NVIDIA Jetson AGX Orin Developer Kit")  # fmt: skip
    fs.file("etc/nv_tegra_release", JP6_RELEASE)
    fs.cpuinfo(None, 12)
    # Same zone types as Orin Nano, another order: they are found by type.
    zones = [
        ("tj-thermal", 52500),
        ("cpu-thermal", 52000),
        ("soc0-thermal", 48000),
        ("gpu-thermal", 50250),
    ]
    for number, (zone_type, temp) in enumerate(zones):
        fs.zone(number, zone_type, temp)
    # Two monitors, the second enumerated first; NC channels as NVIDIA's device tree labels them.
    ina3221(
        fs,
        3,
        "1-0040",
        {
            1: ("VDD_GPU_SOC", 5000, 478),
            2: ("VDD_CPU_CV", 4976, 160),
            3: ("VIN_SYS_5V0", 5032, 700),
        },
    )
    ina3221(fs, 1, "1-0041", {1: ("NC", 0, 0), 2: ("VDDQ_VDD2_1V8AO", 4992, 60), 3: ("NC", 0, 0)})
    for number in (0, 4, 8):
        fs.cpufreq(
            number, tuple(range(number, number + 4)), 115200, 2201600, ORIN_CPU_KHZ, "tegra194"
        )
    fs.devfreq(
        "17000000.gpu",
        "sys/devices/platform/bus@0/17000000.gpu",
        ORIN_GPU_HZ,
        "nvhost_podgov",
        "gpu",
    )
    rails = {
        "VDD_GPU_SOC": 2.39,
        "VDD_CPU_CV": 0.79616,
        "VIN_SYS_5V0": 3.5224,
        "VDDQ_VDD2_1V8AO": 0.29952,
    }
    return Expected(
        platform="jetson-orin",
        temperatures={t: v / 1000 for t, v in zones},
        governing=frozenset(t for t, _ in zones),
        temperature_c=52.5,
        powers=rails,
        power_w=sum(rails.values()),
        power_estimated=True,
        domains={
            **{f"policy{n}": ("cpufreq", 115.2, 2201.6, 2201.6, 28) for n in (0, 4, 8)},
            "17000000.gpu": ("devfreq", 114.75, 1300.5, 1300.5, 13),
        },
        l4t="R36.4.7",
    )


def jetson_xavier_nx_jp5(fs: FakeSysfs) -> Expected:
    fs.device_tree(("nvidia,p3509-0000+p3668-0001", "nvidia,p3668-0001", "nvidia,tegra194"),
                   "NVIDIA Jetson Xavier NX Developer Kit")  # fmt: skip
    fs.file(
        "etc/nv_tegra_release",
        "# R35 (release), REVISION: 4.1, GCID: 33958178, BOARD: t186ref, EABI: aarch64\n",
    )
    zones = [
        ("CPU-therm", 38500), ("GPU-therm", 37500), ("AUX-therm", 37000), ("AO-therm", 38000),
        ("PMIC-Die", 100000), ("Tboard_tegra", 32000), ("Tdiode_tegra", 35250), ("thermal-fan-est", 37450),
    ]  # fmt: skip
    for number, (zone_type, temp) in enumerate(zones):
        fs.zone(number, zone_type, temp)
    device = "sys/devices/platform/c250000.i2c/i2c-7/7-0040"
    fs.i2c_client("7-0040", device, "ina3221", "ina3221")
    fs.hwmon(5, device, "ina3221", {
        "in1_label": "VDD_IN", "in1_input": 5000, "curr1_input": 800,
        "in2_label": "VDD_CPU_GPU_CV", "in2_input": 5000, "curr2_input": 200,
        "in3_label": "VDD_SOC", "in3_input": 5000, "curr3_input": 250,
    })  # fmt: skip
    table = (*ORIN_CPU_KHZ[:24], 1907200)
    for number in (0, 2, 4):
        fs.cpufreq(number, (number, number + 1), 115200, 1907200, table, "tegra194")
    # JP5 path and name; table approximated from the AGX Xavier list, cut at Xavier NX's max.
    fs.devfreq("17000000.gv11b", "sys/devices/17000000.gv11b",
               (114750000, 216750000, 318750000, 420750000, 522750000, 624750000, 675750000, 828750000,
                905250000, 1032750000, 1109250000), "nvhost_podgov", "gv11b")  # fmt: skip
    return Expected(
        platform="jetson-xavier",
        temperatures={t: v / 1000 for t, v in zones},
        governing=frozenset({"CPU-therm", "GPU-therm", "AUX-therm", "AO-therm", "Tdiode_tegra"}),
        temperature_c=38.5,
        powers={"VDD_IN": 4.0, "VDD_CPU_GPU_CV": 1.0, "VDD_SOC": 1.25},
        power_w=4.0,
        power_estimated=False,
        domains={
            **{f"policy{n}": ("cpufreq", 115.2, 1907.2, 1907.2, 25) for n in (0, 2, 4)},
            "17000000.gv11b": ("devfreq", 114.75, 1109.25, 1109.25, 11),
        },
        l4t="R35.4.1",
    )


def jetson_nano_jp4(fs: FakeSysfs) -> Expected:
    fs.device_tree(
        ("nvidia,p3450-0000", "nvidia,jetson-nano", "nvidia,tegra210"),
        "NVIDIA Jetson Nano Developer Kit",
    )
    fs.file(
        "etc/nv_tegra_release",
        "# R32 (release), REVISION: 7.4, GCID: 33514132, BOARD: t210ref, EABI: aarch64\n",
    )
    zones = [
        ("AO-therm", 36500), ("CPU-therm", 38000), ("GPU-therm", 36000), ("PLL-therm", 35500),
        ("PMIC-Die", 100000), ("thermal-fan-est", 36950),
    ]  # fmt: skip
    for number, (zone_type, temp) in enumerate(zones):
        fs.zone(number, zone_type, temp)
    # tegrastats on the same board: POM_5V_IN 933/933 POM_5V_GPU 0/0 POM_5V_CPU 84/84.
    iio_ina3221x(fs, "6-0040", "sys/devices/7000c400.i2c/i2c-6/6-0040", "iio:device0",
                 [("POM_5V_IN", 933, 187, 4992), ("POM_5V_GPU", 0, 0, 4992), ("POM_5V_CPU", 84, 17, 4992)])  # fmt: skip
    fs.cpufreq(0, (0, 1, 2, 3), 102000, 1479000, NANO_CPU_KHZ, "tegra210")
    fs.devfreq("57000000.gpu", "sys/devices/57000000.gpu", NANO_GPU_HZ, "nvhost_podgov", "gpu")
    return Expected(
        platform="jetson-nano",
        temperatures={t: v / 1000 for t, v in zones},
        governing=frozenset({"AO-therm", "CPU-therm", "GPU-therm", "PLL-therm"}),
        temperature_c=38.0,
        powers={"POM_5V_IN": 0.933, "POM_5V_GPU": 0.0, "POM_5V_CPU": 0.084},
        power_w=0.933,
        power_estimated=False,
        domains={
            "policy0": ("cpufreq", 102.0, 1479.0, 1479.0, 15),
            "57000000.gpu": ("devfreq", 76.8, 921.6, 921.6, 12),
        },
        l4t="R32.7.4",
    )


def jetson_agx_xavier_jp4(fs: FakeSysfs) -> Expected:
    fs.device_tree(("nvidia,p2972-0000", "nvidia,galen", "nvidia,tegra194"), "Jetson-AGX")
    zones = [
        ("AO-therm", 36000), ("CPU-therm", 39000), ("GPU-therm", 38000), ("AUX-therm", 37500),
        ("PMIC-Die", 100000), ("Tboard_tegra", 33000), ("Tdiode_tegra", 36750), ("thermal-fan-est", 37900),
        ("iwlwifi_1", 34000),
    ]  # fmt: skip
    for number, (zone_type, temp) in enumerate(zones):
        fs.zone(number, zone_type, temp)
    iio_ina3221x(
        fs,
        "1-0040",
        "sys/devices/3160000.i2c/i2c-1/1-0040",
        "iio:device0",
        [("GPU", 1234, 247, 4992), ("CPU", 987, 198, 4992), ("SOC", 1543, 309, 4992)],
    )
    iio_ina3221x(fs, "1-0041", "sys/devices/3160000.i2c/i2c-1/1-0041", "iio:device1",
                 [("CV", 0, 0, 4992), ("VDDRQ", 456, 91, 4992), ("SYS5V", 2789, 558, 4992)])  # fmt: skip
    for number in (0, 2, 4, 6):
        fs.cpufreq(number, (number, number + 1), 115200, 2265600, None, "tegra194")
    rails = {"GPU": 1.234, "CPU": 0.987, "SOC": 1.543, "CV": 0.0, "VDDRQ": 0.456, "SYS5V": 2.789}
    return Expected(
        platform="jetson-xavier",
        temperatures={t: v / 1000 for t, v in zones},
        governing=frozenset({"AO-therm", "CPU-therm", "GPU-therm", "AUX-therm", "Tdiode_tegra"}),
        temperature_c=39.0,
        powers=rails,
        power_w=sum(rails.values()),
        power_estimated=True,
        domains={f"policy{n}": ("cpufreq", 115.2, 2265.6, 2265.6, 0) for n in (0, 2, 4, 6)},
    )


RK_BSP_ZONES = [
    ("soc-thermal", 35200), ("bigcore0-thermal", 36100), ("bigcore1-thermal", 35900),
    ("littlecore-thermal", 35000), ("center-thermal", 34800), ("gpu-thermal", 34600), ("npu-thermal", 34400),
]  # fmt: skip


def rk3588_bsp(fs: FakeSysfs) -> Expected:
    fs.device_tree(("radxa,rock-5b", "rockchip,rk3588"), "Radxa ROCK 5 Model B")
    fs.cpuinfo(None, 8)
    for number, (zone_type, temp) in enumerate(RK_BSP_ZONES):
        rel = fs.zone(number, zone_type, temp)
        # The thermal core's hwmon mirror of every zone (htop#1404); crit only on soc.
        mirror = {"temp1_input": temp} | ({"temp1_crit": 115000} if number == 0 else {})
        fs.hwmon(number + 2, rel, zone_type.replace("-", "_"), mirror)
    fs.values("sys/devices/virtual/thermal/thermal_zone0", {
        "trip_point_0_temp": 75000, "trip_point_0_type": "passive", "trip_point_1_temp": 85000,
        "trip_point_1_type": "passive", "trip_point_2_temp": 115000, "trip_point_2_type": "critical",
    })  # fmt: skip
    fs.cpufreq(0, (0, 1, 2, 3), 408000, 1800000, RK_A55_KHZ)
    fs.cpufreq(4, (4, 5), 408000, 2208000, RK_A76_KHZ)
    fs.cpufreq(6, (6, 7), 408000, 2400000, (*RK_A76_KHZ, 2256000, 2304000, 2352000, 2400000))
    gpu = fs.devfreq(
        "fb000000.gpu", "sys/devices/platform/fb000000.gpu", RK_GPU_HZ, "simple_ondemand"
    )
    fs.values(gpu, {"load": "22@300000000Hz"})
    fs.devfreq("fdab0000.npu", "sys/devices/platform/fdab0000.npu", RK_GPU_HZ, "rknpu_ondemand")
    fs.devfreq(
        "dmc",
        "sys/devices/platform/dmc",
        (528000000, 1068000000, 1560000000, 2750000000),
        "dmc_ondemand",
    )
    return Expected(
        platform="rk3588",
        temperatures={t: v / 1000 for t, v in RK_BSP_ZONES},
        governing=frozenset(t for t, _ in RK_BSP_ZONES),
        temperature_c=36.1,
        powers={},
        power_w=None,
        power_estimated=False,
        domains={
            "policy0": ("cpufreq", 408.0, 1800.0, 1800.0, 8),
            "policy4": ("cpufreq", 408.0, 2208.0, 2208.0, 10),
            "policy6": ("cpufreq", 408.0, 2400.0, 2400.0, 14),
            "fb000000.gpu": ("devfreq", 300.0, 1000.0, 1000.0, 8),
            "fdab0000.npu": ("devfreq", 300.0, 1000.0, 1000.0, 8),
        },
    )


def rk3588_mainline(fs: FakeSysfs) -> Expected:
    fs.device_tree(("radxa,rock-5b", "rockchip,rk3588"), "Radxa ROCK 5B")
    zones = [
        ("package-thermal", 38500), ("bigcore0-thermal", 39400), ("bigcore2-thermal", 39000),
        ("littlecore-thermal", 37800), ("center-thermal", 37600), ("gpu-thermal", 37000), ("npu-thermal", 36900),
    ]  # fmt: skip
    for number, (zone_type, temp) in enumerate(zones):
        rel = fs.zone(number, zone_type, temp)
        # 2026 thermal_hwmon patch: mirror names get the zone id appended.
        fs.hwmon(number, rel, f"{zone_type.replace('-', '_')}_{number}", {"temp1_input": temp})
    fs.cpufreq(0, (0, 1, 2, 3), 408000, 1800000, RK_A55_KHZ)
    fs.cpufreq(4, (4, 5), 408000, 2208000, RK_A76_KHZ)
    fs.cpufreq(6, (6, 7), 408000, 2208000, RK_A76_KHZ)
    fs.devfreq(
        "fb000000.gpu-mali", "sys/devices/platform/fb000000.gpu-mali", RK_GPU_HZ, "simple_ondemand"
    )
    return Expected(
        platform="rk3588",
        temperatures={t: v / 1000 for t, v in zones},
        governing=frozenset(t for t, _ in zones),
        temperature_c=39.4,
        powers={},
        power_w=None,
        power_estimated=False,
        domains={
            "policy0": ("cpufreq", 408.0, 1800.0, 1800.0, 8),
            "policy4": ("cpufreq", 408.0, 2208.0, 2208.0, 10),
            "policy6": ("cpufreq", 408.0, 2208.0, 2208.0, 10),
            "fb000000.gpu-mali": ("devfreq", 300.0, 1000.0, 1000.0, 8),
        },
    )


def x86_intel_laptop(fs: FakeSysfs) -> Expected:
    fs.cpuinfo("GenuineIntel", 4)
    fs.values("sys/devices/virtual/dmi/id", {"sys_vendor": "LENOVO", "product_name": "20XW0055GE"})
    fs.link("sys/class/dmi/id", "sys/devices/virtual/dmi/id")
    acpitz = fs.zone(0, "acpitz", 27800)
    fs.zone(1, "INT3400 Thermal", 20000)
    fs.zone(2, "x86_pkg_temp", 52000)
    wifi = fs.zone(3, "iwlwifi_1", 38000)
    fs.hwmon(0, acpitz, "acpitz", {"temp1_input": 27800, "temp1_crit": 128000})
    fs.hwmon(4, wifi, "iwlwifi_1", {"temp1_input": 38000})
    nvme = "sys/devices/pci0000:00/0000:00:1d.0/0000:04:00.0/nvme/nvme0"
    fs.hwmon(1, nvme, "nvme", {"temp1_label": "Composite", "temp1_input": 33850, "temp1_crit": 84850,
                               "temp2_label": "Sensor 1", "temp2_input": 33850})  # fmt: skip
    # Core ids with a gap (temp index = core id + 2), as on parts with disabled cores.
    fs.hwmon(3, "sys/devices/platform/coretemp.0", "coretemp", {
        "temp1_label": "Package id 0", "temp1_input": 52000, "temp1_max": 100000, "temp1_crit": 100000,
        "temp1_crit_alarm": 0,
        "temp2_label": "Core 0", "temp2_input": 50000, "temp3_label": "Core 1", "temp3_input": 51000,
        "temp6_label": "Core 4", "temp6_input": 49000, "temp7_label": "Core 5", "temp7_input": 53000,
    })  # fmt: skip
    fs.rapl("0", "package-0", 1_000_000_000, INTEL_RAPL_MAX)
    fs.rapl("0:0", "core", 500_000_000, INTEL_RAPL_MAX)
    fs.rapl("0:1", "uncore", 20_000_000, INTEL_RAPL_MAX)
    fs.rapl("0:2", "dram", 90_000_000, INTEL_RAPL_MAX)
    fs.rapl("1", "psys", INTEL_RAPL_MAX - 2_000_000, INTEL_RAPL_MAX)
    fs.values("sys/devices/virtual/powercap/intel-rapl", {"enabled": 1})
    fs.link("sys/class/powercap/intel-rapl", "sys/devices/virtual/powercap/intel-rapl")
    for number in range(4):
        fs.cpufreq(number, (number,), 400000, 4700000, None, "intel_pstate")
    return Expected(
        platform="x86-intel",
        temperatures={
            "acpitz": 27.8,
            "INT3400 Thermal": 20.0,
            "x86_pkg_temp": 52.0,
            "iwlwifi_1": 38.0,
            "nvme/Composite": 33.85,
            "nvme/Sensor 1": 33.85,
            "coretemp/Package id 0": 52.0,
            "coretemp/Core 0": 50.0,
            "coretemp/Core 1": 51.0,
            "coretemp/Core 4": 49.0,
            "coretemp/Core 5": 53.0,
        },
        governing=frozenset(
            {
                "coretemp/Package id 0",
                "coretemp/Core 0",
                "coretemp/Core 1",
                "coretemp/Core 4",
                "coretemp/Core 5",
            }
        ),
        temperature_c=53.0,
        # psys wraps between the two samples: 2 J to the wrap plus 10 J after it.
        powers={
            "package-0": 8.5,
            "package-0/core": 5.0,
            "package-0/uncore": 0.3,
            "package-0/dram": 1.2,
            "psys": 12.0,
        },
        power_w=12.0,
        power_estimated=False,
        domains={f"policy{n}": ("cpufreq", 400.0, 4700.0, 4700.0, 0) for n in range(4)},
        energy_after_1s={
            "0": 1_008_500_000,
            "0:0": 505_000_000,
            "0:1": 20_300_000,
            "0:2": 91_200_000,
            "1": 10_000_000,
        },
    )


def x86_amd_threadripper(fs: FakeSysfs) -> Expected:
    fs.cpuinfo("AuthenticAMD", 4)
    # Tctl carries a +27 °C offset on Threadripper 19xx/29xx: Tdie governs (k10temp.c).
    fs.hwmon(2, "sys/devices/pci0000:00/0000:00:18.3", "k10temp", {
        "temp1_label": "Tctl", "temp1_input": 72000, "temp2_label": "Tdie", "temp2_input": 45000,
        "temp3_label": "Tccd1", "temp3_input": 43250, "temp4_label": "Tccd2", "temp4_input": 44000,
    })  # fmt: skip
    fs.rapl("0", "package-0", 40_000_000_000, AMD_RAPL_MAX)
    fs.rapl("0:0", "core", 30_000_000_000, AMD_RAPL_MAX)
    table = (2900000, 2200000, 1900000)  # acpi-cpufreq lists P-states highest first
    for number in range(4):
        rel = fs.cpufreq(number, (number,), 1900000, 2900000, None, "acpi-cpufreq")
        fs.file(f"{rel}/scaling_available_frequencies", "".join(f"{f} " for f in table) + "\n")
    return Expected(
        platform="x86-amd",
        temperatures={
            "k10temp/Tctl": 72.0,
            "k10temp/Tdie": 45.0,
            "k10temp/Tccd1": 43.25,
            "k10temp/Tccd2": 44.0,
        },
        governing=frozenset({"k10temp/Tdie"}),
        temperature_c=45.0,
        powers={"package-0": 62.5, "package-0/core": 48.0},
        power_w=62.5,
        power_estimated=True,
        domains={f"policy{n}": ("cpufreq", 1900.0, 2900.0, 2900.0, 3) for n in range(4)},
        energy_after_1s={"0": 40_062_500_000, "0:0": 30_048_000_000},
    )


def x86_amd_tctl_only(fs: FakeSysfs) -> Expected:
    fs.cpuinfo("AuthenticAMD", 8)
    fs.zone(0, "acpitz", 40000)
    fs.hwmon(
        1,
        "sys/devices/pci0000:00/0000:00:18.3",
        "k10temp",
        {"temp1_label": "Tctl", "temp1_input": 61250, "temp3_label": "Tccd1", "temp3_input": 58500},
    )
    fs.hwmon(0, "sys/devices/virtual/thermal/thermal_zone0", "acpitz", {"temp1_input": 40000})
    fs.rapl("0", "package-0", AMD_RAPL_MAX - 1_000_000, AMD_RAPL_MAX)
    for number in range(8):
        fs.cpufreq(number, (number,), 400000, 4463000, None, "amd-pstate-epp")
    return Expected(
        platform="x86-amd",
        temperatures={"acpitz": 40.0, "k10temp/Tctl": 61.25, "k10temp/Tccd1": 58.5},
        governing=frozenset({"k10temp/Tctl"}),
        temperature_c=61.25,
        powers={"package-0": 15.0},
        power_w=15.0,
        power_estimated=True,
        domains={f"policy{n}": ("cpufreq", 400.0, 4463.0, 4463.0, 0) for n in range(8)},
        energy_after_1s={"0": 14_000_000},
    )


BOARDS: dict[str, Callable[[FakeSysfs], Expected]] = {
    "jetson-orin-nano-jp6": jetson_orin_nano_jp6,
    "jetson-agx-orin-jp6": jetson_agx_orin_jp6,
    "jetson-xavier-nx-jp5": jetson_xavier_nx_jp5,
    "jetson-nano-jp4": jetson_nano_jp4,
    "jetson-agx-xavier-jp4": jetson_agx_xavier_jp4,
    "rk3588-bsp": rk3588_bsp,
    "rk3588-mainline": rk3588_mainline,
    "x86-intel-laptop": x86_intel_laptop,
    "x86-amd-threadripper": x86_amd_threadripper,
    "x86-amd-tctl-only": x86_amd_tctl_only,
}
