"""Control-loop benchmark: timing under load, idle cost, and control quality on the simulator.

    .venv/bin/python bench/control_loop.py [--seconds 60] [--sim-minutes 10] [--only timing|quality]

Timing (real time, the loop in a thread as the daemon runs it, the simulated board in its own
process): sampling lateness against the fixed grid (p50/p99/max) and sample-to-write latency, with
(a) nothing else running, (b) both cores saturated by onnxruntime inference in the same process,
(c) an external CPU hog; and the whole daemon's idle CPU and RSS.

Quality (simulated time, deterministic): the seed rule with raise_hold_ms 0 and other values versus
the best fixed cap that keeps the board at or below 85 °C: peak temperature, seconds above 86 °C,
cap changes per minute, and work done (sum of frequency x busy time, relative to no capping).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import AbstractContextManager, contextmanager
from itertools import repeat
from pathlib import Path

import numpy as np
import onnxruntime as ort
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mcpd import board, domains
from mcpd.baseline import Baseline
from mcpd.events import EventBus
from mcpd.loop import GIL_SWITCH_INTERVAL_S, ControlLoop, LoopSettings
from mcpd.serving.worker import lower_priority
from mcpd.sim import MEMORY_DIR, PROFILES, STATE_FILE, LoadSchedule, Simulator
from sensors import SensorSet

PYTHON = sys.executable
SIM_PID = "run/mcpd-sim/pid"


# -- timing ------------------------------------------------------------------------------------------


@contextmanager
def simulated_board(load: str) -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="mcpd-bench-", dir=MEMORY_DIR) as folder:
        root = Path(folder) / "board"
        command = [
            PYTHON,
            "-m",
            "mcpd",
            "sim",
            "--profile",
            "jetson-orin-nano",
            "--root",
            str(root),
            "--load",
            load,
        ]
        process = subprocess.Popen(command, stderr=subprocess.DEVNULL)
        try:
            while not (root / STATE_FILE).exists():
                time.sleep(0.05)
            (root / SIM_PID).write_text(str(process.pid))
            yield root
        finally:
            process.terminate()
            process.wait()


def onnx_model(path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes, inits, previous = [], [], "x"
    for layer in range(6):
        weight = numpy_helper.from_array(
            rng.standard_normal((512, 512)).astype(np.float32), f"w{layer}"
        )
        inits.append(weight)
        nodes.append(helper.make_node("MatMul", [previous, f"w{layer}"], [f"h{layer}"]))
        nodes.append(helper.make_node("Relu", [f"h{layer}"], [f"r{layer}"]))
        previous = f"r{layer}"
    graph = helper.make_graph(
        nodes, "hog", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 512])],
        [helper.make_tensor_value_info(previous, TensorProto.FLOAT, [64, 512])], inits,
    )  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


@contextmanager
def inference_load(threads: int) -> Iterator[Callable[[], int]]:
    """`threads` Python threads each running an onnxruntime session flat out (one intra-op thread
    each) at the inference workers' lower priority, as in the daemon."""
    with tempfile.TemporaryDirectory() as folder:
        model = Path(folder) / "hog.onnx"
        onnx_model(model)
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        sessions = [
            ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
            for _ in range(threads)
        ]
        stop = threading.Event()
        runs = [0] * threads
        x = np.random.default_rng(1).standard_normal((64, 512)).astype(np.float32)

        def work(index: int) -> None:
            lower_priority()  # as mcpd's inference workers do (mcpd/serving/worker.py)
            while not stop.is_set():
                sessions[index].run(None, {"x": x})
                runs[index] += 1

        workers = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(threads)]
        for worker in workers:
            worker.start()
        try:
            yield lambda: sum(runs)
        finally:
            stop.set()
            for worker in workers:
                worker.join()


@contextmanager
def cpu_hog(processes: int) -> Iterator[Callable[[], int]]:
    hogs = [subprocess.Popen([PYTHON, "-c", "while True: pass"]) for _ in range(processes)]
    try:
        yield lambda: 0
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


@contextmanager
def nothing() -> Iterator[Callable[[], int]]:
    yield lambda: 0


