"""Simulated boards: their sysfs layout (from docs/sysfs.md) and their plant constants.

Layout facts follow docs/sysfs.md; where it marks a fact UNCONFIRMED (Orin zone order beyond 0/1,
Orin cpufreq tables and policy split) the choice is noted. Plant constants are chosen per board so
that, under sustained full load with no governor, the hottest SoC sensor passes 85 °C within about
a minute of simulated time and settles well above it (about 100 °C): R_th = 75 K / full-load SoC
power, tau ~ 35 s. Power figures are typical of each board class, not measurements.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mcpd.sim.plant import Thermal
from mcpd.sim.topology import Topology, dmips_capacities, uniform

PART_NAMES = ("cpu", "gpu", "npu", "static", "board")
"""Power components a rail or RAPL zone can measure: a load class's dynamic power, SoC static
power, and the rest of the board."""


@dataclass(frozen=True)
class EnergyModelNode:
    """What a device tree says about a domain's power (docs/power-estimate.md): its node path,
    `dynamic-power-coefficient` (µW/MHz/V², 0: absent) and OPP table (Hz, µV)."""

    node: str
    """Relative to the tree's root, e.g. "gpu@fb000000"; for CPUs "cpus/cpu@{reg}" with {reg}
    filled per CPU."""
    coefficient: int
    table: str
    """The OPP table node, at the top level or, with a "/" in it, under the device's node."""
    phandle: int
    opps: tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class CpuPolicy:
    number: int
    cpus: tuple[int, ...]
    min_khz: int
    max_khz: int
    table_khz: tuple[int, ...]
    power_max_w: float
    driver: str = "cpufreq-dt"
    governors: tuple[str, ...] = (
        "conservative",
        "ondemand",
        "userspace",
        "powersave",
        "performance",
        "schedutil",
    )
    governor: str = "schedutil"
    table_descending: bool = False
    """acpi-cpufreq lists its P-states highest first."""
    energy_model: EnergyModelNode | None = None
    """Device-tree facts of its CPU nodes, where the board's tree has them (RK3588)."""


@dataclass(frozen=True)
class Devfreq:
    name: str
    device_dir: str
    table_hz: tuple[int, ...]
    load: str
    """"gpu", "npu" or "" (not driven by load, e.g. DDR)."""
    power_max_w: float
    governor: str
    of_node: str | None = None
    energy_model: EnergyModelNode | None = None
    """Where set, `of_node` is a link to this device-tree node instead of a folder with a name."""


@dataclass(frozen=True)
class Zone:
    type: str
    scale: float = 1.0
    """Fraction of the die's rise above ambient that this sensor sees."""
    offset_c: float = 0.0
    quirk: str = ""
    """"pmic": constant 100000 (Jetson PMIC-Die); "gated": -256000 always (unused CV engines);
    "gated-gpu": -256000 while the GPU is idle and power-gated (Jetson BPMP zones)."""
    trips: tuple[tuple[int, str], ...] = ()
    hwmon_mirror: bool = False
    resolution_mc: int = 1
    """The sensor's step in m°C (docs/sensor-timing.md)."""


@dataclass(frozen=True)
class HwmonChannel:
    index: int
    label: str | None
    scale: float
    offset_c: float = 0.0


@dataclass(frozen=True)
class HwmonChip:
    name: str
    device_dir: str
    channels: tuple[HwmonChannel, ...]
    crit_c: int | None = None
    max_c: int | None = None
    resolution_mc: int = 1


@dataclass(frozen=True)
class Rail:
    label: str | None
    """None: unlabelled and disabled, as mainline leaves unused INA3221 channels."""
    parts: tuple[str, ...] = ()
    millivolts: int = 5000
    share: float = 1.0
    """Fraction of the parts' power on this rail (a board supply split across rails)."""


@dataclass(frozen=True)
class Ina3221:
    client: str
    """I2C client name, e.g. "1-0040"."""
    device_dir: str
    rails: tuple[Rail, Rail, Rail]


@dataclass(frozen=True)
class IioIna3221x:
    client: str
    device_dir: str
    iio: str
    rails: tuple[Rail, Rail, Rail]


