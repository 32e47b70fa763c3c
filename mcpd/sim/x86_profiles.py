"""The simulated x86 boards (see mcpd/sim/profiles.py for the rules their constants follow).

x86-intel is an Intel N100 mini PC and x86-amd a Ryzen Embedded V2516 board; x86-intel-hybrid is
the reference design's Core i7-13800H (6 P-cores with two threads each, 8 E-cores) and
x86-server a two-socket Xeon Silver 4208 (two NUMA nodes of 8 cores x 2 threads), the topologies
placement is planned on (docs/cpu-topology.md cites Intel's figures). The x86 kernels simulated
here print no cpu_capacity; the hybrid part has the cpu_core/cpu_atom PMUs and intel_pstate's
per-CPU maxima (P-cores 5.2 GHz, E-cores 4.0 GHz).
"""

from __future__ import annotations

from mcpd.sim.plant import Thermal
from mcpd.sim.profiles import CpuPolicy, HwmonChannel, HwmonChip, Profile, RaplZone, Zone
from mcpd.sim.topology import Topology

_PSTATE_GOVERNORS = ("performance", "powersave")


def _x86_cpuinfo(vendor: str, model_name: str, count: int) -> str:
    return "".join(
        f"processor\t: {n}\nvendor_id\t: {vendor}\ncpu family\t: 6\nmodel name\t: {model_name}\n\n"
        for n in range(count)
    )


X86_INTEL = Profile(
    name="x86-intel",
    cpuinfo=_x86_cpuinfo("GenuineIntel", "Intel(R) N100", 4),
    dmi={"sys_vendor": "AZW", "product_name": "MINI S", "board_vendor": "AZW", "board_name": "MINI S"},
    zones=(Zone("acpitz", 0.55, 3.0, hwmon_mirror=True, resolution_mc=100),
           Zone("x86_pkg_temp", 1.0, 0.0, resolution_mc=1000)),
    hwmon_chips=(
        HwmonChip(
            "coretemp",
            "sys/devices/platform/coretemp.0",
            (
                HwmonChannel(1, "Package id 0", 1.0),
                HwmonChannel(2, "Core 0", 0.98),
                HwmonChannel(3, "Core 1", 0.99),
                HwmonChannel(4, "Core 2", 0.97),
                HwmonChannel(5, "Core 3", 0.98),
            ),
            crit_c=105,
            max_c=105,
            resolution_mc=1000,
        ),
        HwmonChip("nvme", "sys/devices/pci0000:00/0000:00:1d.0/0000:01:00.0/nvme/nvme0",
                  (HwmonChannel(1, "Composite", 0.35, 4.0),), crit_c=84, max_c=81),
    ),
    rapl=(
        RaplZone("0", "package-0", ("cpu", "gpu", "static")),
        RaplZone("0:0", "core", ("cpu",)),
        RaplZone("0:1", "uncore", ("gpu",)),
        RaplZone("1", "psys", ("cpu", "gpu", "static", "board")),
    ),
    cpus=tuple(
        CpuPolicy(n, (n,), 700000, 3400000, (), 2.6, "intel_pstate", ("performance", "powersave"), "powersave")
        for n in range(4)
    ),
    thermal=Thermal(ambient_c=25.0, r_th=5.8, tau_s=35.0, static_w=2.3, leakage_per_c=0.004, board_w=3.5),
    # Four Gracemont E-cores sharing one L2 (one cluster), a thread each; not a hybrid part.
    topology=Topology((0, 1, 2, 3), clusters=((0, 1, 2, 3),)),
)  # fmt: skip

X86_AMD = Profile(
    name="x86-amd",
    cpuinfo=_x86_cpuinfo("AuthenticAMD", "AMD Ryzen Embedded V2516 with Radeon Graphics", 8),
    dmi={"sys_vendor": "Advantech", "product_name": "AIMB-229", "board_vendor": "Advantech",
         "board_name": "AIMB-229"},
    zones=(Zone("acpitz", 0.6, 2.0, hwmon_mirror=True, resolution_mc=100),),
    hwmon_chips=(
        # Only Tctl (no Tdie) on this part, so Tctl governs; Tccd1 is reported.
        HwmonChip("k10temp", "sys/devices/pci0000:00/0000:00:18.3",
                  (HwmonChannel(1, "Tctl", 1.0), HwmonChannel(3, "Tccd1", 0.96)), resolution_mc=125),
    ),
    rapl=(RaplZone("0", "package-0", ("cpu", "static")), RaplZone("0:0", "core", ("cpu",))),
    rapl_max_energy_uj=65_532_610_987,
    cpus=tuple(
        CpuPolicy(n, (n,), 1400000, 2100000, (1400000, 1700000, 2100000), 1.9, "acpi-cpufreq",
                  ("conservative", "ondemand", "userspace", "powersave", "performance", "schedutil"),
                  table_descending=True)
        for n in range(8)
    ),
    thermal=Thermal(ambient_c=25.0, r_th=4.3, tau_s=35.0, static_w=2.4, leakage_per_c=0.004, board_w=4.0),
)  # fmt: skip


