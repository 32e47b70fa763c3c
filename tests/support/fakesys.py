"""Writes fake sysfs/procfs trees for tests, with the kernel's own file names and formats.

Independent of the simulator on purpose: the fixtures are transcribed from docs/sysfs.md, so a
mistake shared by the simulator and the readers cannot hide. Values are written exactly as the
kernel prints them (decimal + "\\n", cpufreq tables "a b \\n", devfreq tables "a b\\n", device-tree
strings NUL-terminated); class entries are relative symlinks into /sys/devices.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path


class FakeSysfs:
    def __init__(self, root: Path) -> None:
        self.root = root

    def file(self, rel: str, content: str | bytes) -> None:
        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content.encode() if isinstance(content, str) else content)

    def link(self, rel: str, target: str) -> None:
        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.symlink_to(os.path.relpath(self.root / target, path.parent))

    def values(self, directory: str, attrs: Mapping[str, str | int]) -> None:
        for name, value in attrs.items():
            self.file(f"{directory}/{name}", f"{value}\n")

    # -- identification --------------------------------------------------------------------------

    def device_tree(self, compatible: Sequence[str], model: str) -> None:
        base = "sys/firmware/devicetree/base"
        self.file(f"{base}/compatible", "".join(f"{entry}\0" for entry in compatible))
        self.file(f"{base}/model", f"{model}\0")
        self.link("proc/device-tree", base)

    def cpuinfo(self, vendor: str | None, count: int = 4) -> None:
        if vendor is None:
            text = "".join(
                f"processor\t: {n}\nBogoMIPS\t: 62.50\nCPU implementer\t: 0x41\n\n"
                for n in range(count)
            )
        else:
            text = "".join(
                f"processor\t: {n}\nvendor_id\t: {vendor}\ncpu family\t: 25\n\n"
                for n in range(count)
            )
        self.file("proc/cpuinfo", text)

    # -- sensors ---------------------------------------------------------------------------------

    def zone(self, number: int, zone_type: str, temp: int | str, mode: str = "enabled") -> str:
        rel = f"sys/devices/virtual/thermal/thermal_zone{number}"
        self.values(rel, {"type": zone_type, "temp": temp, "mode": mode, "policy": "step_wise"})
        self.file(f"{rel}/available_policies", "power_allocator user_space step_wise\n")
        self.link(f"sys/class/thermal/thermal_zone{number}", rel)
        return rel

    def hwmon(self, number: int, device_dir: str, name: str, attrs: Mapping[str, str | int]) -> str:
        # Under a bus device the driver core adds a "hwmon" glue folder; under a class device (a
        # thermal zone's mirror) it does not.
        glue = "" if "/thermal/thermal_zone" in device_dir else "hwmon/"
        rel = f"{device_dir}/{glue}hwmon{number}"
        self.values(rel, {"name": name, **attrs})
        self.link(f"sys/class/hwmon/hwmon{number}", rel)
        return rel

    def renumber_hwmon(self, device_dir: str, old: int, new: int) -> None:
        """Hotplug: the kernel removes the device's hwmon files and registers it again under a
        new number (the folder under the device and the class link both change)."""
        glue = self.root / device_dir / "hwmon"
        shutil.copytree(glue / f"hwmon{old}", glue / f"hwmon{new}")
        shutil.rmtree(glue / f"hwmon{old}")
        (self.root / f"sys/class/hwmon/hwmon{old}").unlink()
        self.link(f"sys/class/hwmon/hwmon{new}", f"{device_dir}/hwmon/hwmon{new}")

    def i2c_client(self, client: str, device_dir: str, driver: str, name: str) -> None:
        self.values(device_dir, {"name": name})
        self.link(f"sys/bus/i2c/devices/{client}", device_dir)
        self.link(f"sys/bus/i2c/drivers/{driver}/{client}", device_dir)

    def rapl(self, zone_id: str, name: str, energy_uj: int, max_range_uj: int) -> str:
        parts = zone_id.split(":")
        rel = "sys/devices/virtual/powercap/intel-rapl" + "".join(
            f"/intel-rapl:{':'.join(parts[: i + 1])}" for i in range(len(parts))
        )
        self.values(
            rel,
            {
                "name": name,
                "energy_uj": energy_uj,
                "max_energy_range_uj": max_range_uj,
                "enabled": 1,
            },
        )
        self.link(f"sys/class/powercap/intel-rapl:{zone_id}", rel)
        return rel

    # -- frequency domains -----------------------------------------------------------------------

    def cpufreq(
        self,
        number: int,
        cpus: Sequence[int],
        min_khz: int,
        max_khz: int,
        table: Sequence[int] | None = None,
        driver: str = "cpufreq-dt",
        cap_khz: int | None = None,
    ) -> str:
        rel = f"sys/devices/system/cpu/cpufreq/policy{number}"
        cpu_list = " ".join(str(cpu) for cpu in cpus)
        self.values(
            rel,
            {
                "affected_cpus": cpu_list,
                "related_cpus": cpu_list,
                "cpuinfo_min_freq": min_khz,
                "cpuinfo_max_freq": max_khz,
                "scaling_min_freq": min_khz,
                "scaling_max_freq": cap_khz or max_khz,
                "scaling_cur_freq": cap_khz or max_khz,
                "scaling_driver": driver,
                "scaling_governor": "schedutil",
            },
        )
        if table is not None:
            self.file(
                f"{rel}/scaling_available_frequencies", "".join(f"{f} " for f in table) + "\n"
            )
        for cpu in cpus:
            self.link(f"sys/devices/system/cpu/cpu{cpu}/cpufreq", rel)
        return rel

    def devfreq(
        self,
        name: str,
        device_dir: str,
        table: Sequence[int],
        governor: str,
        of_node: str | None = None,
        cap_hz: int | None = None,
    ) -> str:
        rel = f"{device_dir}/devfreq/{name}"
        self.file(f"{rel}/available_frequencies", " ".join(str(f) for f in table) + "\n")
        self.values(
            rel,
            {
                "governor": governor,
                "min_freq": table[0],
                "max_freq": cap_hz or table[-1],
                "cur_freq": table[0],
                "target_freq": table[0],
                "polling_interval": 50,
            },
        )
        self.link(f"{rel}/device", device_dir)
        if of_node is not None:
            self.file(f"{device_dir}/of_node/name", f"{of_node}\0")
        self.link(f"sys/class/devfreq/{name}", rel)
        return rel