@dataclass(frozen=True)
class RaplZone:
    zone_id: str
    """"0" for intel-rapl:0, "0:0" for its first subzone."""
    name: str
    parts: tuple[str, ...]
    share: float = 1.0
    """Fraction of the parts' power it measures (each package of a two-socket board half)."""


@dataclass(frozen=True)
class Profile:
    name: str
    compatible: tuple[str, ...] = ()
    model: str | None = None
    nv_tegra_release: str | None = None
    cpuinfo: str = ""
    dmi: dict[str, str] = field(default_factory=dict)
    zones: tuple[Zone, ...] = ()
    hwmon_chips: tuple[HwmonChip, ...] = ()
    ina3221: tuple[Ina3221, ...] = ()
    iio: tuple[IioIna3221x, ...] = ()
    rapl: tuple[RaplZone, ...] = ()
    rapl_max_energy_uj: int = 262_143_328_850
    cpus: tuple[CpuPolicy, ...] = ()
    devfreqs: tuple[Devfreq, ...] = ()
    thermal: Thermal = field(default_factory=lambda: Thermal(25.0, 6.0, 35.0, 2.0, 0.004, 2.5))
    topology: Topology | None = None
    """The CPUs' topology files (mcpd/sim/topology.py); None: one uniform cluster per policy."""

    @property
    def cpu_numbers(self) -> tuple[int, ...]:
        return tuple(sorted(cpu for policy in self.cpus for cpu in policy.cpus))


_ARM_CPUINFO = (
    "processor\t: {n}\nBogoMIPS\t: 62.50\nCPU implementer\t: 0x41\nCPU architecture: 8\n\n"
)


def _arm_cpuinfo(count: int) -> str:
    return "".join(_ARM_CPUINFO.format(n=n) for n in range(count))


# Orin CPU table: the Orin NX table from a third-party script (UNCONFIRMED), cut at each module's max.
_ORIN_CPU_KHZ = (
    115200, 192000, 268800, 345600, 422400, 499200, 576000, 652800, 729600, 806400, 883200, 960000,
    1036800, 1113600, 1190400, 1267200, 1344000, 1420800, 1497600, 1574400, 1651200, 1728000,
    1804800, 1881600, 1958400, 2035200, 2112000, 2201600,
)  # fmt: skip
_ORIN_GPU_HZ = (
    114750000, 216750000, 318750000, 420750000, 522750000, 624750000, 726750000, 828750000,
    930750000, 1032750000, 1134750000, 1236750000, 1300500000,
)  # fmt: skip
_ORIN_ZONES = (
    # JP6: zone0 cpu-thermal and zone1 gpu-thermal are confirmed; the order of the others is not.
    Zone("cpu-thermal", 1.0, 0.0, trips=((99000, "passive"), (104500, "critical"))),
    Zone(
        "gpu-thermal",
        0.96,
        0.0,
        quirk="gated-gpu",
        trips=((99000, "passive"), (104500, "critical")),
    ),
    Zone("cv0-thermal", quirk="gated"),
    Zone("cv1-thermal", quirk="gated"),
    Zone("cv2-thermal", quirk="gated"),
    Zone("soc0-thermal", 0.92, 0.0),
    Zone("soc1-thermal", 0.93, 0.0),
    Zone("soc2-thermal", 0.91, 0.0),
    Zone("tj-thermal", 1.0, 0.4, trips=((99000, "passive"), (104500, "critical"))),
)
_TEGRA_GOVERNORS = ("userspace", "performance", "schedutil")
_I2C1 = "sys/devices/platform/bus@0/c240000.i2c/i2c-1"

