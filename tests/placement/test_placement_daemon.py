"""The placement plan applied by the real daemon: `mcpd run` on a simulated board whose CPU
topology is this machine's (`mcpd sim --topology host`, in a process of its own as the hardware
would be), serving the demo model; the CPUs each thread of the governor and of the serving
process may run on read back from /proc, against the plan the status shows."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from mcpd import config
from mcpd.client import Client
from mcpd.demo import MODEL
from mcpd.placement import plan
from mcpd.sim import STATE_FILE
from sensors import cpulist
from sensors.topology import CpuTopology
from tests.conftest import PROJECT
from tests.support.affinity import allowed
from tests.support.daemon import DaemonProcess, models_ready
from tests.support.waiting import wait_until


@contextmanager
def daemon(tmp_path: Path, extra: str = "", model: str = "") -> Iterator[Client]:
    """The daemon with `extra` in its [daemon] table and `model` in the demo model's."""
    board = tmp_path / "board"
    sim = subprocess.Popen(
        [sys.executable, "-m", "mcpd", "sim", "--profile", "jetson-orin-nano", "--root", str(board),
         "--topology", "host", "--load", "idle"],
        cwd=PROJECT, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    sock = tmp_path / "mcpd.sock"
    (tmp_path / "mcpd.toml").write_text(
        f'[daemon]\nsysfs_root = "{board}"\nsocket = "{sock}"\nstate_dir = "{tmp_path}/state"\n'
        f'runtime_dir = "{tmp_path}/run"\n{extra}'
        f'[[models]]\nname = "demo"\npath = "{MODEL}"\n{model}'
    )
    try:
        wait_until(lambda: (board / STATE_FILE).exists(), 120, "the simulated board")
        with DaemonProcess(
            tmp_path / "mcpd.toml", log=tmp_path / "daemon.log", stop_timeout=30
        ) as run:
            run.wait_until(lambda: models_ready(sock, "demo"), 60, "the demo model")
            with Client(str(sock), timeout=30) as client:
                yield client
    finally:
        sim.terminate()
        sim.wait(30)


def expected(extra: dict[str, Any]) -> plan.Plan:
    cfg = config.parse({"daemon": extra, "models": [{"name": "demo", "path": str(MODEL)}]})
    return plan.make(cfg, CpuTopology.from_sysfs("/"), os.sched_getaffinity(0))


def test_the_governor_the_loop_and_the_models_threads_run_where_the_plan_says(
    tmp_path: Path,
) -> None:
    made = expected({})
    with daemon(tmp_path) as client:
        document = client.status()
        client.infer("demo", {"image": np.zeros((1, 3, 64, 64), np.float32)})
        governor, serving = document["daemon"]["pid"], document["serving"]["pid"]
        governor_threads, serving_threads = allowed(governor), allowed(serving)
    assert document["placement"] == made.doc()
    assert set(governor_threads.values()) == {frozenset(made.governor.cpus)}
    assert serving_threads[serving] == frozenset(made.serving_loop.cpus)  # its event loop
    pinned = set(serving_threads.values())
    # The model's worker thread on its CPUs; onnxruntime pins each of its other threads to one.
    demo = made.models["demo"].thread_cpus
    assert frozenset(demo) in pinned, serving_threads
    for cpu in demo[1:]:
        assert frozenset({cpu}) in pinned, (cpu, serving_threads)


def test_placement_off_leaves_every_thread_where_the_scheduler_likes(tmp_path: Path) -> None:
    with daemon(tmp_path, 'placement = "off"\n') as client:
        document = client.status()
        governor, serving = document["daemon"]["pid"], document["serving"]["pid"]
        here = os.sched_getaffinity(0)
        assert set(allowed(governor).values()) == {frozenset(here)}
        assert allowed(serving)[serving] == frozenset(here)
    assert document["placement"]["mode"] == "off"
    assert document["placement"]["models"]["demo"]["skipped"] == (
        'placement is off ([daemon] placement = "off")'
    )


def test_a_model_on_cpus_this_machine_lacks_is_served_unplaced(tmp_path: Path) -> None:
    here = os.sched_getaffinity(0)
    with daemon(tmp_path, model='cpus = "8000"\n') as client:
        document = client.status()
        answer = client.infer("demo", {"image": np.zeros((1, 3, 64, 64), np.float32)})
        serving = document["serving"]["pid"]
        threads = allowed(serving)
    assert answer  # served
    demo = document["placement"]["models"]["demo"]
    assert demo["skipped"] == (
        f"CPUs 8000 are not this machine's to use (it may use {cpulist.format_list(here)})"
    )
    # Its threads run wherever mcpd may, not on the event loop's CPU alone.
    assert frozenset(here) in set(threads.values())
