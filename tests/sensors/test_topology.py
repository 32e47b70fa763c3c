"""The CPU topology read from sysfs (sensors/topology.py and its adapters): fixture trees
transcribed from real kernels' files (docs/cpu-topology.md), the fallbacks of kernels without a
file, and the errors real kernels return."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from sensors import cpulist
from sensors.topology import CpuTopology
from tests.support.fakesys import FakeSysfs

Overlay = Callable[[Path, dict[str, str] | Path], Path]
CPU = "sys/devices/system/cpu"


def rk3588_bsp(fake: FakeSysfs) -> None:
    """A ROCK 5B on the 5.10 BSP kernel: cpu_capacity from capacity-dmips-mhz 530/1024 at the
    BSP's 1.8/2.304 GHz, no cluster_cpus_list (5.16+), clusters as cpufreq policies."""
    fake.file(f"{CPU}/online", "0-7\n")
    for cpu in range(8):
        fake.file(f"{CPU}/cpu{cpu}/cpu_capacity", "414\n" if cpu < 4 else "1024\n")
        fake.file(f"{CPU}/cpu{cpu}/topology/thread_siblings_list", f"{cpu}\n")
        fake.file(f"{CPU}/cpu{cpu}/topology/core_cpus_list", f"{cpu}\n")
    fake.cpufreq(0, (0, 1, 2, 3), 408000, 1800000, (408000, 1800000))
    fake.cpufreq(4, (4, 5), 408000, 2304000, (408000, 2304000))
    fake.cpufreq(6, (6, 7), 408000, 2304000, (408000, 2304000))
    fake.file("sys/devices/system/node/node0/cpulist", "0-7\n")


def raptor_lake(fake: FakeSysfs) -> None:
    """An i7-13800H on a 6.8 kernel: P-core threads 0-11 side by side, E-cores 12-19 in two L2
    modules, the cpu_core/cpu_atom PMUs, intel_pstate's per-CPU maxima, no cpu_capacity."""
    fake.file(f"{CPU}/online", "0-19\n")
    for cpu in range(20):
        siblings = f"{cpu & ~1}-{cpu | 1}" if cpu < 12 else str(cpu)
        cluster = siblings if cpu < 12 else ("12-15" if cpu < 16 else "16-19")
        fake.file(f"{CPU}/cpu{cpu}/topology/core_cpus_list", f"{siblings}\n")
        fake.file(f"{CPU}/cpu{cpu}/topology/thread_siblings_list", f"{siblings}\n")
        fake.file(f"{CPU}/cpu{cpu}/topology/cluster_cpus_list", f"{cluster}\n")
        fake.cpufreq(cpu, (cpu,), 400000, 5200000 if cpu < 12 else 4000000, driver="intel_pstate")
    fake.file("sys/devices/cpu_core/cpus", "0-11\n")
    fake.file("sys/devices/cpu_atom/cpus", "12-19\n")
    fake.file("sys/devices/system/node/node0/cpulist", "0-19\n")


def test_cpu_lists_as_the_kernel_prints_them() -> None:
    assert cpulist.parse("0-3,8-11,14\n") == {0, 1, 2, 3, 8, 9, 10, 11, 14}
    assert cpulist.parse("\n") == frozenset()
    for wrong in ("3-1", "0-3:2/4", "a", "1,,2", "-1", "0-9000"):
        assert cpulist.parse(wrong) is None, wrong
    assert cpulist.format_list([14, 0, 1, 2, 3, 9, 8]) == "0-3,8-9,14"
    assert cpulist.format_list([]) == ""
    assert cpulist.parse_words("0 1 2 3 \n") == {0, 1, 2, 3}
    assert cpulist.parse_words("0 x") is None


def test_rk3588_capacities_and_the_policies_as_clusters(fake: FakeSysfs) -> None:
    rk3588_bsp(fake)
    topology = CpuTopology.from_sysfs(fake.root)
    assert [cpu.capacity for cpu in topology.cpus] == [414] * 4 + [1024] * 4
    assert topology.cpu(5).cluster == {4, 5} and topology.cpu(0).cluster == {0, 1, 2, 3}
    assert topology.cpu(6).max_khz == 2304000
    assert all(cpu.siblings == {cpu.number} and cpu.node == 0 for cpu in topology.cpus)
    assert topology.usable == set(range(8))  # a tree that is not this machine's: all of it