JETSON_ORIN_NANO = Profile(
    name="jetson-orin-nano",
    compatible=("nvidia,p3768-0000+p3767-0005", "nvidia,p3767-0005", "nvidia,tegra234"),
    model="NVIDIA Jetson Orin Nano Developer Kit",
    nv_tegra_release=(
        "# R36 (release), REVISION: 4.7, GCID: 42132812, BOARD: generic, EABI: aarch64, "
        "DATE: Thu Sep 18 22:54:44 UTC 2025\n# KERNEL_VARIANT: oot\n"
        "TARGET_USERSPACE_LIB_DIR=nvidia\nTARGET_USERSPACE_LIB_DIR_PATH=usr/lib/aarch64-linux-gnu/nvidia\n"
    ),
    cpuinfo=_arm_cpuinfo(6),
    zones=_ORIN_ZONES,
    ina3221=(
        Ina3221(
            "1-0040",
            f"{_I2C1}/1-0040",
            (
                Rail("VDD_IN", ("cpu", "gpu", "npu", "static", "board"), 5040),
                Rail("VDD_CPU_GPU_CV", ("cpu", "gpu"), 5016),
                Rail("VDD_SOC", ("static",), 5024),
            ),
        ),
    ),
    # Policy split (cpu0-3, cpu4-5) is UNCONFIRMED; Orin Nano's CPU tops out at 1.5 GHz.
    cpus=(
        CpuPolicy(0, (0, 1, 2, 3), 115200, 1510400, (*_ORIN_CPU_KHZ[:19], 1510400), 2.6, "tegra194", _TEGRA_GOVERNORS),
        CpuPolicy(4, (4, 5), 115200, 1510400, (*_ORIN_CPU_KHZ[:19], 1510400), 1.4, "tegra194", _TEGRA_GOVERNORS),
    ),
    devfreqs=(
        Devfreq("17000000.gpu", "sys/devices/platform/bus@0/17000000.gpu", _ORIN_GPU_HZ[:6], "gpu", 5.5,
                "nvhost_podgov", of_node="gpu"),
    ),
    thermal=Thermal(ambient_c=25.0, r_th=6.4, tau_s=35.0, static_w=2.0, leakage_per_c=0.004, board_w=2.6),
    # tegra234.dtsi: Cortex-A78AE nodes without capacity-dmips-mhz (every capacity 1024), three
    # cpu-map clusters of which the Orin Nano module has 4 + 2 cores; JetPack 6's 5.15 kernel
    # predates cluster_cpus_list, so cpufreq's related_cpus is the cluster (docs/cpu-topology.md).
    topology=uniform(range(6), capacity=True),
)  # fmt: skip

JETSON_AGX_ORIN = Profile(
    name="jetson-agx-orin",
    compatible=("nvidia,p3737-0000+p3701-0005", "nvidia,p3701-0005", "nvidia,tegra234"),
    model="NVIDIA Jetson AGX Orin Developer Kit",
    nv_tegra_release=JETSON_ORIN_NANO.nv_tegra_release,
    cpuinfo=_arm_cpuinfo(12),
    zones=_ORIN_ZONES,
    # AGX Orin has no board-input rail: the governing power is the sum of its rails, like jtop.
    ina3221=(
        Ina3221(
            "1-0040",
            f"{_I2C1}/1-0040",
            (
                Rail("VDD_GPU_SOC", ("gpu", "static"), 5008),
                Rail("VDD_CPU_CV", ("cpu",), 5016),
                Rail("VIN_SYS_5V0", ("board",), 5000, share=0.7),
            ),
        ),
        Ina3221(
            "1-0041",
            f"{_I2C1}/1-0041",
            (Rail("NC"), Rail("VDDQ_VDD2_1V8AO", ("board",), 4992, share=0.3), Rail("NC")),
        ),
    ),
    cpus=tuple(
        CpuPolicy(n, (n, n + 1, n + 2, n + 3), 115200, 2201600, _ORIN_CPU_KHZ, 4.0, "tegra194", _TEGRA_GOVERNORS)
        for n in (0, 4, 8)
    ),
    devfreqs=(
        Devfreq("17000000.gpu", "sys/devices/platform/bus@0/17000000.gpu", _ORIN_GPU_HZ, "gpu", 16.0,
                "nvhost_podgov", of_node="gpu"),
    ),
    thermal=Thermal(ambient_c=25.0, r_th=2.4, tau_s=40.0, static_w=3.5, leakage_per_c=0.004, board_w=4.0),
    topology=uniform(range(12), capacity=True),  # three clusters of four A78AE, as the Orin Nano
)  # fmt: skip

