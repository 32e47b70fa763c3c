"""`mcpctl fleet` at fleet size: following every board's telemetry, or reading the table from a store.

    nice .venv/bin/python bench/fleet_view.py [--boards 1000,10000,50000] [--repeat 5]

Following: what one `mcpctl fleet` spends on each telemetry message it receives (FleetView.update:
the JSON parse and the bookkeeping), on real messages (mcpd's encoder on the tests' status
document, one board id each), timed with the thread's CPU clock over 20 000 messages; from it, the
cores a reader needs to follow N boards at 1 Hz, and the bytes it receives per second.

Store: a VictoriaMetrics (the Debian package, as the tests start it) filled through its import API
with N boards' series as `mcpctl ingest` writes them (tests/support/fleet_series.py), then one refresh of
`mcpctl fleet --from` timed as it runs: its queries (mcpd/ctl/fleet_store.py), the view and
its rows, for every board and for the 50 hottest (`--top 50`: the store picks them with topk);
the median of --repeat refreshes, wall clock (the store answers in another process), with the
process's own CPU time beside it. Both in one run, on one machine, so their ratio holds
however busy the machine is.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mcpd.ctl import fleet_store
from mcpd.ctl.fleet_view import FleetView
from mcpd.telemetry import encoder
from tests.support.engines import missing
from tests.support.fleet_series import board_series
from tests.support.mqtt_status import FakeBoard
from tests.support.stores import VictoriaMetrics

FOLLOWED = 20_000
TOP = 50
IMPORT_BATCH = 2_000


def following() -> tuple[float, int]:
    """CPU seconds per telemetry message in FleetView.update, and a message's size."""
    document = FakeBoard()()
    messages = [
        (
            f"mcpd/b{i:06d}/telemetry",
            encoder.telemetry(
                document,
                device=f"b{i:06d}",
                seq=i,
                requests_per_s=12.5,
                queued=0,
                dropped=0,
            ),
        )
        for i in range(FOLLOWED)
    ]
    view = FleetView("mcpd")
    began = time.thread_time()
    for topic, payload in messages:
        view.update(topic, payload, 0.0)
    return (time.thread_time() - began) / FOLLOWED, round(
        statistics.mean(len(p) for _, p in messages)
    )


def fill(vm: VictoriaMetrics, first: int, last: int) -> None:
    now = time.time() - 2  # the store answers for whole seconds past
    for start in range(first, last, IMPORT_BATCH):
        text = "".join(
            board_series(f"b{i:06d}", now, 40 + i % 50, (i, i + 250))
            for i in range(start, min(last, start + IMPORT_BATCH))
        )
        vm.import_prometheus(text)


def refresh(url: str, top: int) -> tuple[float, float, int]:
    """One `--from` refresh (`--top`: 0 for every board): wall and CPU seconds, rows made."""
    wall, cpu = time.perf_counter(), time.process_time()
    view = FleetView("mcpd", statuses=False)
    for device, (at, body) in fleet_store.read(url, top, timeout=120).items():
        view.measured(device, at, body)
    rows = view.rows(time.time())
    return time.perf_counter() - wall, time.process_time() - cpu, len(rows)


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.machine()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--boards", default="1000,10000,50000")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    sizes = sorted(int(n) for n in args.boards.split(","))
    reason = missing("victoria-metrics")
    if reason:
        print(f"cannot run: {reason}", file=sys.stderr)
        return 1
    per_message, size = following()
    print(
        f"{cpu_model()}, {os.cpu_count()} CPUs, "
        f"load average {os.getloadavg()[0]:.2f}; a telemetry message: {size} bytes, "
        f"{per_message * 1e6:.1f} us of CPU in FleetView.update"
    )
    print(
        "\n| boards | following at 1 Hz: bytes/s | cores | --from refresh (median) | its CPU "
        f"| rows | --from --top {TOP} refresh | its CPU |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    with (
        tempfile.TemporaryDirectory(prefix="mcpd-bench-fleet-") as folder,
        VictoriaMetrics(Path(folder) / "vm", cache=True) as vm,
    ):
        filled = 0
        for n in sizes:
            fill(vm, filled, n)
            filled = n
            fleet_store.read(vm.url, timeout=120)  # the first pass warms the store's caches
            every = [refresh(vm.url, 0) for _ in range(args.repeat)]
            hottest = [refresh(vm.url, TOP) for _ in range(args.repeat)]
            print(
                f"| {n} | {n * size / 1e6:.1f} MB | {n * per_message:.2f} | "
                f"{statistics.median(r[0] for r in every):.3f} s | "
                f"{statistics.median(r[1] for r in every):.3f} s | {every[0][2]} | "
                f"{statistics.median(r[0] for r in hottest):.3f} s | "
                f"{statistics.median(r[1] for r in hottest):.3f} s |",
                flush=True,
            )
    print(f"\nload average at the end {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
