"""perf_analyzer, Triton's load generator, against the real daemon (`mcpd run` on a simulated board,
the bundled demo model): over the `[serving] http` listener and over a socat bridge to the Unix
socket, with the input in the request body and through system shared memory.

    .venv/bin/python bench/perf_analyzer.py [--rounds 3] [--concurrency-range 1:4:3]

perf_analyzer comes from tests/run (.ci/env.sh). The machine is shared and noisy: the four ways
are measured in turn, round after round, and each figure is the median over the rounds of
perf_analyzer's own result (the average of its three 2 s windows; its stability check is off).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.serving import process, wait_for
from mcpd.demo import MODEL
from tests.support.daemon import mcpd_run, simulated
from tests.support.mqtt_broker import free_port

ROOT = Path(__file__).resolve().parent.parent
PERF_ANALYZER = ROOT / ".venv/bin/perf_analyzer"
WAYS = (("listener", "none"), ("listener", "system"), ("socat", "none"), ("socat", "system"))
ROW = re.compile(r"Concurrency: (\d+), throughput: ([0-9.]+) infer/sec, latency (\d+) usec")
P50 = re.compile(r"Request concurrency: (\d+)\n(?:.*\n)*?\s+p50 latency: (\d+) usec")


def _answers(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/models/demo/ready", timeout=5):
            return True
    except OSError:  # refused, or 400 while the model loads (HTTPError is an OSError)
        return False


def run_perf_analyzer(port: int, memory: str, concurrency: str) -> dict[int, tuple[float, int]]:
    """Throughput (inferences/s) and p50 latency (µs) per concurrency."""
    command = [
        str(PERF_ANALYZER), "-m", "demo", "-u", f"127.0.0.1:{port}", "--shared-memory", memory,
        "--concurrency-range", concurrency, "--measurement-interval", "2000",
        # Three windows, whatever their spread: on a shared machine perf_analyzer's stability check
        # rarely passes; the rounds' median stands in for it.
        "--stability-percentage", "999", "--max-trials", "3",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"perf_analyzer failed: {done.stdout}{done.stderr}")
    p50 = {int(c): int(us) for c, us in P50.findall(done.stdout)}
    return {int(c): (float(rate), p50[int(c)]) for c, rate, _ in ROW.findall(done.stdout)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency-range", default="1:4:3", help="as perf_analyzer takes it")
    args = parser.parse_args()
    if not PERF_ANALYZER.exists() or shutil.which("socat") is None:
        sys.exit("perf_analyzer or socat is missing: run tests/run once (it installs both)")
    found: dict[tuple[str, str], dict[int, list[tuple[float, int]]]] = {way: {} for way in WAYS}
    with tempfile.TemporaryDirectory(prefix="mcpd-perf-") as folder:
        run = Path(folder)
        port, bridge_port = free_port(), free_port()
        (run / "mcpd.toml").write_text(
            f'[daemon]\nsocket = "{run / "mcpd.sock"}"\nstate_dir = "{run / "state"}"\n'
            f'[serving]\nhttp = "127.0.0.1:{port}"\n'
            f'[[models]]\nname = "demo"\npath = "{MODEL}"\n'
        )
        daemon = mcpd_run(run / "mcpd.toml", *simulated("x86-intel", run / "board"))
        bridge = ["socat", f"TCP-LISTEN:{bridge_port},bind=127.0.0.1,reuseaddr,fork",
                  f"UNIX-CONNECT:{run / 'mcpd.sock'}"]  # fmt: skip
        with process(daemon), process(bridge):
            wait_for(lambda: _answers(port) and _answers(bridge_port), "the daemon")
            for _ in range(args.rounds):
                for way in WAYS:
                    chosen = port if way[0] == "listener" else bridge_port
                    for level, result in run_perf_analyzer(
                        chosen, way[1], args.concurrency_range
                    ).items():
                        found[way].setdefault(level, []).append(result)
    table = {
        f"{path} {memory}": {
            level: {
                "infer_per_s": round(statistics.median(r[0] for r in results), 1),
                "p50_us": statistics.median(r[1] for r in results),
            }
            for level, results in sorted(levels_found.items())
        }
        for (path, memory), levels_found in found.items()
    }
    print(json.dumps({"date": time.strftime("%Y-%m-%d"), "rounds": args.rounds, **table}, indent=1))


if __name__ == "__main__":
    main()