_NANO_CPU_KHZ = (
    102000, 204000, 307200, 403200, 518400, 614400, 710400, 825600, 921600, 1036800, 1132800,
    1224000, 1326000, 1428000, 1479000,
)  # fmt: skip
_NANO_GPU_HZ = (
    76800000, 153600000, 230400000, 307200000, 384000000, 460800000, 537600000, 614400000,
    691200000, 768000000, 844800000, 921600000,
)  # fmt: skip

JETSON_NANO_JP4 = Profile(
    name="jetson-nano-jp4",
    compatible=("nvidia,p3450-0000", "nvidia,jetson-nano", "nvidia,tegra210"),
    model="NVIDIA Jetson Nano Developer Kit",
    nv_tegra_release=(
        "# R32 (release), REVISION: 7.4, GCID: 33514132, BOARD: t210ref, EABI: aarch64, "
        "DATE: Fri Jun  9 04:25:08 UTC 2023\n"
    ),
    cpuinfo=_arm_cpuinfo(4),
    zones=(
        Zone("AO-therm", 0.85, 0.0),
        Zone("CPU-therm", 1.0, 0.0),
        Zone("GPU-therm", 0.97, 0.0),
        Zone("PLL-therm", 0.95, 0.0),
        Zone("PMIC-Die", quirk="pmic"),
        Zone("thermal-fan-est", 0.97, 0.0),
    ),
    iio=(
        IioIna3221x(
            "6-0040",
            "sys/devices/7000c400.i2c/i2c-6/6-0040",
            "iio:device0",
            (
                Rail("POM_5V_IN", ("cpu", "gpu", "npu", "static", "board"), 5000),
                Rail("POM_5V_GPU", ("gpu",), 5000),
                Rail("POM_5V_CPU", ("cpu",), 5000),
            ),
        ),
    ),
    cpus=(CpuPolicy(0, (0, 1, 2, 3), 102000, 1479000, _NANO_CPU_KHZ, 3.2, "tegra210", _TEGRA_GOVERNORS),),
    devfreqs=(
        Devfreq("57000000.gpu", "sys/devices/57000000.gpu", _NANO_GPU_HZ, "gpu", 3.5, "nvhost_podgov",
                of_node="gpu"),
    ),
    thermal=Thermal(ambient_c=25.0, r_th=8.8, tau_s=35.0, static_w=1.3, leakage_per_c=0.004, board_w=1.5),
    # L4T R32's 4.9 kernel: no cpu_capacity, no cluster_cpus_list, no core_cpus_list (their
    # fallbacks are what is read on it); four Cortex-A57 in one cluster.
    topology=Topology((0, 1, 2, 3), core_cpus_list=False),
)  # fmt: skip

_RK_LITTLE_KHZ = (408000, 600000, 816000, 1008000, 1200000, 1416000, 1608000, 1800000)
_RK_BIG_KHZ = (
    408000,
    600000,
    816000,
    1008000,
    1200000,
    1416000,
    1608000,
    1800000,
    2016000,
    2208000,
    2400000,
)
_RK_GPU_HZ = tuple(n * 100_000_000 for n in range(3, 11))
# Mainline rk3588s.dtsi (docs/power-estimate.md): A55 228 and A76 416 µW/MHz/V² per core, the Mali
# node 2982; the OPP voltages of cluster0/1/2 and the GPU (target cells). The NPU's OPP table is
# the BSP's 300-1000 MHz with the GPU's voltages (UNCONFIRMED); its node has no coefficient.
_RK_LITTLE_UV = (675000, 675000, 675000, 675000, 712500, 762500, 850000, 950000)
_RK_BIG_UV = (
    675000,
    675000,
    675000,
    675000,
    675000,
    725000,
    762500,
    850000,
    925000,
    987500,
    1000000,
)
_RK_GPU_UV = (675000, 675000, 675000, 675000, 700000, 750000, 800000, 850000)


def _rk_cpu_model(
    cluster: int, coefficient: int, table: tuple[int, ...], uv: tuple[int, ...]
) -> EnergyModelNode:
    return EnergyModelNode(
        "cpus/cpu@{reg}",
        coefficient,
        f"opp-table-cluster{cluster}",
        0x10 + cluster,
        tuple((khz * 1000, v) for khz, v in zip(table, uv, strict=True)),
    )