def timing_run(
    name: str, load: Callable[[], AbstractContextManager[Callable[[], int]]], seconds: float
) -> dict[str, object]:
    with simulated_board("bursts:1/1") as root, tempfile.TemporaryDirectory() as state:
        sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)  # as the daemon does
        loop = ControlLoop(
            root,
            board.detect(root),
            LoopSettings(),
            events=EventBus(),
            baseline=Baseline.load([state], root),
        )
        stop = threading.Event()
        thread = threading.Thread(target=loop.run, args=(stop,), name="control-loop")
        process = psutil.Process()
        with load() as counter:
            thread.start()
            time.sleep(2.0)
            loop.timing.lateness_s.clear()
            loop.timing.sample_to_write_s.clear()
            cpu_before = sum(process.cpu_times()[:2])
            time.sleep(seconds)
            cpu = (sum(process.cpu_times()[:2]) - cpu_before) / seconds * 100
            stop.set()
            thread.join()
            runs = counter()
        restore = Baseline.load([state], root).restore(domains.discover(root))
        assert not restore.problems, restore.problems
    summary = loop.timing.summary()
    return {
        "scenario": name,
        "samples": len(loop.timing.lateness_s),
        "writes": len(loop.timing.sample_to_write_s),
        "lateness": summary["sample_lateness"],
        "sample_to_write": summary["sample_to_write"],
        "process_cpu_percent": round(cpu, 1),
        "inference_runs_per_s": round(runs / seconds, 1),
    }


def idle_daemon(seconds: float, live: bool) -> dict[str, object]:
    """The whole daemon (mcpd run) on an idle board: its own CPU and memory.

    live: the simulator keeps running, replacing every changed value file (rename) on each 50 ms
    step, so most reads must reopen the file. Not live: the simulator is stopped and the tree
    stands still, as a real kernel's attributes do (every read is a pread on a kept descriptor).
    """
    with simulated_board("idle") as root, tempfile.TemporaryDirectory() as folder:
        if not live:
            os.kill(int((root / SIM_PID).read_text()), signal.SIGTERM)
            time.sleep(0.5)
        config = Path(folder) / "mcpd.toml"
        config.write_text(
            f'[daemon]\nsysfs_root = "{root}"\nstate_dir = "{folder}/state"\nruntime_dir = "{folder}/run"\nsocket = "{folder}/mcpd.sock"\n'
        )
        daemon = subprocess.Popen(
            [PYTHON, "-m", "mcpd", "run", "--config", str(config)], stderr=subprocess.DEVNULL
        )
        try:
            time.sleep(5.0)
            process = psutil.Process(daemon.pid)
            before = sum(process.cpu_times()[:2])
            time.sleep(seconds)
            cpu = (sum(process.cpu_times()[:2]) - before) / seconds * 100
            rss = process.memory_info().rss / 2**20
        finally:
            daemon.terminate()
            daemon.wait()
    return {
        "board": "simulator running" if live else "tree standing still",
        "cpu_percent_of_one_core": round(cpu, 3),
        "rss_mb": round(rss, 1),
    }


# -- control quality ---------------------------------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def quality_run(
    profile: str, load: str, minutes: float, hold_ms: int | None, fixed: float | None = None
) -> dict[str, float]:
    """Governed (hold_ms set) or with every cap fixed at `fixed` x its max and no governor.

    Both are measured the same way: the governing temperature and power read through mcpd's own
    sensors every 0.2 s of simulated time."""
    with tempfile.TemporaryDirectory(dir=MEMORY_DIR) as folder:
        sim = Simulator(PROFILES[profile], Path(folder) / "board", load=LoadSchedule.parse(load))
        sim.build()
        clock = FakeClock()
        tick: Callable[[float], float]
        changes: list[int] = []
        if fixed is not None:
            for domain in domains.discover(sim.root):
                domain.change_cap(domain.max_mhz * fixed)
            tick = lambda now: now + 0.2  # noqa: E731
        else:
            events = EventBus()
            events.subscribe(
                lambda e: changes.append(1) if e.kind == "governor" and e.data.get("caps") else None
            )
            settings = LoopSettings(raise_hold_s=(hold_ms or 0) / 1000)
            loop = ControlLoop(
                sim.root,
                board.detect(sim.root),
                settings,
                events=events,
                baseline=None,
                clock=clock,
            )
            tick = loop.tick
        meter = SensorSet.discover(sim.root)
        temps: list[float] = []
        powers: list[float] = []
        wake, next_measure = 0.0, 0.0
        while clock.now < minutes * 60:
            sim.advance(wake - clock.now)
            clock.now = wake
            wake = tick(clock.now)
            if clock.now >= next_measure:
                temps.append(meter.sample_temperatures().celsius or 0.0)
                powers.append(meter.sample_powers(clock.now).watts or 0.0)
                next_measure += 0.2
        work = sum(sim.work_mhz_s.values())
    return {
        "peak_c": round(max(temps), 2),
        "seconds_above_86": round(sum(0.2 for t in temps if t > 86.0), 1),
        "peak_w": round(max(powers), 2),
        "cap_changes_per_min": round(len(changes) / minutes, 1),
        "work": work,
    }


