"""`mcpd bench MODEL [MODEL ...]`: the throughput–latency sweep over model files (e.g. the original
and what `mcpd optimize` wrote: one per precision) × batch size × intra-op threads (× frequency caps
with `--caps`), with its Pareto frontier as a table, `--json`, or a `--plot FILE.png` (matplotlib,
optional). Board power and energy per inference are reported where the board has a meter (see
onboard.py)."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mcpd.optimize.interface import OptimizeError, TensorSpec, interface, load
from mcpd.optimize.measure import session
from mcpd.optimize.onboard import BoardWatch, Window, caps_held, domains_to_cap
from mcpd.optimize.pareto import Point, frontier
from sensors import SensorSet


@dataclass(frozen=True)
class Measurement:
    model: str
    batch: int
    threads: int
    throughput: float  # items per second
    p50_ms: float
    p99_ms: float
    runs: int
    cap_fraction: float | None = None
    """Every domain's cap as a fraction of its maximum; None: the caps were left as they were."""
    watts: float | None = None
    """Mean board power over the measurement; None without a meter."""
    power_estimated: bool = False
    joules_per_item: float | None = None
    peak_c: float | None = None

    @property
    def point(self) -> Point:
        caps = "" if self.cap_fraction is None else f" caps {self.cap_fraction:g}"
        return Point(
            f"{self.model} batch {self.batch} threads {self.threads}{caps}",
            self.p50_ms,
            self.throughput,
        )


def _fractions(text: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",")]
    except ValueError:
        raise OptimizeError(f"--caps {text!r}: expected comma-separated fractions") from None
    if not values or not all(0 < v <= 1 for v in values):
        raise OptimizeError(f"--caps {text!r}: every fraction must be in (0, 1]")
    return values


