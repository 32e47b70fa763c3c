"""`mcpd bench MODEL [MODEL ...]`: the throughput–latency sweep over model files (e.g. the original
and what `mcpd optimize` wrote: one per precision) × runtime × batch size × threads, and for
OpenVINO × precision × streams (runners.py), × frequency caps with `--caps`, with its Pareto
frontier as a table, `--json`, or a `--plot FILE.png` (sweep_report.py). Board power and energy
per inference are reported where the board has a meter (see onboard.py)."""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mcpd.optimize import runners, sweep_report
from mcpd.optimize.background import RUNTIMES
from mcpd.optimize.interface import OptimizeError, TensorSpec
from mcpd.optimize.onboard import BoardWatch, Window, caps_held, domains_to_cap
from mcpd.optimize.pareto import Point, frontier
from mcpd.optimize.runners import Call, NotApplicable, Setting
from sensors import SensorSet


@dataclass(frozen=True)
class Measurement:
    model: str
    batch: int
    threads: int
    throughput: float  # items per second, all streams together
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
    runtime: str = "onnxruntime"
    precision: str | None = None
    """OpenVINO's inference precision in force (read back); None for onnxruntime."""
    streams: int = 1
    """Inferences in flight at once (OpenVINO's streams, one thread each in this process)."""

    @property
    def point(self) -> Point:
        runtime = self.runtime + (f" {self.precision}" if self.precision else "")
        streams = f" streams {self.streams}" if self.streams > 1 else ""
        caps = "" if self.cap_fraction is None else f" caps {self.cap_fraction:g}"
        return Point(
            f"{self.model} {runtime} batch {self.batch} threads {self.threads}{streams}{caps}",
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


def _names(text: str, flag: str, known: Sequence[str]) -> list[str]:
    values = text.split(",")
    unknown = [v for v in values if v not in known]
    if unknown:
        raise OptimizeError(f"{flag} {text!r}: {unknown[0]!r} is not one of {', '.join(known)}")
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
    setting: Setting,
    seconds: float,
    watch: BoardWatch | None = None,
    cap_fraction: float | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> Measurement:
    runner = runners.open_runner(path, setting, batch_inputs(runners.inputs_of(path), batch))
    for call in runner.calls:
        for _ in range(2):
            call()

    def too_hot() -> bool:
        return watch is not None and cap_fraction is not None and watch.too_hot.is_set()

    with watch.window() if watch else _no_window() as readings:
        times, wall = _timed(runner.calls, seconds, too_hot, clock)
    if watch is not None and too_hot():
        raise OptimizeError(
            f"stopped: the board reached {watch.limit_c:g} °C (--max-temp) with caps held; caps "
            "put back"
        )
    board = readings()
    throughput = batch * len(times) / wall
    return Measurement(
        path.name,  # model.onnx and model.xml are two rows
        batch,
        setting.threads,
        throughput,
        statistics.median(times) * 1000,
        float(np.percentile(times, 99)) * 1000,
        len(times),
        cap_fraction,
        None if board.watts is None else round(board.watts, 3),
        board.estimated,
        None if board.watts is None else round(board.watts / throughput, 6),
        board.peak_c,
        setting.runtime,
        runner.precision,
        setting.streams,
    )


def _timed(
    calls: list[Call], seconds: float, stop: Callable[[], bool], clock: Callable[[], float]
) -> tuple[list[float], float]:
    """Each call repeated on a thread of its own (one stream each), together for `seconds` and at
    least 5 times each: every call's time and the wall time they took together."""
    started = clock()
    deadline = started + seconds

    def repeat(call: Call) -> list[float]:
        times: list[float] = []
        while (len(times) < 5 or clock() < deadline) and not stop():
            start = clock()
            call()
            times.append(clock() - start)
        return times

    if len(calls) == 1:
        times = repeat(calls[0])
    else:
        with ThreadPoolExecutor(len(calls)) as pool:
            times = [t for each in pool.map(repeat, calls) for t in each]
    return times, clock() - started


@contextmanager
def _no_window() -> Iterator[Callable[[], Window]]:
    yield lambda: Window(None, False, None)


def _fixed_batch(path: Path) -> int | None:
    first = runners.inputs_of(path)[0].shape
    return first[0] if first and isinstance(first[0], int) else None


def sweep(
    paths: list[Path],
    batches: list[int],
    settings: list[Setting],
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
            readers = runners.runtimes_of(path, RUNTIMES)
            for batch in [fixed] if fixed else batches:
                for setting in [s for s in settings if s.runtime in readers]:
                    m = measure(path, batch, setting, seconds, watch, fraction)
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


def _plan(args: argparse.Namespace, paths: list[Path]) -> tuple[list[Setting], list[NotApplicable]]:
    """The settings the command's lists ask for: every runtime installed that reads one of the
    files unless --runtime names them (then each must be there)."""
    capabilities = runners.openvino_capabilities()
    if args.runtime:
        wanted = _names(args.runtime, "--runtime", RUNTIMES)
        if "openvino" in wanted and capabilities is None:
            raise OptimizeError("--runtime openvino needs OpenVINO: pip install 'mcpd[openvino]'")
    else:
        wanted = [r for r in RUNTIMES if r != "openvino" or capabilities is not None]
    for path in paths:
        if not runners.runtimes_of(path, wanted):
            raise OptimizeError(f"{path}: no runtime of {', '.join(wanted)} reads an .xml file")
    return runners.plan(
        wanted,
        _ints(args.threads, "--threads"),
        _names(args.precision, "--precision", runners.PRECISIONS),
        _ints(args.streams, "--streams"),
        capabilities or [],
    )


def run(args: argparse.Namespace) -> int:
    try:
        paths = [Path(p) for p in args.models]
        for path in paths:  # every input must be fillable before the sweep starts
            batch_inputs(runners.inputs_of(path), 1)
        batches = _ints(args.batch, "--batch")
        settings, skipped = _plan(args, paths)
        if not args.seconds > 0:
            raise OptimizeError(f"--seconds {args.seconds}: must be positive")
        caps = _fractions(args.caps) if args.caps else None
        root = Path(args.sysfs_root)
        watch = BoardWatch(SensorSet.discover(root), args.max_temp)
        results = sweep(
            paths,
            batches,
            settings,
            args.seconds,
            lambda line: print(line, file=sys.stderr, flush=True),
            watch,
            caps,
            root,
        )
        optimal = frontier([m.point for m in results])
        if args.plot:
            sweep_report.plot(results, optimal, Path(args.plot))
    except OptimizeError as exc:
        print(f"mcpd bench: {exc}", file=sys.stderr)
        return 2
    flags = runners.cpu_flags(_cpuinfo())
    print(sweep_report.render(results, optimal, skipped, flags, args.json))
    return 0


def _cpuinfo() -> str:
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:  # not Linux, or /proc not mounted: the flags are then unknown
        return ""
