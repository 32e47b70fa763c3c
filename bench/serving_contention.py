"""What another process's CPU costs onnxruntime on two cores: the ceiling under issue 13's served /
in-process goals for the ~1 ms model of bench/serving.py.

    .venv/bin/python bench/serving_contention.py [--batch 4] [--rounds 3] [--seconds 3]

onnxruntime in-process, the ~1 ms model at one batch size, run back to back (a) alone and (b)
beside a competitor process busy for a fraction `duty` of every millisecond and asleep the rest,
the shape of the serving process's event loop and a load generator answering a request every
~1.4 ms. Two configurations of the model: the default session (intra-op threads = cores, two
here), and two sessions of one intra-op thread each, each run from its own thread (no parallel
section, so no thread waiting at a barrier for one that was preempted). Rounds interleave every
configuration, and each figure is the median over rounds; `over_alone` is images/s over the same
configuration's images/s alone.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import multiprocessing.synchronize
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mcpd.demo.build import classifier

DUTIES = (0.0, 0.15, 0.3)
SHAPE = (3, 160, 160)


def compete(duty: float, stop: multiprocessing.synchronize.Event) -> None:
    while not stop.is_set():
        end = time.perf_counter() + duty * 1e-3
        while time.perf_counter() < end:
            pass
        time.sleep((1.0 - duty) * 1e-3)


def sessions(path: str, threads: int, count: int) -> list[ort.InferenceSession]:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    return [
        ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        for _ in range(count)
    ]


def measure(runners: list[Callable[[], None]], batch: int, seconds: float) -> tuple[float, float]:
    """(images/s, CPU µs of this process per image) with each runner looping on its own thread."""
    counts = [0] * len(runners)
    end = time.perf_counter() + seconds

    def loop(index: int) -> None:
        while time.perf_counter() < end:
            runners[index]()
            counts[index] += batch

    cpu, start = time.process_time(), time.perf_counter()
    threads = [threading.Thread(target=loop, args=(i,)) for i in range(len(runners))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    images = sum(counts)
    return images / (time.perf_counter() - start), (time.process_time() - cpu) / images * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        path = str(Path(folder) / "small.onnx")
        onnx.save(classifier(size=160, width=32), path)
        print(json.dumps(contend(path, args.batch, args.rounds, args.seconds), indent=1))


def contend(path: str, batch: int, rounds: int, seconds: float) -> dict[str, object]:
    x = np.random.default_rng(0).random((batch, *SHAPE), np.float32)

    def runner(session: ort.InferenceSession) -> Callable[[], None]:
        return lambda: session.run(None, {"image": x})

    configurations = {
        "default_session": [runner(s) for s in sessions(path, 0, 1)],
        "two_single_thread_sessions": [runner(s) for s in sessions(path, 1, 2)],
    }
    for runners in configurations.values():
        for run in runners:
            run()
    samples: dict[tuple[str, float], list[tuple[float, float]]] = {}
    for _ in range(rounds):
        for duty in DUTIES:
            stop = multiprocessing.Event()
            competitor = multiprocessing.Process(target=compete, args=(duty, stop))
            if duty:
                competitor.start()
            for name, runners in configurations.items():
                samples.setdefault((name, duty), []).append(measure(runners, batch, seconds))
            stop.set()
            if duty:
                competitor.join()
    result: dict[str, object] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "onnxruntime": ort.__version__,
        "batch": batch,
        "rounds": rounds,
    }
    for name in configurations:
        rates = {d: statistics.median(r for r, _ in samples[(name, d)]) for d in DUTIES}
        result[name] = {
            f"duty_{duty:g}": {
                "images_per_s": round(rates[duty]),
                "cpu_us_per_image": round(statistics.median(c for _, c in samples[(name, duty)])),
                "over_alone": round(rates[duty] / rates[0.0], 3),
            }
            for duty in DUTIES
        }
    return result


if __name__ == "__main__":
    main()
