"""Placement (issue 30 §1) on this machine: the real daemon with `[daemon] placement = "auto"`
(the governor and serving's event loop kept off the model's CPUs) against `"off"` (today's free
placement: every thread where the scheduler puts it), side by side in one run.

    nice .venv/bin/python bench/placement.py [--rounds 5] [--seconds 20] [--concurrency 8]
                                             [--model small|resnet50]

Each run is `mcpd run` governing a simulated Orin Nano whose CPU topology is this machine's
(`mcpd sim --topology host`, in a process of its own as the hardware would be, under sustained
simulated load so that the governor has caps to move) and serving one model, loaded by a closed
loop of C connections (bench/serving.py's load generator, binary tensors over the socket, one
image per request) for `--seconds` after 3 s of warm-up. The figures: requests answered per
second and their p50/p99 latency, the governor's sample lateness (p50/p99/max over the whole run,
start-up included, from its status document) and its CPU, and the plan it made. The two arms
alternate within each round (auto first in odd rounds, off first in even ones) so that a machine
drifting over minutes falls on both alike; the summary gives each arm's medians over the rounds
and the medians of the per-round ratios auto / off. The machine's load average is taken before
each run. Models: "small", the ~1 ms classifier of bench/serving.py (160x160, width 32), or
"resnet50", its ResNet-50-shaped model (~22 ms here).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from serving import LoadGenerator, mcpd_request, percentiles, process, wait_for

from mcpd.client import Client
from mcpd.demo.build import classifier, resnet50
from mcpd.sim import MEMORY_DIR, STATE_FILE
from tests.support.daemon import mcpd_run, models_ready

PYTHON = sys.executable
ARMS = ("auto", "off")
SHAPES = {"small": (3, 160, 160), "resnet50": (3, 224, 224)}
WARM_S = 3.0


@contextmanager
def board(folder: Path) -> Iterator[Path]:
    root = folder / "board"
    command = [PYTHON, "-m", "mcpd", "sim", "--profile", "jetson-orin-nano", "--root", str(root),
               "--topology", "host", "--load", "sustained"]  # fmt: skip
    with process(command):
        wait_for(lambda: (root / STATE_FILE).exists(), "the simulated board")
        yield root


@contextmanager
def daemon(folder: Path, root: Path, model: Path, placement: str) -> Iterator[Path]:
    sock = folder / "mcpd.sock"
    (folder / "mcpd.toml").write_text(
        f'[daemon]\nsysfs_root = "{root}"\nsocket = "{sock}"\nstate_dir = "{folder}/state"\n'
        f'runtime_dir = "{folder}/run"\nplacement = "{placement}"\n'
        f'[[models]]\nname = "m"\npath = "{model}"\nmax_batch = 8\n'
    )
    with process(mcpd_run(folder / "mcpd.toml", python=PYTHON)):
        wait_for(lambda: models_ready(sock, "m"), "mcpd")
        yield sock


def one_run(
    folder: Path, model: Path, shape: tuple[int, ...], arm: str, args: Any
) -> dict[str, Any]:
    load_average = os.getloadavg()
    with board(folder) as root, daemon(folder, root, model, arm) as sock:
        x = np.random.default_rng(0).random((1, *shape), np.float32)
        generator = LoadGenerator(
            lambda: asyncio.open_unix_connection(str(sock)), mcpd_request(x), args.concurrency
        )
        generator.measure(WARM_S)
        latencies, elapsed = generator.measure(args.seconds)
        generator.close()
        with Client(str(sock), timeout=30) as client:
            document = client.status()
    p50, p99 = percentiles(latencies)
    lateness = document["loop"]["sample_lateness"] or {}
    return {
        "placement": arm,
        "load_average_before": [round(v, 2) for v in load_average],
        "requests_per_s": round(len(latencies) / elapsed, 1),
        "p50_ms": round(p50, 3),
        "p99_ms": round(p99, 3),
        "lateness_p50_ms": lateness.get("p50_ms"),
        "lateness_p99_ms": lateness.get("p99_ms"),
        "lateness_max_ms": lateness.get("max_ms"),
        "governor_cpu_percent": document["daemon"]["cpu_percent"],
        "plan": document["placement"]["note"],
        "model_cpus": document["placement"]["models"]["m"]["cpus"],
        "model_threads": document["placement"]["models"]["m"]["threads"],
    }


FIGURES = ("requests_per_s", "p50_ms", "p99_ms", "lateness_p50_ms", "lateness_p99_ms",
           "lateness_max_ms")  # fmt: skip
"""Summarized; a run also has the governor's CPU over the status document's last second."""


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    by_arm = {arm: [run for run in runs if run["placement"] == arm] for arm in ARMS}
    medians = {
        arm: {key: statistics.median(run[key] for run in arm_runs) for key in FIGURES}
        for arm, arm_runs in by_arm.items()
    }
    ratios = {}
    for key in FIGURES:
        pairs = zip(by_arm["auto"], by_arm["off"], strict=True)
        each = [auto[key] / off[key] for auto, off in pairs if off[key]]
        ratios[key] = round(statistics.median(each), 3) if each else None
    return {"medians": medians, "ratio_auto_over_off": ratios}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--model", choices=sorted(SHAPES), default="small")
    args = parser.parse_args()
    runs = []
    with tempfile.TemporaryDirectory(prefix="mcpd-bench-", dir=MEMORY_DIR) as scratch:
        model = Path(scratch) / f"{args.model}.onnx"
        built = classifier(size=160, width=32) if args.model == "small" else resnet50()
        onnx.save(built, model)
        for round_ in range(args.rounds):
            for arm in ARMS if round_ % 2 == 0 else reversed(ARMS):
                folder = Path(scratch) / f"run-{round_}-{arm}"
                folder.mkdir()
                run = one_run(folder, model, SHAPES[args.model], arm, args)
                print(json.dumps(run), file=sys.stderr, flush=True)
                runs.append(run)
    cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    name = next((line.split(":", 1)[1].strip() for line in cpu.splitlines()
                 if line.startswith("Model name")), "?")  # fmt: skip
    report = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "cpu": name,
        "cpus": sorted(os.sched_getaffinity(0)),
        "model": args.model,
        "concurrency": args.concurrency,
        "seconds": args.seconds,
        "runs": runs,
        **summarize(runs),
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