def _ints(text: str, flag: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise OptimizeError(f"{flag} {text!r}: expected comma-separated integers") from None
    if not values or min(values) < 1:
        raise OptimizeError(f"{flag} {text!r}: every value must be at least 1")
    return values


def batch_inputs(specs: tuple[TensorSpec, ...], batch: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Random inputs of `batch` rows; every dimension but the first must be fixed."""
    rng = np.random.default_rng(seed)
    inputs = {}
    for spec in specs:
        dims = spec.shape or ()
        if spec.dtype is None or not dims or not all(isinstance(d, int) for d in dims[1:]):
            raise OptimizeError(f"input {spec.describe()}: only the batch dimension may be dynamic")
        shape = (batch, *(int(d) for d in dims[1:] if isinstance(d, int)))
        if spec.dtype.kind == "f":
            inputs[spec.name] = rng.standard_normal(shape).astype(spec.dtype)
        else:
            inputs[spec.name] = np.zeros(shape, spec.dtype)
    return inputs


def measure(
    path: Path,
    batch: int,
    threads: int,
    seconds: float,
    watch: BoardWatch | None = None,
    cap_fraction: float | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> Measurement:
    specs = interface(load(path)).inputs
    runner = session(path, threads)
    feed = batch_inputs(specs, batch)
    for _ in range(2):
        runner.run(None, feed)
    times: list[float] = []
    with watch.window() if watch else _no_window() as readings:
        deadline = clock() + seconds
        while len(times) < 5 or clock() < deadline:
            if watch and cap_fraction is not None and watch.too_hot.is_set():
                raise OptimizeError(
                    f"stopped: the board reached {watch.limit_c:g} °C (--max-temp) with caps "
                    "held; caps put back"
                )
            start = clock()
            runner.run(None, feed)
            times.append(clock() - start)
    board = readings()
    total = sum(times)
    throughput = batch * len(times) / total
    return Measurement(
        path.stem,
        batch,
        threads,
        throughput,
        statistics.median(times) * 1000,
        float(np.percentile(times, 99)) * 1000,
        len(times),
        cap_fraction,
        None if board.watts is None else round(board.watts, 3),
        board.estimated,
        None if board.watts is None else round(board.watts / throughput, 6),
        board.peak_c,
    )


@contextmanager
def _no_window() -> Iterator[Callable[[], Window]]:
    yield lambda: Window(None, False, None)


def _fixed_batch(path: Path) -> int | None:
    first = interface(load(path)).inputs[0].shape
    return first[0] if first and isinstance(first[0], int) else None


def sweep(
    paths: list[Path],
    batches: list[int],
    threads: list[int],
    seconds: float,
    progress: Callable[[str], None],
    watch: BoardWatch | None = None,
    caps: list[float] | None = None,
    root: Path = Path("/"),
) -> list[Measurement]:
    results: list[Measurement] = []

    def models(fraction: float | None) -> None:
        for path in paths:
            fixed = _fixed_batch(path)
            for batch in [fixed] if fixed else batches:
                for count in threads:
                    m = measure(path, batch, count, seconds, watch, fraction)
                    results.append(m)
                    power = "" if m.watts is None else f", {m.watts:.2f} W"
                    progress(
                        f"{m.point.label}: {m.throughput:.1f} items/s, p50 {m.p50_ms:.2f} ms{power}"
                    )

    if not caps:
        models(None)
        return results
    found = domains_to_cap(root)
    for fraction in caps:
        with caps_held(found, fraction) as held:
            progress(
                f"caps {fraction:g}: " + ", ".join(f"{n} {mhz:g} MHz" for n, mhz in held.items())
            )
            models(fraction)
    return results


def _plot(results: list[Measurement], optimal: list[Point], target: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise OptimizeError("--plot needs matplotlib: pip install matplotlib") from None
    figure, axes = plt.subplots(figsize=(7, 4.5))
    for model in dict.fromkeys(m.model for m in results):
        mine = [m for m in results if m.model == model]
        axes.scatter([m.p50_ms for m in mine], [m.throughput for m in mine], label=model)
    axes.plot(
        [p.latency_ms for p in optimal],
        [p.throughput for p in optimal],
        "k--",
        label="Pareto frontier",
    )
    axes.set_xlabel("latency p50 per batch (ms)")
    axes.set_ylabel("throughput (items/s)")
    axes.legend()
    figure.tight_layout()
    figure.savefig(target, dpi=120)
    plt.close(figure)


def run(args: argparse.Namespace) -> int:
    try:
        paths = [Path(p) for p in args.models]
        for path in paths:
            load(path)
        batches = _ints(args.batch, "--batch")
        threads = _ints(args.threads, "--threads")
        if not args.seconds > 0:
            raise OptimizeError(f"--seconds {args.seconds}: must be positive")
        caps = _fractions(args.caps) if args.caps else None
        for path in paths:  # every input must be fillable before the sweep starts
            batch_inputs(interface(load(path)).inputs, 1)
        root = Path(args.sysfs_root)
        watch = BoardWatch(SensorSet.discover(root), args.max_temp)
        results = sweep(
            paths,
            batches,
            threads,
            args.seconds,
            lambda line: print(line, file=sys.stderr, flush=True),
            watch,
            caps,
            root,
        )
        optimal = frontier([m.point for m in results])
        if args.plot:
            _plot(results, optimal, Path(args.plot))
    except OptimizeError as exc:
        print(f"mcpd bench: {exc}", file=sys.stderr)
        return 2
    on_frontier = {p.label for p in optimal}
    if args.json:
        doc: dict[str, Any] = {
            "points": [{**asdict(m), "pareto": m.point.label in on_frontier} for m in results],
            "frontier": [asdict(p) for p in optimal],
        }
        print(json.dumps(doc, indent=2))
        return 0
    print(
        f"{'model':<28} {'batch':>5} {'threads':>7} {'caps':>5} {'items/s':>9} {'p50 ms':>8} "
        f"{'p99 ms':>8} {'W':>7} {'mJ/item':>8}  pareto"
    )
    for m in results:
        mark = "*" if m.point.label in on_frontier else ""
        held = "-" if m.cap_fraction is None else f"{m.cap_fraction:g}"
        watts = "-" if m.watts is None else f"{m.watts:.2f}" + ("~" if m.power_estimated else "")
        energy = "-" if m.joules_per_item is None else f"{m.joules_per_item * 1000:.2f}"
        print(
            f"{m.model:<28} {m.batch:>5} {m.threads:>7} {held:>5} {m.throughput:>9.1f} "
            f"{m.p50_ms:>8.2f} {m.p99_ms:>8.2f} {watts:>7} {energy:>8}  {mark}"
        )
    return 0
