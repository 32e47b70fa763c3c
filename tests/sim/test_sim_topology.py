"""The simulated boards' CPU topologies (mcpd/sim/topology.py), read back through mcpd's own
reader: what docs/cpu-topology.md says each board's kernel prints."""

from __future__ import annotations

from pathlib import Path

import pytest

from mcpd.sim import PROFILES, Simulator
from mcpd.sim.topology import dmips_capacities, host
from sensors.topology import CpuTopology


def read(tmp_path: Path, profile: str) -> CpuTopology:
    simulator = Simulator(PROFILES[profile], tmp_path / profile)
    simulator.build()
    return CpuTopology.from_sysfs(simulator.root)


def test_rk3588_capacities_follow_the_kernels_formula(tmp_path: Path) -> None:
    """capacity-dmips-mhz 530 at 1.8 GHz against 1024 at 2.4 GHz: 530 x 1.8 / 2.4 = 397.5."""
    topology = read(tmp_path, "rk3588")
    assert [cpu.capacity for cpu in topology.cpus] == [397] * 4 + [1024] * 4
    assert [sorted(topology.cpu(n).cluster) for n in (0, 4, 6)] == [[0, 1, 2, 3], [4, 5], [6, 7]]
    assert dmips_capacities((530, 1024), (1800000, 2304000)) == (414, 1024)  # the BSP's clocks


def test_i7_13800h_is_six_p_cores_of_two_threads_and_eight_e_cores(tmp_path: Path) -> None:
    topology = read(tmp_path, "x86-intel-hybrid")
    p_cores = {cpu.core for cpu in topology.cpus if cpu.core_type == "core"}
    e_cores = {cpu.core for cpu in topology.cpus if cpu.core_type == "atom"}
    assert p_cores == {0, 2, 4, 6, 8, 10} and e_cores == set(range(12, 20))
    assert {cpu.max_khz for cpu in topology.cpus} == {5200000, 4000000}


def test_the_server_is_two_nodes_with_siblings_sixteen_apart(tmp_path: Path) -> None:
    topology = read(tmp_path, "x86-server")
    nodes = {n: {cpu.number for cpu in topology.cpus if cpu.node == n} for n in (0, 1)}
    assert nodes == {
        0: set(range(8)) | set(range(16, 24)),
        1: set(range(8, 16)) | set(range(24, 32)),
    }
    assert topology.cpu(17).siblings == {1, 17}


@pytest.mark.parametrize(
    ("profile", "clusters"),
    [("jetson-orin-nano", [[0, 1, 2, 3], [4, 5]]), ("jetson-nano-jp4", [[0, 1, 2, 3]])],
)
def test_jetson_clusters_come_from_cpufreq(
    tmp_path: Path, profile: str, clusters: list[list[int]]
) -> None:
    topology = read(tmp_path, profile)
    assert sorted({tuple(sorted(cpu.cluster)) for cpu in topology.cpus}) == [
        tuple(c) for c in clusters
    ]


def test_this_machines_topology_stands_in_for_a_profiles(tmp_path: Path) -> None:
    simulator = Simulator(PROFILES["jetson-orin-nano"], tmp_path / "board", topology=host())
    simulator.build()
    simulated = CpuTopology.from_sysfs(simulator.root)
    here = CpuTopology.from_sysfs("/")
    assert [(c.number, c.capacity, c.siblings, c.node) for c in simulated.cpus] == [
        (c.number, c.capacity, c.siblings, c.node) for c in here.cpus
    ]
