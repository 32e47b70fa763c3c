"""What a scrape of /metrics costs the serving process's event loop (no request moves meanwhile).

    .venv/bin/python bench/metrics.py [--models 1,4,16] [--repeat 200]

The exposition of a full status document (a Jetson-like board: 3 temperatures, 2 rails, 2
domains) and N models whose statistics recorders have seen requests, rendered by the collector as
a scrape renders it, in the text format 0.0.4 and in OpenMetrics; the median and p99 of --repeat
renders, and the body's size.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mcpd.serving.metrics import Exposition
from mcpd.serving.statistics import Recorder, Timing
from mcpd.snapshot import ModelStats
from tests.support.mqtt_status import FakeBoard

FORMATS = {
    "text 0.0.4": "",
    "OpenMetrics": "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5",
}


def models(count: int) -> dict[str, ModelStats]:
    stats = {}
    for index in range(count):
        recorder = Recorder()
        for k in range(200):  # latencies spread over the buckets
            recorder.executed(4, 20_000, 200_000 * (1 + k % 40), 10_000)
            recorder.succeeded(
                300_000 * (1 + k % 60), Timing(50_000 * (k % 30), 20_000, 200_000, 10_000)
            )
        statistics = recorder.snapshot()
        stats[f"model{index}"] = ModelStats(
            True, 200, 0, statistics=statistics, latency=statistics.latency
        )
    return stats


def measure(count: int, repeat: int) -> dict[str, object]:
    document = FakeBoard()()
    stats = models(count)
    exposition = Exposition(lambda: document, lambda: stats)
    result: dict[str, object] = {"models": count}
    for name, accept in FORMATS.items():
        times, size = [], 0
        for _ in range(repeat):
            started = time.perf_counter()
            body, _ = exposition.render(accept)
            times.append(time.perf_counter() - started)
            size = len(body)
        times.sort()
        result[name] = {
            "median_ms": round(statistics.median(times) * 1000, 3),
            "p99_ms": round(times[int(len(times) * 0.99) - 1] * 1000, 3),
            "bytes": size,
        }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", default="1,4,16", help="model counts, comma-separated")
    parser.add_argument("--repeat", type=int, default=200)
    args = parser.parse_args()
    report = {
        "date": time.strftime("%Y-%m-%d"),
        "runs": [measure(int(n), args.repeat) for n in args.models.split(",")],
    }
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
