"""Control-loop benchmark: timing under load, idle cost, and control quality on the simulator.

    .venv/bin/python bench/control_loop.py [--seconds 60] [--only timing|quality]
    .venv/bin/python bench/control_loop.py --only quality --profile P --scenario S --governor G \
        [--ambient C] [--sim-minutes M] [--seed N] [--cap-fraction F] --json

Timing (real time, the loop in a thread as the daemon runs it, the simulated board in its own
process): sampling lateness against the fixed grid (p50/p99/max) and sample-to-write latency, with
(a) nothing else running, (b) both cores saturated by onnxruntime inference in the same process,
(c) an external CPU hog; and the whole daemon's idle CPU and RSS.

Quality (simulated time, deterministic; bench/quality.py): a governor against the best fixed cap
inside the governed range that keeps every sample at or below 85 °C and below the power limit.
With --profile, one case as one JSON document; without, the sweep over profiles x scenarios x
ambients x seeds (--profiles, --scenarios, --ambients, --seeds, --governors), every row as JSON,
then a table of medians over seeds; --fixed-cache keeps the best fixed caps between sweeps and
--rows the rows, so that an interrupted sweep resumes.
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
from concurrent.futures import ProcessPoolExecutor, as_completed
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

import numpy as np
import onnxruntime as ort
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mcpd.events import EventBus
from mcpd.governor import board, domains
from mcpd.governor.baseline import Baseline
from mcpd.governor.loop import GIL_SWITCH_INTERVAL_S, ControlLoop
from mcpd.governor.loop_settings import LoopSettings
from mcpd.serving.worker import lower_priority
from mcpd.sim import MEMORY_DIR, PROFILES, STATE_FILE

sys.path.insert(0, str(Path(__file__).resolve().parent))
import quality  # bench/quality.py, beside this script

from tests.support.daemon import mcpd_run

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
        nodes,
        "hog",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 512])],
        [helper.make_tensor_value_info(previous, TensorProto.FLOAT, [64, 512])],
        inits,
    )
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
        daemon = subprocess.Popen(mcpd_run(config, python=PYTHON), stderr=subprocess.DEVNULL)
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


# -- control quality (bench/quality.py) ------------------------------------------------------------


def quality_sweep(args: argparse.Namespace) -> list[dict[str, object]]:
    """Every case (its seeds in order) in its own process: simulated time is deterministic, so
    running them side by side changes nothing but the wall-clock time. Rows are printed as JSON
    lines as they come, and appended to --rows, whose rows are kept and not run again."""
    grid = quality.cases(
        args.profiles, args.scenarios, args.ambients, range(args.seeds), args.sim_minutes
    )
    by_case: dict[tuple[str, str, float], list[quality.Case]] = {}
    for case in grid:
        by_case.setdefault((case.profile, case.scenario, case.ambient_c), []).append(case)
    governors = tuple(args.governors)
    rows: list[dict[str, object]] = []
    if args.rows and args.rows.exists():
        labels = [f"{g}, warm" if args.warm else g for g in governors]
        wanted = {(c.profile, c.scenario, c.ambient_c, c.seed, g) for c in grid for g in labels}
        kept = [json.loads(line) for line in args.rows.read_text().splitlines() if line.strip()]
        rows = [row for row in kept if quality.row_key(row) in wanted]
    done = frozenset(quality.row_key(row) for row in rows)
    with ProcessPoolExecutor(args.jobs) as pool:
        futures = [
            pool.submit(quality.sweep_seeds, seeds, governors, args.fixed_cache, done, args.warm)
            for seeds in by_case.values()
        ]
        for future in as_completed(futures):
            for row in future.result():
                line = json.dumps(row)
                print(line, flush=True)
                if args.rows:
                    with args.rows.open("a") as out:
                        out.write(line + "\n")
                rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=60.0, help="per timing scenario")
    parser.add_argument("--only", choices=["timing", "quality"])
    one = parser.add_argument_group("quality, one case (prints one JSON document)")
    one.add_argument("--profile", choices=sorted(PROFILES))
    one.add_argument("--scenario", choices=quality.SCENARIOS, default="sustained")
    one.add_argument("--governor", choices=quality.GOVERNORS, default="hysteresis")
    one.add_argument("--ambient", type=float, default=25.0, help="°C")
    one.add_argument("--sim-minutes", type=float, default=10.0)
    one.add_argument("--seed", type=int, default=0)
    one.add_argument("--cap-fraction", type=float, default=1.0, help="for --governor fixed")
    one.add_argument("--raise-hold-ms", type=int, default=0, help="for --governor hysteresis")
    one.add_argument("--json", action="store_true", help="(the only output format)")
    one.add_argument(
        "--trace", action="store_true", help='add "trace": every cap change, when and why'
    )
    grid = parser.add_argument_group("quality, the sweep (without --profile)")
    grid.add_argument("--profiles", nargs="+", default=sorted(PROFILES))
    grid.add_argument("--scenarios", nargs="+", default=list(quality.SCENARIOS))
    grid.add_argument("--ambients", nargs="+", type=float, default=[25.0, 40.0])
    grid.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1")
    grid.add_argument("--governors", nargs="+", default=["hysteresis"])
    grid.add_argument("--jobs", type=int, default=2, help="processes")
    grid.add_argument(
        "--warm",
        action="store_true",
        help="each governed run starts from the power a first run of the same case learned "
        '(a restarted daemon); rows say "GOVERNOR, warm"',
    )
    grid.add_argument(
        "--fixed-cache", type=Path, help="folder keeping best fixed caps between sweeps"
    )
    grid.add_argument(
        "--rows",
        type=Path,
        help="JSON-lines file the rows are appended to; rows already in it are not run again "
        "(resumes a sweep: start a new file when a governor changes)",
    )
    args = parser.parse_args()
    if args.only == "quality" and args.profile:
        case = quality.Case(args.profile, args.scenario, args.ambient, args.sim_minutes, args.seed)
        fraction = args.cap_fraction
        document = quality.measure(case, args.governor, fraction, args.raise_hold_ms, args.trace)
        print(json.dumps(document))
        return
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
    if "timing" in report:
        print(json.dumps(report, indent=1))
    if args.only in (None, "quality"):
        print(f"quality sweep, {report['date']}, {report['cpus']} CPUs", flush=True)
        rows = quality_sweep(args)
        print("\n" + "\n".join(quality.median_table(rows)))


if __name__ == "__main__":
    main()
