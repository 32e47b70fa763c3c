"""Writes a simulated board's sysfs, procfs and device-tree files under a root folder.

Class entries are symlinks into /sys/devices as on a real kernel, values end in a newline, tables
keep the kernel's spacing (cpufreq lists end in "value \\n", devfreq lists do not), device-tree
strings are NUL-terminated. A one-line value ("41468\\n") that changes is rewritten in place, so a
reader's kept descriptor reads the new value as with a real attribute; anything else (/proc/stat,
the JSON state file) is replaced atomically (write + rename), so a reader sees either the old or
the new text.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from mcpd.sim import energy_model, topology
from mcpd.sim.profiles import CpuPolicy, Devfreq, HwmonChip, Profile, Rail, Zone

_ZONE_POLICIES = "power_allocator user_space step_wise\n"

INA3221_UPDATE_S = 0.14
"""The INA3221 `update_interval` the simulated boards report (ms in the file)."""
INA3221_CURRENT_LSB_MA = 8
"""Shunt-voltage LSB 40 µV across the 5 mΩ shunt (docs/sensor-timing.md)."""

MEMORY_DIR = "/dev/shm" if os.access("/dev/shm", os.W_OK | os.X_OK) else None
"""Where a simulated board goes unless told otherwise: sysfs lives in memory, and on a disk file
system the simulator's writes and the daemon's cap writes go through the journal, milliseconds
each that no kernel attribute costs."""


@dataclass
class Dynamic:
    """A value the simulator rewrites every step."""

    sensor: str
    """The name mcpd reports for this sensor (what --fault names), or a domain name."""
    path: str
    """Relative to the root."""
    render: Callable[[Inputs], str]
    kind: str
    """"temperature", "power", "counter" or "frequency"."""


@dataclass(frozen=True)
class Inputs:
    """What a step knows when it renders values."""

    die_c: float
    ambient_c: float
    part_w: dict[str, float]
    meter_w: dict[str, float]
    """What the INA3221 registers hold: part_w averaged over the last conversion window."""
    utils: dict[str, float]
    freqs_khz: dict[str, int]
    energy_uj: dict[str, int]
    noise_c: float
    proc_stat: str = ""


class BoardTree:
    def __init__(self, profile: Profile, root: Path) -> None:
        self.profile = profile
        self.root = root
        self.dynamics: list[Dynamic] = []
        self.cap_paths: dict[str, tuple[str, int]] = {}
        """Domain name -> (cap file, units per kHz)."""
        self.hwmon_dirs: dict[str, str] = {}
        """hwmon `name` -> its current hwmonN directory (relative), for renumbering."""
        self._next_hwmon = 0

    # -- primitives ------------------------------------------------------------------------------

    def write(self, rel: str, content: str | bytes) -> None:
        # Plain strings, and a folder made only when missing: this runs for every changed value
        # on every step, and pathlib plus mkdir were most of a simulated minute's cost.
        path = f"{self.root}/{rel}"
        folder, _, name = path.rpartition("/")
        data = content.encode() if isinstance(content, str) else content
        if data.count(b"\n") == 1 and data.endswith(b"\n") and self._overwrite(path, data):
            return
        temporary = f"{folder}/.{name}.sim"
        try:
            descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        except FileNotFoundError:
            os.makedirs(folder, exist_ok=True)
            descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(descriptor, data)
        finally:
            os.close(descriptor)
        os.replace(temporary, path)

    @staticmethod
    def _overwrite(path: str, data: bytes) -> bool:
        """A one-line value changed in place, as a sysfs attribute changes: a reader's kept
        descriptor reads the new value, as on a board, instead of finding its file replaced and
        opening it again (which made every simulated read cost several system calls no real read
        costs). Written before the truncation, so a reader racing a shorter value sees it with
        a second newline after it, which parses the same. False when there is no such file yet."""
        try:
            descriptor = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return False
        try:
            os.pwrite(descriptor, data, 0)
            os.ftruncate(descriptor, len(data))
        finally:
            os.close(descriptor)
        return True

    def link(self, rel: str, target_rel: str) -> None:
        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        relative = os.path.relpath(self.root / target_rel, path.parent)
        if path.is_symlink():
            path.unlink()
        path.symlink_to(relative)

    def dynamic(self, sensor: str, rel: str, kind: str, render: Callable[[Inputs], str]) -> None:
        self.dynamics.append(Dynamic(sensor, rel, render, kind))

    def new_hwmon(self, device_dir: str, name: str) -> str:
        number = self._next_hwmon
        self._next_hwmon += 1
        # Under a bus device the driver core adds a "hwmon" glue folder; under a class device (a
        # thermal zone's mirror) it does not.
        glue = "" if "/thermal/thermal_zone" in device_dir else "hwmon/"
        rel = f"{device_dir}/{glue}hwmon{number}"
        self.write(f"{rel}/name", f"{name}\n")
        self.link(f"sys/class/hwmon/hwmon{number}", rel)
        self.hwmon_dirs[name] = rel
        return rel

    def renumber_hwmon(self, name: str) -> str:
        """Hotplug: the device goes away and comes back as the next free hwmonN."""
        old = self.hwmon_dirs[name]
        old_number = old.rsplit("hwmon", 1)[1]
        number = self._next_hwmon
        self._next_hwmon += 1
        new = f"{old.rsplit('/', 1)[0]}/hwmon{number}"
        (self.root / f"sys/class/hwmon/hwmon{old_number}").unlink()
        # A new device with new files, the old ones removed (not renamed: a reader's kept
        # descriptor on a removed device's attribute must stop reading values, as the kernel's do).
        shutil.copytree(self.root / old, self.root / new, symlinks=True)
        shutil.rmtree(self.root / old)
        self.link(f"sys/class/hwmon/hwmon{number}", new)
        for dynamic in self.dynamics:
            if dynamic.path.startswith(old + "/"):
                dynamic.path = new + dynamic.path[len(old) :]
        self.hwmon_dirs[name] = new
        return new

    # -- the board -------------------------------------------------------------------------------

    def build(self) -> None:
        profile = self.profile
        self.write("proc/sys/kernel/random/boot_id", f"{uuid.uuid4()}\n")
        self.write("proc/cpuinfo", profile.cpuinfo)
        self.dynamic("stat", "proc/stat", "stat", lambda inputs: inputs.proc_stat)
        if profile.compatible:
            base = "sys/firmware/devicetree/base"
            self.write(f"{base}/compatible", "".join(f"{entry}\0" for entry in profile.compatible))
            self.write(f"{base}/model", f"{profile.model}\0")
            self.link("proc/device-tree", base)
        if profile.nv_tegra_release:
            self.write("etc/nv_tegra_release", profile.nv_tegra_release)
        for key, value in profile.dmi.items():
            self.write(f"sys/devices/virtual/dmi/id/{key}", f"{value}\n")
        if profile.dmi:
            self.link("sys/class/dmi/id", "sys/devices/virtual/dmi/id")
        for number, zone in enumerate(profile.zones):
            self._zone(number, zone)
        for chip in profile.hwmon_chips:
            self._hwmon_chip(chip)
        for ina in profile.ina3221:
            self._ina3221(ina.client, ina.device_dir, ina.rails)
        for iio in profile.iio:
            self._iio(iio.client, iio.device_dir, iio.iio, iio.rails)
        if profile.rapl:
            self._rapl()
        for policy in profile.cpus:
            self._cpufreq(policy)
        cpus = profile.topology or topology.uniform(profile.cpu_numbers, capacity=False)
        topology.write(self, cpus)
        for device in profile.devfreqs:
            self._devfreq(device)

    def _zone(self, number: int, zone: Zone) -> None:
        rel = f"sys/devices/virtual/thermal/thermal_zone{number}"
        self.write(f"{rel}/type", f"{zone.type}\n")
        self.write(f"{rel}/mode", "enabled\n")
        self.write(f"{rel}/policy", "step_wise\n")
        self.write(f"{rel}/available_policies", _ZONE_POLICIES)
        for trip, (millidegrees, kind) in enumerate(zone.trips):
            self.write(f"{rel}/trip_point_{trip}_temp", f"{millidegrees}\n")
            self.write(f"{rel}/trip_point_{trip}_type", f"{kind}\n")
            self.write(f"{rel}/trip_point_{trip}_hyst", "2000\n")
        self.link(f"sys/class/thermal/thermal_zone{number}", rel)
        render = _zone_render(zone)
        self.dynamic(zone.type, f"{rel}/temp", "temperature", render)
        if zone.hwmon_mirror:
            name = zone.type.replace("-", "_")
            mirror = self.new_hwmon(rel, name)
            if zone.trips:
                self.write(f"{mirror}/temp1_crit", f"{zone.trips[-1][0]}\n")
            self.dynamic(name, f"{mirror}/temp1_input", "temperature", render)

    def _hwmon_chip(self, chip: HwmonChip) -> None:
        rel = self.new_hwmon(chip.device_dir, chip.name)
        for channel in chip.channels:
            prefix = f"{rel}/temp{channel.index}"
            if channel.label is not None:
                self.write(f"{prefix}_label", f"{channel.label}\n")
            if chip.max_c is not None:
                self.write(f"{prefix}_max", f"{chip.max_c * 1000}\n")
            if chip.crit_c is not None:
                self.write(f"{prefix}_crit", f"{chip.crit_c * 1000}\n")
                self.write(f"{prefix}_crit_alarm", "0\n")
            zone = Zone(
                channel.label or chip.name,
                channel.scale,
                channel.offset_c,
                resolution_mc=chip.resolution_mc,
            )
            sensor = f"{chip.name}/{channel.label or f'temp{channel.index}'}"
            self.dynamic(sensor, f"{prefix}_input", "temperature", _zone_render(zone))

    def _ina3221(self, client: str, device_dir: str, rails: tuple[Rail, Rail, Rail]) -> None:
        self.write(f"{device_dir}/name", "ina3221\n")
        self.link(f"sys/bus/i2c/devices/{client}", device_dir)
        self.link(f"sys/bus/i2c/drivers/ina3221/{client}", device_dir)
        rel = self.new_hwmon(device_dir, "ina3221")
        self.write(f"{rel}/samples", "512\n")
        self.write(f"{rel}/update_interval", f"{round(INA3221_UPDATE_S * 1000)}\n")
        self.write(f"{rel}/in7_label", "sum of shunt voltages\n")
        for channel, rail in enumerate(rails, start=1):
            enabled = rail.label is not None
            self.write(f"{rel}/in{channel}_enable", "1\n" if enabled else "0\n")
            self.write(f"{rel}/shunt{channel}_resistor", "5000\n")
            self.write(f"{rel}/curr{channel}_max", "32760\n")
            self.write(f"{rel}/curr{channel}_crit", "32760\n")
            self.write(f"{rel}/curr{channel}_max_alarm", "0\n")
            self.write(f"{rel}/curr{channel}_crit_alarm", "0\n")
            if rail.label is not None:
                self.write(f"{rel}/in{channel}_label", f"{rail.label}\n")
            sensor = rail.label or f"{client}/ch{channel}"
            self.dynamic(sensor, f"{rel}/in{channel}_input", "power", _rail_millivolts(rail))
            self.dynamic(sensor, f"{rel}/curr{channel}_input", "power", _rail_milliamps(rail))
            # Shunt voltage in µV across the 5 mΩ shunt.
            self.dynamic(
                sensor, f"{rel}/in{channel + 3}_input", "power", _rail_shunt_microvolts(rail)
            )

    def _iio(self, client: str, device_dir: str, iio: str, rails: tuple[Rail, Rail, Rail]) -> None:
        rel = f"{device_dir}/{iio}"
        self.write(f"{rel}/name", "ina3221x\n")
        self.link(f"sys/bus/i2c/drivers/ina3221x/{client}", device_dir)
        self.link(f"sys/bus/iio/devices/{iio}", rel)
        for channel, rail in enumerate(rails):
            assert rail.label is not None
            self.write(f"{rel}/rail_name_{channel}", f"{rail.label}\n")
            # JetPack 4 limit files carry a unit word (docs/sysfs.md §2).
            self.write(f"{rel}/crit_current_limit_{channel}", "32760 ma\n")
            self.write(f"{rel}/warn_current_limit_{channel}", "32760 ma\n")
            self.dynamic(
                rail.label, f"{rel}/in_power{channel}_input", "power", _rail_milliwatts(rail)
            )
            self.dynamic(
                rail.label, f"{rel}/in_current{channel}_input", "power", _rail_milliamps(rail)
            )
            self.dynamic(
                rail.label, f"{rel}/in_voltage{channel}_input", "power", _rail_millivolts(rail)
            )

    def _rapl(self) -> None:
        control = "sys/devices/virtual/powercap/intel-rapl"
        self.write(f"{control}/enabled", "1\n")
        self.link("sys/class/powercap/intel-rapl", control)
        names = {zone.zone_id: zone.name for zone in self.profile.rapl}
        for zone in self.profile.rapl:
            parts = zone.zone_id.split(":")
            rel = control + "".join(
                f"/intel-rapl:{':'.join(parts[: i + 1])}" for i in range(len(parts))
            )
            self.write(f"{rel}/name", f"{zone.name}\n")
            self.write(f"{rel}/enabled", "1\n")
            self.write(f"{rel}/max_energy_range_uj", f"{self.profile.rapl_max_energy_uj}\n")
            if len(parts) == 1:
                self.write(f"{rel}/constraint_0_name", "long_term\n")
                self.write(f"{rel}/constraint_0_power_limit_uw", "6000000\n")
                self.write(f"{rel}/constraint_0_time_window_us", "27983872\n")
                self.write(f"{rel}/constraint_0_max_power_uw", "6000000\n")
                self.write(f"{rel}/constraint_1_name", "short_term\n")
                self.write(f"{rel}/constraint_1_power_limit_uw", "25000000\n")
                self.write(f"{rel}/constraint_1_time_window_us", "2440\n")
            self.link(f"sys/class/powercap/intel-rapl:{zone.zone_id}", rel)
            parent = zone.zone_id.rsplit(":", 1)[0]
            sensor = zone.name if len(parts) == 1 else f"{names[parent]}/{zone.name}"
            zone_id = zone.zone_id
            self.dynamic(sensor, f"{rel}/energy_uj", "counter", _energy(zone_id))

    def _cpufreq(self, policy: CpuPolicy) -> None:
        rel = f"sys/devices/system/cpu/cpufreq/policy{policy.number}"
        cpus = " ".join(str(cpu) for cpu in policy.cpus)
        self.write(f"{rel}/affected_cpus", f"{cpus}\n")
        self.write(f"{rel}/related_cpus", f"{cpus}\n")
        self.write(f"{rel}/cpuinfo_min_freq", f"{policy.min_khz}\n")
        self.write(f"{rel}/cpuinfo_max_freq", f"{policy.max_khz}\n")
        self.write(
            f"{rel}/cpuinfo_transition_latency", "0\n" if not policy.table_khz else "300000\n"
        )
        self.write(f"{rel}/scaling_min_freq", f"{policy.min_khz}\n")
        self.write(f"{rel}/scaling_max_freq", f"{policy.max_khz}\n")
        self.write(f"{rel}/scaling_driver", f"{policy.driver}\n")
        self.write(f"{rel}/scaling_governor", f"{policy.governor}\n")
        self.write(
            f"{rel}/scaling_available_governors", "".join(f"{g} " for g in policy.governors) + "\n"
        )
        if policy.table_khz:
            table = sorted(policy.table_khz, reverse=policy.table_descending)
            self.write(
                f"{rel}/scaling_available_frequencies", "".join(f"{f} " for f in table) + "\n"
            )
        for cpu in policy.cpus:
            self.link(f"sys/devices/system/cpu/cpu{cpu}/cpufreq", rel)
            if cpu:
                self.write(f"sys/devices/system/cpu/cpu{cpu}/online", "1\n")
        energy_model.write_cpu_nodes(self, policy)
        name = f"policy{policy.number}"
        self.cap_paths[name] = (f"{rel}/scaling_max_freq", 1)
        self.dynamic(name, f"{rel}/scaling_cur_freq", "frequency", _frequency(name, 1))

    def _devfreq(self, device: Devfreq) -> None:
        rel = f"{device.device_dir}/devfreq/{device.name}"
        table = device.table_hz
        self.write(f"{rel}/available_frequencies", " ".join(str(f) for f in table) + "\n")
        self.write(
            f"{rel}/available_governors", f"{device.governor} userspace performance powersave\n"
        )
        self.write(f"{rel}/governor", f"{device.governor}\n")
        self.write(f"{rel}/min_freq", f"{table[0]}\n")
        self.write(f"{rel}/max_freq", f"{table[-1]}\n")
        self.write(f"{rel}/polling_interval", "50\n")
        self.link(f"{rel}/device", device.device_dir)
        if device.energy_model is not None:
            energy_model.write_device_node(self, device)
            self.dynamic(device.name, f"{rel}/load", "load", _load(device))
        elif device.of_node:
            self.write(f"{device.device_dir}/of_node/name", f"{device.of_node}\0")
        self.link(f"sys/class/devfreq/{device.name}", rel)
        self.cap_paths[device.name] = (f"{rel}/max_freq", 1000)
        self.dynamic(device.name, f"{rel}/cur_freq", "frequency", _frequency(device.name, 1000))
        self.dynamic(device.name, f"{rel}/target_freq", "frequency", _frequency(device.name, 1000))


def _zone_render(zone: Zone) -> Callable[[Inputs], str]:
    def render(inputs: Inputs) -> str:
        if zone.quirk == "pmic":
            return "100000\n"
        if zone.quirk == "gated" or (
            zone.quirk == "gated-gpu" and inputs.utils.get("gpu", 0.0) <= 0.0
        ):
            return "-256000\n"
        ambient_c = inputs.ambient_c
        celsius = (
            ambient_c + zone.scale * (inputs.die_c - ambient_c) + zone.offset_c + inputs.noise_c
        )
        step = zone.resolution_mc
        return f"{round(celsius * 1000 / step) * step}\n"

    return render


def _load(device: Devfreq) -> Callable[[Inputs], str]:
    return lambda inputs: energy_model.render_load(device, inputs)


def _energy(zone_id: str) -> Callable[[Inputs], str]:
    return lambda inputs: f"{inputs.energy_uj[zone_id]}\n"


def _frequency(domain: str, per_khz: int) -> Callable[[Inputs], str]:
    return lambda inputs: f"{inputs.freqs_khz[domain] * per_khz}\n"


def rail_watts(rail: Rail, part_w: dict[str, float]) -> float:
    return rail.share * sum(part_w.get(part, 0.0) for part in rail.parts)


def _rail_millivolts(rail: Rail) -> Callable[[Inputs], str]:
    return lambda inputs: f"{rail.millivolts if rail.parts else 0}\n"


def rail_milliamps(rail: Rail, inputs: Inputs) -> int:
    """The current an INA3221 reports: averaged over its window, in whole shunt-voltage LSBs."""
    milliamps = rail_watts(rail, inputs.meter_w) * 1e6 / rail.millivolts
    return round(milliamps / INA3221_CURRENT_LSB_MA) * INA3221_CURRENT_LSB_MA


def _rail_milliamps(rail: Rail) -> Callable[[Inputs], str]:
    return lambda inputs: f"{rail_milliamps(rail, inputs)}\n"


def _rail_milliwatts(rail: Rail) -> Callable[[Inputs], str]:
    # The ina3221x driver multiplies its own quantized current and voltage.
    return lambda inputs: f"{rail_milliamps(rail, inputs) * rail.millivolts // 1000}\n"


def _rail_shunt_microvolts(rail: Rail) -> Callable[[Inputs], str]:
    # 5 mΩ shunt: µV = mA × 5.
    return lambda inputs: f"{rail_milliamps(rail, inputs) * 5}\n"