def _rk_device_model(node: str, coefficient: int, phandle: int) -> EnergyModelNode:
    return EnergyModelNode(
        node,
        coefficient,
        f"{node}/opp-table",
        phandle,
        tuple(zip(_RK_GPU_HZ, _RK_GPU_UV, strict=True)),
    )


_RK_TSADC_TRIPS = ((75000, "passive"), (85000, "passive"), (115000, "critical"))

RK3588 = Profile(
    name="rk3588",
    compatible=("radxa,rock-5b", "rockchip,rk3588"),
    model="Radxa ROCK 5B",
    cpuinfo=_arm_cpuinfo(8),
    zones=(
        Zone("soc-thermal", 0.97, 0.0, trips=_RK_TSADC_TRIPS, hwmon_mirror=True),
        Zone("bigcore0-thermal", 1.0, 0.0, hwmon_mirror=True),
        Zone("bigcore1-thermal", 0.99, 0.0, hwmon_mirror=True),
        Zone("littlecore-thermal", 0.94, 0.0, hwmon_mirror=True),
        Zone("center-thermal", 0.93, 0.0, hwmon_mirror=True),
        Zone("gpu-thermal", 0.95, 0.0, hwmon_mirror=True),
        Zone("npu-thermal", 0.95, 0.0, hwmon_mirror=True),
    ),
    # Power at f_max: the Energy Model's C·V²·f of the tree below (4 × 228 × 0.95² × 1800 µW,
    # 2 × 416 × 1.0² × 2400 µW, 2982 × 0.85² × 1000 µW); the NPU's 2.6 W is typical, not measured.
    cpus=(
        CpuPolicy(0, (0, 1, 2, 3), 408000, 1800000, _RK_LITTLE_KHZ, 1.48,
                  energy_model=_rk_cpu_model(0, 228, _RK_LITTLE_KHZ, _RK_LITTLE_UV)),
        CpuPolicy(4, (4, 5), 408000, 2400000, _RK_BIG_KHZ, 2.0,
                  energy_model=_rk_cpu_model(1, 416, _RK_BIG_KHZ, _RK_BIG_UV)),
        CpuPolicy(6, (6, 7), 408000, 2400000, _RK_BIG_KHZ, 2.0,
                  energy_model=_rk_cpu_model(2, 416, _RK_BIG_KHZ, _RK_BIG_UV)),
    ),
    devfreqs=(
        Devfreq("fb000000.gpu", "sys/devices/platform/fb000000.gpu", _RK_GPU_HZ, "gpu", 2.15, "simple_ondemand",
                energy_model=_rk_device_model("gpu@fb000000", 2982, 0x20)),
        Devfreq("fdab0000.npu", "sys/devices/platform/fdab0000.npu", _RK_GPU_HZ, "npu", 2.6, "rknpu_ondemand",
                energy_model=_rk_device_model("npu@fdab0000", 0, 0x21)),
        Devfreq("dmc", "sys/devices/platform/dmc", (528000000, 1068000000, 1560000000, 2112000000), "", 0.0,
                "dmc_ondemand"),
    ),
    # Idle near 35 °C as reported for the ROCK 5B (htop#1404).
    thermal=Thermal(ambient_c=25.0, r_th=6.3, tau_s=35.0, static_w=1.9, leakage_per_c=0.004, board_w=2.0),
    # rk3588-base.dtsi (docs/cpu-topology.md): cpu-map clusters 0-3 (A55), 4-5 and 6-7 (A76),
    # capacity-dmips-mhz 530 and 1024, so cpu_capacity 397 and 1024 at 1.8 and 2.4 GHz.
    topology=Topology(
        tuple(range(8)),
        dmips_capacities((530,) * 4 + (1024,) * 4, (1800000,) * 4 + (2400000,) * 4),
        clusters=((0, 1, 2, 3), (4, 5), (6, 7)),
    ),
)  # fmt: skip

ARM_PROFILES = (JETSON_ORIN_NANO, JETSON_AGX_ORIN, JETSON_NANO_JP4, RK3588)