def within_envelope(result: dict[str, float]) -> bool:
    return result["peak_c"] <= 85.0 and result["peak_w"] < 12.0


def best_fixed(profile: str, load: str, minutes: float) -> tuple[float, dict[str, float]]:
    """The highest uniform cap (fraction of each domain's max) that keeps the board inside the
    envelope the governor enforces: at or below 85 °C, and below 12 W where power is measured."""
    full = quality_run(profile, load, minutes, None, 1.0)
    if within_envelope(full):
        return 1.0, full
    low, high = 0.2, 1.0
    best = (low, quality_run(profile, load, minutes, None, low))
    for _ in range(7):
        middle = (low + high) / 2
        result = quality_run(profile, load, minutes, None, middle)
        if within_envelope(result):
            low, best = middle, (middle, result)
        else:
            high = middle
    return best


SCENARIOS = (
    ("jetson-orin-nano", "sustained"),
    ("jetson-nano-jp4", "sustained"),
    ("jetson-nano-jp4", "bursts:90/60"),
    ("rk3588", "sustained"),
    ("rk3588", "bursts:90/60"),
)


def quality(minutes: float) -> list[dict[str, object]]:
    """Every scenario in its own process: simulated time is deterministic, so running them side by
    side changes nothing but the wall-clock time."""
    with ProcessPoolExecutor() as pool:
        results = pool.map(quality_scenario, *zip(*SCENARIOS, strict=True), repeat(minutes))
        return [row for rows in results for row in rows]


def quality_scenario(profile: str, load: str, minutes: float) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    uncapped = quality_run(profile, load, minutes, None, 1.0)["work"]
    fraction, fixed = best_fixed(profile, load, minutes)
    rows.append(
        {
            "profile": profile,
            "load": load,
            "policy": f"best fixed cap ({fraction:.3f} x max)",
            **fixed,
            "work": round(fixed["work"] / uncapped, 3),
        }
    )
    for hold in (0, 1000, 2000, 5000, 10000):
        result = quality_run(profile, load, minutes, hold)
        rows.append(
            {
                "profile": profile,
                "load": load,
                "policy": f"governor, raise_hold_ms {hold}",
                **result,
                "work": round(result["work"] / uncapped, 3),
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=60.0, help="per timing scenario")
    parser.add_argument(
        "--sim-minutes", type=float, default=10.0, help="simulated minutes per quality run"
    )
    parser.add_argument("--only", choices=["timing", "quality"])
    args = parser.parse_args()
    report: dict[str, object] = {"date": time.strftime("%Y-%m-%d"), "cpus": os.cpu_count()}
    if args.only in (None, "timing"):
        report["timing"] = [
            timing_run("no other load", nothing, args.seconds),
            timing_run("2 onnxruntime threads in-process", lambda: inference_load(2), args.seconds),
            timing_run("2 external CPU hogs", lambda: cpu_hog(2), args.seconds),
        ]
        report["idle_daemon"] = [
            idle_daemon(args.seconds, live) for live in (True, False) for _ in range(3)
        ]
    if args.only in (None, "quality"):
        report["quality"] = quality(args.sim_minutes)
    print(json.dumps(report, indent=1))
    if "quality" in report:
        print(
            "\n| profile | load | policy | peak °C | s > 86 °C | cap changes/min | work vs uncapped |"
        )
        print("|---|---|---|---|---|---|---|")
        for row in report["quality"]:  # type: ignore[attr-defined]
            print(
                f"| {row['profile']} | {row['load']} | {row['policy']} | {row['peak_c']} | {row['seconds_above_86']} | {row['cap_changes_per_min']} | {row['work']} |"
            )


if __name__ == "__main__":
    main()
