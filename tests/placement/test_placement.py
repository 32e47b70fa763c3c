"""The placement plan (mcpd/placement/plan.py) on the simulated boards' real topologies and on
the machines every rule has to cover: one CPU, two alike (this project's VM), CPUs this machine
does not have, the config's overrides."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from mcpd import config
from mcpd.ctl.status import format_status
from mcpd.governor.probe import format_table, probe
from mcpd.placement import plan
from mcpd.sim import PROFILES, Simulator
from sensors.topology import Cpu, CpuTopology

EVERY_CPU = range(64)


def board(tmp_path: Path, profile: str) -> CpuTopology:
    simulator = Simulator(PROFILES[profile], tmp_path / profile)
    simulator.build()
    return CpuTopology.from_sysfs(simulator.root)


def models(*tables: dict[str, Any], **daemon: Any) -> config.Config:
    named = [{"name": f"m{i}", "path": f"m{i}.onnx", **table} for i, table in enumerate(tables)]
    return config.parse({"daemon": daemon, "models": named})


def alike(count: int) -> CpuTopology:
    """`count` CPUs with nothing to tell them apart, as a KVM guest shows them."""
    cpus = tuple(Cpu(n, 1024, None, frozenset({n}), frozenset({n}), None, 0) for n in range(count))
    return CpuTopology(cpus, frozenset(range(count)))


def test_rk3588_models_on_the_a76_clusters_the_governor_and_loop_on_a55s(tmp_path: Path) -> None:
    made = plan.make(models({}), board(tmp_path, "rk3588"), EVERY_CPU)
    assert made.ranked_by == "cpu_capacity"
    assert made.governor.cpus == (0,) and made.serving_loop.cpus == (1,)
    assert made.models_cpus.cpus == (4, 5, 6, 7)
    assert made.models["m0"].thread_cpus == (4, 5, 6, 7)


def test_i7_13800h_one_thread_per_p_core_and_the_e_cores_for_the_daemon(tmp_path: Path) -> None:
    topology = board(tmp_path, "x86-intel-hybrid")
    made = plan.make(models({}), topology, EVERY_CPU)
    assert made.ranked_by == "core type"
    assert made.models["m0"].thread_cpus == (0, 2, 4, 6, 8, 10)
    assert made.models["m0"].core_type == "core" and not made.models["m0"].smt
    assert made.governor.cpus == (12,) and made.serving_loop.cpus == (13,)
    # Twelve threads asked for: the P-cores' second threads after their first ones.
    twelve = plan.make(models({"onnxruntime": {"intra_op_threads": 12}}), topology, EVERY_CPU)
    assert twelve.models["m0"].thread_cpus == (0, 2, 4, 6, 8, 10, 1, 3, 5, 7, 9, 11)
    assert twelve.models["m0"].smt
    on_e_cores = plan.make(models({"cpus": "12-15"}), topology, EVERY_CPU).models["m0"]
    assert on_e_cores.thread_cpus == (12, 13, 14, 15) and on_e_cores.core_type == "atom"


def test_orin_nano_keeps_cpu_0_for_the_daemon_and_the_rest_for_models(tmp_path: Path) -> None:
    made = plan.make(models({}), board(tmp_path, "jetson-orin-nano"), EVERY_CPU)
    assert made.ranked_by == "nothing"
    assert made.governor.cpus == made.serving_loop.cpus == (0,)
    assert made.models["m0"].thread_cpus == (1, 2, 3, 4, 5)


def test_the_numa_server_places_models_on_one_node(tmp_path: Path) -> None:
    made = plan.make(models({}), board(tmp_path, "x86-server"), EVERY_CPU)
    assert made.governor.cpus == (0,) and made.serving_loop.cpus == (1,)  # node 0
    assert made.models["m0"].thread_cpus == tuple(range(8, 16))  # node 1's cores, no siblings


@pytest.mark.parametrize("count", [2, 4])
def test_a_few_cpus_alike_the_models_keep_every_one_and_the_daemon_shares_the_first(
    count: int,
) -> None:
    """Leaving CPU 0 to the daemon cost the model a core: 0.66x the requests/s of free placement
    on a quiet 2-core machine; from five cores alike it is left (the Orin Nano above)."""
    made = plan.make(models({}), alike(count), set(range(count)))
    assert made.governor.cpus == made.serving_loop.cpus == (0,)
    assert made.models["m0"].thread_cpus == tuple(range(count))
    assert made.note == (
        "every CPU alike: the governor on CPU 0 with serving's loop, "
        f"models on 0-{count - 1}, a thread per physical core"
    )


def test_one_cpu_is_shared_by_everything() -> None:
    made = plan.make(models({}), alike(1), {0})
    assert made.governor.cpus == made.serving_loop.cpus == made.models["m0"].thread_cpus == (0,)
    assert made.note.startswith("one CPU:")


@pytest.mark.parametrize(
    ("count", "expected"),
    [
        (2, [(4, 5), (6, 7)]),
        (3, [(4, 5), (6,), (7,)]),  # the first model takes the odd core
        (5, [(4, 5, 6, 7)] * 5),  # more models than cores: they share them
    ],
)
def test_models_split_the_fast_cores_in_config_order(
    tmp_path: Path, count: int, expected: list[tuple[int, ...]]
) -> None:
    made = plan.make(models(*[{}] * count), board(tmp_path, "rk3588"), EVERY_CPU)
    assert [made.models[f"m{i}"].thread_cpus for i in range(count)] == expected


def test_a_models_own_cpus_are_kept_out_of_the_others_share(tmp_path: Path) -> None:
    made = plan.make(models({}, {"cpus": "6-7"}), board(tmp_path, "rk3588"), EVERY_CPU)
    assert made.models["m0"].thread_cpus == (4, 5) and not made.models["m0"].configured
    assert made.models["m1"].thread_cpus == (6, 7) and made.models["m1"].configured


def test_cpus_this_machine_lacks_are_reported_and_skipped_never_an_error(tmp_path: Path) -> None:
    made = plan.make(models({}, {"cpus": "0-1"}), board(tmp_path, "rk3588"), {0, 1})
    assert made.governor.skipped is None and made.serving_loop.skipped is None
    assert made.models["m0"].skipped == ("CPUs 4-7 are not this machine's to use (it may use 0-1)")
    assert made.models["m1"].skipped is None  # its own CPUs exist here
    doc = made.doc()
    assert doc["models"]["m0"] == {
        "cpus": "4-7",
        "skipped": "CPUs 4-7 are not this machine's to use (it may use 0-1)",
        "threads": 4,
        "thread_cpus": [4, 5, 6, 7],
        "configured": False,
        "core_type": None,
        "smt": False,
    }


def test_placement_off_places_nothing_and_says_so(tmp_path: Path) -> None:
    made = plan.make(models({}, placement="off"), board(tmp_path, "rk3588"), EVERY_CPU)
    assert made.governor.cpus == made.models_cpus.cpus == ()
    assert made.models["m0"].thread_cpus == ()
    assert made.models["m0"].skipped == 'placement is off ([daemon] placement = "off")'
    assert made.doc()["mode"] == "off"


def test_a_tree_without_cpus_leaves_placement_to_the_scheduler(tmp_path: Path) -> None:
    made = plan.make(models({}), CpuTopology.from_sysfs(tmp_path), EVERY_CPU)
    assert made.governor.cpus == () and made.models["m0"].thread_cpus == ()
    assert made.note == "no CPU topology under the sysfs root: the scheduler places every thread"


@pytest.mark.parametrize(
    ("table", "problem"),
    [
        ({"cpus": "3-1"}, "models[0]: cpus = '3-1': a range runs backwards or past CPU 8191"),
        ({"cpus": "0-3:2/4"}, "models[0].cpus: expected a string matching"),
        ({"cpus": "4, 5"}, "models[0].cpus: expected a string matching"),
    ],
)
def test_a_cpu_list_in_the_config_is_checked_and_named(table: dict[str, Any], problem: str) -> None:
    with pytest.raises(config.ConfigError) as caught:
        models(table)
    assert caught.value.problems[0].startswith(problem)


def test_placement_takes_auto_or_off() -> None:
    with pytest.raises(config.ConfigError) as caught:
        models({}, placement="pinned")
    assert caught.value.problems == ["daemon.placement: expected 'auto' or 'off', got 'pinned'"]


def test_probe_shows_the_cpus_and_the_plan(tmp_path: Path) -> None:
    simulator = Simulator(PROFILES["rk3588"], tmp_path / "board")
    simulator.build()
    result = probe(simulator.root, sleep=lambda s: None, config=models({}))
    assert [cpu["capacity"] for cpu in result["cpus"]] == [397] * 4 + [1024] * 4
    assert result["cpus"][4] == {
        "cpu": 4,
        "capacity": 1024,
        "max_mhz": 2400.0,
        "cluster": "4-5",
        "siblings": "4",
        "core_type": None,
        "node": 0,
    }
    assert result["placement"]["models"]["m0"]["cpus"] == "4-7"
    table = format_table(result)
    assert "0-3                   397     1800 -        0  0-3" in table
    assert f"placement    {result['placement']['note']}" in table


def test_mcpctl_status_shows_the_plan_and_each_models_cpus(tmp_path: Path) -> None:
    made = plan.make(models({}, {"cpus": "0-1"}), board(tmp_path, "rk3588"), {0, 1})
    document = {"placement": made.doc(), "inference": {"m0": {}, "m1": {}}}
    lines = format_status(document).splitlines()
    assert "placement    governor 0, serving loop 1, models 4-7 (ranked by cpu_capacity)" in lines
    assert "  models not placed: CPUs 4-7 are not this machine's to use (it may use 0-1)" in lines
    rows = {line.split()[0]: line for line in lines if line.startswith("m")}
    assert " 4-7 x4 (skipped) " in rows["m0"] and " 0-1 x2 " in rows["m1"]
    off = plan.make(models({}, placement="off"), board(tmp_path, "rk3588"), {0, 1})
    assert "placement    placement is off" in format_status({"placement": off.doc()})


def test_a_cpuset_with_only_the_second_threads_of_some_cores(tmp_path: Path) -> None:
    """A cpuset of the i7's CPUs 1 and 3 (P-cores' second threads) and the E-cores: the models
    get those two threads, each its core's first usable one."""
    simulator = Simulator(PROFILES["x86-intel-hybrid"], tmp_path / "board")
    simulator.build()
    usable = {1, 3, *range(12, 20)}
    topology = CpuTopology.from_sysfs(simulator.root, usable)
    made = plan.make(models({}), topology, usable)
    assert made.models["m0"].thread_cpus == (1, 3) and made.models["m0"].skipped is None
    assert made.governor.cpus == (12,)