def test_intel_hybrid_core_types_threads_and_modules(fake: FakeSysfs) -> None:
    raptor_lake(fake)
    topology = CpuTopology.from_sysfs(fake.root)
    assert {cpu.number for cpu in topology.cpus if cpu.core_type == "core"} == set(range(12))
    assert {cpu.number for cpu in topology.cpus if cpu.core_type == "atom"} == set(range(12, 20))
    assert topology.cpu(3).siblings == {2, 3} and topology.cpu(3).core == 2
    assert topology.cpu(13).cluster == {12, 13, 14, 15}
    assert all(cpu.capacity is None for cpu in topology.cpus)


def test_a_kernel_without_the_newer_files_falls_back(fake: FakeSysfs) -> None:
    """L4T R32 (4.9): no cpu_capacity, no core_cpus_list, no cluster_cpus_list, no NUMA; and no
    `online` list either: the cpuN folders are the CPUs."""
    fake.cpufreq(0, (0, 1, 2, 3), 102000, 1479000, (102000, 1479000))
    for cpu in range(4):
        fake.file(f"{CPU}/cpu{cpu}/topology/thread_siblings_list", f"{cpu}\n")
    topology = CpuTopology.from_sysfs(fake.root)
    assert [cpu.number for cpu in topology.cpus] == [0, 1, 2, 3]
    assert all(cpu.cluster == {0, 1, 2, 3} and cpu.node is None for cpu in topology.cpus)
    assert all(cpu.capacity is None and cpu.max_khz == 1479000 for cpu in topology.cpus)


def test_values_no_kernel_prints_are_unknown_never_errors(fake: FakeSysfs) -> None:
    rk3588_bsp(fake)
    fake.file(f"{CPU}/cpu0/cpu_capacity", "0\n")
    fake.file(f"{CPU}/cpu1/cpu_capacity", "2048\n")
    fake.file(f"{CPU}/cpu2/cpu_capacity", "-1\n")
    fake.file(f"{CPU}/cpu4/topology/core_cpus_list", "5-4\n")
    fake.file(f"{CPU}/cpufreq/policy6/cpuinfo_max_freq", "fast\n")
    fake.file("sys/devices/cpu_core/cpus", "0-3\n")  # a core list without an atom list
    os.mkfifo(fake.root / f"{CPU}/cpu3/cpu_capacity.fifo")
    os.replace(fake.root / f"{CPU}/cpu3/cpu_capacity.fifo", fake.root / f"{CPU}/cpu3/cpu_capacity")
    topology = CpuTopology.from_sysfs(fake.root)
    assert [cpu.capacity for cpu in topology.cpus[:4]] == [None] * 4
    assert topology.cpu(4).siblings == {4}  # thread_siblings_list, then itself
    assert topology.cpu(6).max_khz is None and topology.cpu(6).cluster == {6, 7}
    assert all(cpu.core_type is None for cpu in topology.cpus)


@pytest.mark.parametrize("code", ["EIO", "ENODEV", "EACCES", "EINVAL"])
def test_read_errors_leave_the_fact_unknown(
    fake: FakeSysfs, errno_overlay: Overlay, code: str
) -> None:
    rk3588_bsp(fake)
    root = errno_overlay(
        fake.root,
        {
            f"{CPU}/cpu5/cpu_capacity": code,
            f"{CPU}/online": code,
            f"{CPU}/cpu5/topology/core_cpus_list": code,
        },
    )
    topology = CpuTopology.from_sysfs(root)
    assert [cpu.number for cpu in topology.cpus] == list(range(8))  # the cpuN folders
    assert topology.cpu(5).capacity is None and topology.cpu(4).capacity == 1024
    assert topology.cpu(5).siblings == {5}


def test_this_machine_is_where_this_process_may_run() -> None:
    topology = CpuTopology.from_sysfs("/")
    assert topology.usable == os.sched_getaffinity(0)
    assert {cpu.number for cpu in topology.cpus} >= topology.usable