# i7-13800H (Intel ARK): P-cores 5.2 GHz max turbo with Hyper-Threading, E-cores 4.0 GHz; Linux
# numbers the P-cores' threads first, siblings side by side (0-1 ... 10-11), then the E-cores
# (12-19) in two modules of four sharing an L2. coretemp labels cores by core id: P-cores 0, 4 ...
# 20, E-cores 28-35 (temp<id + 2>_input). Power at the top clock is typical, not measured.
_P_CORES = tuple((2 * n, 2 * n + 1) for n in range(6))
_E_CORES = tuple(range(12, 20))
_CORE_IDS = (0, 4, 8, 12, 16, 20, *range(28, 36))

X86_INTEL_HYBRID = Profile(
    name="x86-intel-hybrid",
    cpuinfo=_x86_cpuinfo("GenuineIntel", "13th Gen Intel(R) Core(TM) i7-13800H", 20),
    dmi={"product_name": "Core i7-13800H board (simulated)"},
    zones=(Zone("acpitz", 0.55, 3.0, hwmon_mirror=True, resolution_mc=100),
           Zone("x86_pkg_temp", 1.0, 0.0, resolution_mc=1000)),
    hwmon_chips=(
        HwmonChip(
            "coretemp",
            "sys/devices/platform/coretemp.0",
            (HwmonChannel(1, "Package id 0", 1.0),
             *(HwmonChannel(core + 2, f"Core {core}", 0.97) for core in _CORE_IDS)),
            crit_c=100,
            max_c=100,
            resolution_mc=1000,
        ),
    ),
    rapl=(
        RaplZone("0", "package-0", ("cpu", "gpu", "static")),
        RaplZone("0:0", "core", ("cpu",)),
        RaplZone("0:1", "uncore", ("gpu",)),
        RaplZone("1", "psys", ("cpu", "gpu", "static", "board")),
    ),
    cpus=(
        *(CpuPolicy(n, (n,), 400000, 5200000, (), 3.5, "intel_pstate", _PSTATE_GOVERNORS, "powersave")
          for n in range(12)),
        *(CpuPolicy(n, (n,), 400000, 4000000, (), 1.5, "intel_pstate", _PSTATE_GOVERNORS, "powersave")
          for n in _E_CORES),
    ),
    thermal=Thermal(ambient_c=25.0, r_th=1.3, tau_s=35.0, static_w=4.0, leakage_per_c=0.004, board_w=6.0),
    topology=Topology(
        tuple(range(20)),
        clusters=(*_P_CORES, _E_CORES[:4], _E_CORES[4:]),
        cores=_P_CORES,
        hybrid=(tuple(range(12)), _E_CORES),
    ),
)  # fmt: skip

# Two Xeon Silver 4208 (Intel ARK: 8 cores, 16 threads, 3.2 GHz max turbo each): Linux numbers
# the first thread of every core first, socket by socket (0-7, 8-15), then their siblings
# (16-23, 24-31), so a core's threads are n and n + 16; one NUMA node per socket. Each RAPL
# package measures its own half; no psys on servers.
_XEON_CORES = tuple((n, n + 16) for n in range(16))
_XEON_NODES = (tuple(range(8)) + tuple(range(16, 24)), tuple(range(8, 16)) + tuple(range(24, 32)))

X86_SERVER = Profile(
    name="x86-server",
    cpuinfo=_x86_cpuinfo("GenuineIntel", "Intel(R) Xeon(R) Silver 4208 CPU @ 2.10GHz", 32),
    dmi={"product_name": "2 x Xeon Silver 4208 server (simulated)"},
    hwmon_chips=tuple(
        HwmonChip(
            "coretemp",
            f"sys/devices/platform/coretemp.{package}",
            (HwmonChannel(1, f"Package id {package}", scale), HwmonChannel(2, "Core 0", scale - 0.02)),
            crit_c=98,
            max_c=88,
            resolution_mc=1000,
        )
        for package, scale in ((0, 1.0), (1, 0.98))
    ),
    rapl=(
        RaplZone("0", "package-0", ("cpu", "static"), share=0.5),
        RaplZone("0:0", "dram", ("board",), share=0.1),
        RaplZone("1", "package-1", ("cpu", "static"), share=0.5),
        RaplZone("1:0", "dram", ("board",), share=0.1),
    ),
    cpus=tuple(
        CpuPolicy(n, (n,), 800000, 3200000, (), 4.0, "intel_pstate", _PSTATE_GOVERNORS, "powersave")
        for n in range(32)
    ),
    thermal=Thermal(ambient_c=25.0, r_th=0.5, tau_s=40.0, static_w=20.0, leakage_per_c=0.004, board_w=40.0),
    topology=Topology(
        tuple(range(32)),
        clusters=_XEON_CORES,
        cores=_XEON_CORES,
        nodes=_XEON_NODES,
    ),
)  # fmt: skip

X86_PROFILES = (X86_INTEL, X86_AMD, X86_INTEL_HYBRID, X86_SERVER)
