"""Where the CPU goes per served request: the serving process's event-loop thread and its other
threads (the model thread and onnxruntime's intra-op pool), the load generator, and the machine's
idle time, from /proc (proc(5): per-thread utime+stime in /proc/PID/task/TID/stat, the machine's
in /proc/stat), while a closed loop of connections sends requests for the ~1 ms model of
bench/serving.py; beside it, onnxruntime's own CPU per image in-process.

    .venv/bin/python bench/serving_cpu.py [--mode body|shm] [--connections 8] [--seconds 8]
    .venv/bin/python bench/serving_cpu.py --runtime openvino [--streams 2]

With `--runtime openvino` the model is served by mcpd's OpenVINO backend (OpenVINO's default
precision, `--streams` streams) and the in-process figure is the same compiled model at the
server's max batch (4), a request looping per stream as bench/serving.py's in-process reference
(onnxruntime's is at batch 1). On a machine whose cores onnxruntime saturates in-process, the served rate over the in-process
rate is bounded by in-process CPU per image over the served total per request.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import serving as bench

from mcpd.config import OpenVinoOptions
from mcpd.demo.build import classifier

TICK = os.sysconf("SC_CLK_TCK")
MAX_BATCH = 4


def thread_cpu_s(pid: int) -> dict[str, float]:
    """CPU seconds per thread of `pid`: "loop" for the main thread, "others" summed."""
    out = {"loop": 0.0, "others": 0.0}
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(FileNotFoundError):
            fields = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
            seconds = (int(fields[11]) + int(fields[12])) / TICK  # utime, stime
            out["loop" if tid == str(pid) else "others"] += seconds
    return out


def machine_s() -> tuple[float, float]:
    """(all, idle + iowait) CPU seconds of the machine since boot."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return sum(values) / TICK, (values[3] + values[4]) / TICK


def in_process_us(model: Path, shape: tuple[int, ...], seconds: float) -> float:
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(0).random((1, *shape), np.float32)
    session.run(None, {"image": x})
    count, cpu, end = 0, time.process_time(), time.perf_counter() + seconds
    while time.perf_counter() < end:
        session.run(None, {"image": x})
        count += 1
    return (time.process_time() - cpu) / count * 1e6


def openvino_us(reference: bench.InProcess, x: np.ndarray, seconds: float) -> float:
    cpu = time.process_time()
    _, times = reference.rate(x, seconds)
    return (time.process_time() - cpu) / (len(times) * len(x)) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=["body", "shm"], default="shm")
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--runtime", choices=("onnxruntime", "openvino"), default="onnxruntime")
    parser.add_argument("--streams", type=int, default=1, help="OpenVINO's")
    args = parser.parse_args()
    openvino = bench.Runtime(OpenVinoOptions(streams=args.streams))
    folder = Path(tempfile.mkdtemp())
    onnx.save(classifier(size=160, width=32), folder / "small.onnx")
    model = bench.Model("small", folder / "small.onnx", (3, 160, 160), (1,), 1.0)
    if args.runtime == "openvino":
        batch = np.random.default_rng(0).random((MAX_BATCH, *model.shape), np.float32)
        in_process = openvino_us(openvino.open(model.path), batch, 3.0)
    else:
        in_process = in_process_us(model.path, model.shape, 3.0)
    result: dict[str, object] = {
        "runtime": args.runtime,
        "streams": args.streams,
        "mode": args.mode,
        "connections": args.connections,
        "in_process_cpu_us_per_image": round(in_process),
    }
    table = openvino.table() if args.runtime == "openvino" else None
    with bench.mcpd_server(model, MAX_BATCH, folder, table=table) as server:
        x = np.random.default_rng(0).random((1, *model.shape), np.float32)
        request = (
            bench.shm_request(server.sock, x)
            if args.mode == "shm"
            else contextlib.nullcontext(bench.mcpd_request(x))
        )
        with request as payload:
            generator = bench.LoadGenerator(
                lambda: asyncio.open_unix_connection(server.sock), payload, args.connections
            )
            generator.measure(1.0)
            threads, client, machine = thread_cpu_s(server.pid), os.times(), machine_s()
            answered, elapsed = generator.measure(args.seconds)
            threads_end, client_end, machine_end = (
                thread_cpu_s(server.pid),
                os.times(),
                machine_s(),
            )
            generator.close()
    n = len(answered)

    def per_request(seconds: float) -> int:
        return round(seconds / n * 1e6)

    busy = (machine_end[0] - machine[0]) - (machine_end[1] - machine[1])
    result.update(
        {
            "requests_per_s": round(n / elapsed, 1),
            "cpu_us_per_request": {
                "server_event_loop": per_request(threads_end["loop"] - threads["loop"]),
                "server_model_and_onnxruntime": per_request(
                    threads_end["others"] - threads["others"]
                ),
                "load_generator": per_request(
                    client_end.user - client.user + client_end.system - client.system
                ),
                "machine_busy": per_request(busy),
                "machine_idle": per_request(machine_end[1] - machine[1]),
            },
        }
    )
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
