"""What a board without a power meter offers for estimating power, as its kernel shows it.

- Device-tree nodes (docs/power-estimate.md): each CPU node `cpus/cpu@<reg>` (reg = cluster and
  core, 0x400 for cpu4 on RK3588) and each device node holds `dynamic-power-coefficient` (one
  big-endian cell) and `operating-points-v2` (the phandle of its OPP table); each `opp-<hz>` child
  of the table holds `opp-hz` (64 bits in two cells) and `opp-microvolt` (target, min, max).
  `/sys/devices/system/cpu/cpuN/of_node` and a device's `of_node` link to the nodes.
- `/proc/stat`: per-CPU jiffies (USER_HZ = 100) in user, nice, system, idle, iowait, irq,
  softirq, steal, guest, guest_nice; busy time goes to user, the rest to idle (proc(5)).
- Rockchip devfreq `load`: `<percent>@<Hz>Hz` (docs/sysfs.md §3.5).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mcpd.sim.profiles import CpuPolicy, Devfreq, EnergyModelNode
    from mcpd.sim.tree import BoardTree, Inputs

DT_BASE = "sys/firmware/devicetree/base"
USER_HZ = 100


def cells(*values: int) -> bytes:
    return b"".join(value.to_bytes(4, "big") for value in values)


def _table(tree: BoardTree, model: EnergyModelNode, max_uv: int) -> None:
    rel = f"{DT_BASE}/{model.table}"
    tree.write(f"{rel}/compatible", "operating-points-v2\0")
    tree.write(f"{rel}/phandle", cells(model.phandle))
    for hz, microvolts in model.opps:
        tree.write(f"{rel}/opp-{hz}/opp-hz", cells(hz >> 32, hz & 0xFFFFFFFF))
        tree.write(f"{rel}/opp-{hz}/opp-microvolt", cells(microvolts, microvolts, max_uv))


def _node(tree: BoardTree, node: str, model: EnergyModelNode) -> None:
    if model.coefficient:
        tree.write(f"{DT_BASE}/{node}/dynamic-power-coefficient", cells(model.coefficient))
    tree.write(f"{DT_BASE}/{node}/operating-points-v2", cells(model.phandle))


def write_cpu_nodes(tree: BoardTree, policy: CpuPolicy) -> None:
    model = policy.energy_model
    if model is None:
        return
    _table(tree, model, max(uv for _, uv in model.opps))
    for cpu in policy.cpus:
        node = model.node.format(reg=f"{cpu << 8:x}")
        tree.write(f"{DT_BASE}/{node}/compatible", "arm,armv8\0")
        _node(tree, node, model)
        tree.link(f"sys/devices/system/cpu/cpu{cpu}/of_node", f"{DT_BASE}/{node}")


def write_device_node(tree: BoardTree, device: Devfreq) -> None:
    model = device.energy_model
    if model is None:
        return
    _table(tree, model, max(uv for _, uv in model.opps))
    _node(tree, model.node, model)
    tree.link(f"{device.device_dir}/of_node", f"{DT_BASE}/{model.node}")


class Jiffies:
    """Each CPU's busy and idle time since boot, in jiffies."""

    def __init__(self, cpus: tuple[int, ...]) -> None:
        self.busy = dict.fromkeys(cpus, 0.0)
        self.idle = dict.fromkeys(cpus, 0.0)

    def advance(self, utils_by_cpu: dict[int, float], dt_s: float) -> None:
        for cpu in self.busy:
            util = utils_by_cpu.get(cpu, 0.0)
            self.busy[cpu] += util * dt_s * USER_HZ
            self.idle[cpu] += (1.0 - util) * dt_s * USER_HZ

    def render(self) -> str:
        def line(name: str, busy: float, idle: float) -> str:
            return f"{name} {int(busy)} 0 0 {int(idle)} 0 0 0 0 0 0\n"

        total = line("cpu ", sum(self.busy.values()), sum(self.idle.values()))
        per_cpu = "".join(line(f"cpu{cpu}", self.busy[cpu], self.idle[cpu]) for cpu in self.busy)
        return total + per_cpu + "intr 0\nctxt 0\nbtime 1700000000\nprocesses 1\n"


def render_load(device: Devfreq, inputs: Inputs) -> str:
    percent = round(inputs.utils.get(device.load, 0.0) * 100)
    return f"{percent}@{inputs.freqs_khz[device.name] * 1000}Hz\n"
