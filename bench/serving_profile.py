"""Where a served request's time goes: py-spy samples the serving process (bench/serving_server.py)
while a closed loop of connections sends requests for the ~1 ms model of bench/serving.py, body or
shared memory, and the samples are summed per thread and function (inclusive shares).

    pip install py-spy        # into any environment; its binary is all this needs
    .venv/bin/python bench/serving_profile.py [--mode body|shm] [--seconds 20] [--connections 4]

py-spy must be allowed to read the server's memory (root, or ptrace_scope 0).
"""

from __future__ import annotations

import argparse
import asyncio
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import serving as bench

from mcpd.demo.build import classifier

LINE = re.compile(r":\d+\)")


def shares(raw: Path) -> dict[str, tuple[int, Counter[str]]]:
    """py-spy's raw (collapsed) stacks: per thread, its samples and each function's inclusive count."""
    totals: Counter[str] = Counter()
    inclusive: dict[str, Counter[str]] = defaultdict(Counter)
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        thread, *frames = stack.split(";")
        totals[thread] += int(count)
        for frame in {LINE.sub(")", f) for f in frames}:
            inclusive[thread][frame] += int(count)
    return {thread: (totals[thread], inclusive[thread]) for thread in totals}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=["body", "shm"], default="body")
    parser.add_argument("--seconds", type=int, default=20)
    parser.add_argument("--connections", type=int, default=4)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    spy = shutil.which("py-spy")
    if spy is None:
        sys.exit("py-spy is not on PATH: pip install py-spy")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        path = folder / "small.onnx"
        onnx.save(classifier(size=160, width=32), path)
        model = bench.Model("small", path, (3, 160, 160), (1,), 1.0)
        x = np.random.default_rng(1).random((1, 3, 160, 160), np.float32)
        with bench.mcpd_server(model, 1, folder) as server:
            sock, pid = server.sock, str(server.pid)

            def run(request: bytes) -> None:
                load = bench.LoadGenerator(
                    lambda: asyncio.open_unix_connection(sock), request, args.connections
                )
                load.measure(1.0)  # warm
                raw = folder / "stacks.txt"
                command = [spy, "record", "-p", pid, "-d", str(args.seconds), "-r", "200"]
                recorder = subprocess.Popen(
                    [*command, "-f", "raw", "-o", str(raw), "--threads", "--idle"],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
                latencies, elapsed = load.measure(args.seconds + 1)
                recorder.wait()
                load.close()
                p50 = 1000 * float(np.median(latencies))
                print(f"{args.mode}: {len(latencies) / elapsed:.1f} req/s, p50 {p50:.2f} ms")
                for thread, (total, counts) in shares(raw).items():
                    print(f"\n{thread}: {total} samples")
                    for frame, count in counts.most_common(args.top):
                        print(f"  {100 * count / total:5.1f} %  {frame}")

            if args.mode == "body":
                run(bench.mcpd_request(x))
            else:
                with bench.shm_request(sock, x) as request:
                    run(request)


if __name__ == "__main__":
    main()
