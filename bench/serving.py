"""Serving benchmark: mcpd over its Unix socket versus onnxruntime in-process (best batch) and versus
a conventional peer (FastAPI + uvicorn over TCP, JSON tensors), for a ResNet-50-shaped model and a
~1 ms model, both built here with onnx.helper (random weights); then the control loop's timing in
the real daemon, idle and with the server at full load.

    .venv/bin/python bench/serving.py [--slices 6] [--seconds 0.75]
    .venv/bin/python bench/serving.py --quick              # the ~1 ms model, concurrency 1 and 8
    .venv/bin/python bench/serving.py --baseline-tree DIR  # DIR's server beside this one
    .venv/bin/python bench/serving.py --max-batch 32       # and this one's with max_batch 32

With `--baseline-tree`, the inference server of another checkout (for instance
`git worktree add /tmp/serving-before main` before a change) is measured in the same run, each of
its slices paired with an in-process slice like this tree's ("before", "before_shm"); with
`--max-batch N`, a second server of this tree that may batch up to N requests ("max_batch_N",
"max_batch_N_shm"). The servers take their slices in turn, one each, so that the host's speed
drifting over minutes falls on all of them alike. For every
mcpd server, `loop_cpu_us_per_request` is the CPU time its event-loop thread spent per request:
the HTTP layer's cost, which a machine busy with other work stretches in wall time but hardly
changes, unlike the throughput ratios.

"mcpd" sends the input in the body (binary tensor data), "mcpd_shm" through a registered system
shared memory region. The load generator is a closed loop of C connections (asyncio, pre-encoded requests, a minimal
response reader), so that the client's own cost does not hide the server's, as Triton's
perf_analyzer does; `mcpd.client` (http.client) at concurrency 1 is reported beside it. The machine
is shared and noisy: every served slice is paired with an in-process slice taken just before it,
and ratios are the medians of the per-pair ratios. Models are served with the default config
(max_queue_delay_ms 2.0), the batch size fixed at the best in-process batch.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mcpd.client import Client
from mcpd.demo.build import classifier, resnet50

ROOT = Path(__file__).resolve().parent.parent

CONCURRENCY = (1, 8, 32)


@dataclass(frozen=True)
class Model:
    name: str
    path: Path
    shape: tuple[int, ...]
    batches: tuple[int, ...]
    seconds_factor: float


@dataclass(frozen=True)
class Load:
    throughput: float
    p50_ms: float
    p99_ms: float


# -- in-process ------------------------------------------------------------------------------------


def timed(run: Callable[[], object], seconds: float) -> list[float]:
    run()
    times = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return times


def in_process(model: Model, seconds: float, batches: tuple[int, ...]) -> dict[int, Load]:
    session = ort.InferenceSession(str(model.path), providers=["CPUExecutionProvider"])
    result = {}
    for batch in batches:
        x = np.random.default_rng(0).random((batch, *model.shape), np.float32)
        times = timed(lambda x=x: session.run(None, {"image": x}), seconds)
        result[batch] = Load(batch * len(times) / sum(times), *percentiles(times))
    return result


def percentiles(times: list[float]) -> tuple[float, float]:
    p50, p99 = np.percentile(np.array(times) * 1000, [50, 99])
    return float(p50), float(p99)


# -- load generator ------------------------------------------------------------------------------


class LoadGenerator:
    """C kept-alive connections, each sending its next request as soon as the last is answered
    (a closed loop); measured in slices so that slices of other work can be interleaved."""

    def __init__(self, connect: Callable[[], Any], request: bytes, concurrency: int) -> None:
        self.request = request
        self.connect = connect
        self.loop = asyncio.new_event_loop()

        async def open_all() -> list[Any]:
            return list(await asyncio.gather(*(connect() for _ in range(concurrency))))

        self.streams = self.loop.run_until_complete(open_all())

    async def _connection(self, index: int, end: float, out: list[float]) -> None:
        reader, writer = self.streams[index]
        while time.perf_counter() < end:
            start = time.perf_counter()
            writer.write(self.request)
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, ConnectionResetError) as exc:
                if isinstance(exc, asyncio.IncompleteReadError) and exc.partial:
                    raise
                # Closed while idle (the server's keep-alive timeout, 10 s for mcpd, which a
                # slow slice on a busy machine can reach): reconnect, as a client would.
                writer.close()
                reader, writer = self.streams[index] = await self.connect()
                continue
            length = int(head.lower().split(b"\r\ncontent-length:")[1].split(b"\r\n")[0])
            await reader.readexactly(length)
            if head[9:12] != b"200":
                raise RuntimeError(f"status {head[9:12]!r}")
            out.append(time.perf_counter() - start)

    def measure(self, seconds: float) -> tuple[list[float], float]:
        """Latencies of the requests sent in the next `seconds`, and the time until the last of
        them was answered: throughput is their count over that time, and nothing is left running
        in the server when the slice ends (at concurrency 32 the requests still in flight would
        otherwise be answered during the next in-process slice and counted in this one)."""
        latencies: list[float] = []
        start = time.perf_counter()
        end = start + seconds

        async def run_all() -> None:
            await asyncio.gather(
                *(self._connection(i, end, latencies) for i in range(len(self.streams)))
            )

        self.loop.run_until_complete(run_all())
        return latencies, time.perf_counter() - start

    def close(self) -> None:
        for _, writer in self.streams:
            writer.close()
        self.loop.close()


def http_request(path: str, body: bytes, headers: dict[str, str]) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: localhost", f"Content-Length: {len(body)}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def mcpd_request(x: np.ndarray) -> bytes:
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "image",
                    "datatype": "FP32",
                    "shape": list(x.shape),
                    "parameters": {"binary_data_size": x.nbytes},
                }
            ],
            "parameters": {"binary_data_output": True},
        }
    ).encode()
    return http_request(
        "/v2/models/m/infer",
        header + x.tobytes(),
        {
            "Inference-Header-Content-Length": str(len(header)),
            "Content-Type": "application/octet-stream",
        },
    )


@contextmanager
def shm_request(sock: str, x: np.ndarray) -> Iterator[bytes]:
    """An infer request whose input lies in a registered system shared memory region (Triton's
    extension, the way a local client passes a large tensor without sending it through the socket);
    the small output still comes back in the body."""
    key = f"mcpd-bench-{os.getpid()}-{Path(sock).stem}"
    Path(f"/dev/shm/{key}").write_bytes(x.tobytes())
    try:
        with Client(sock) as client:
            client.request(
                "POST",
                "/v2/systemsharedmemory/region/input/register",
                json.dumps({"key": key, "offset": 0, "byte_size": x.nbytes}).encode(),
                {"Content-Type": "application/json"},
            ).checked()
        header = json.dumps(
            {
                "inputs": [
                    {
                        "name": "image",
                        "datatype": "FP32",
                        "shape": list(x.shape),
                        "parameters": {
                            "shared_memory_region": "input",
                            "shared_memory_byte_size": x.nbytes,
                        },
                    }
                ],
                "parameters": {"binary_data_output": True},
            }
        ).encode()
        yield http_request("/v2/models/m/infer", header, {"Content-Type": "application/json"})
    finally:
        os.unlink(f"/dev/shm/{key}")


def peer_request(x: np.ndarray) -> bytes:
    return http_request(
        "/infer", json.dumps({"inputs": x.tolist()}).encode(), {"Content-Type": "application/json"}
    )


# -- servers -------------------------------------------------------------------------------------


def wait_for(check: Callable[[], bool], what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not start")
        time.sleep(0.1)


@contextmanager
def process(
    command: list[str], env: dict[str, str] | None = None, cwd: Path = ROOT
) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(
        command, cwd=cwd, env={**os.environ, **(env or {})}, stderr=subprocess.DEVNULL
    )
    try:
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _ready(sock: str) -> bool:
    try:
        with Client(sock, timeout=2) as client:
            return client.model_ready("m")
    except OSError:
        return False


@dataclass(frozen=True)
class Server:
    sock: str
    pid: int


def loop_cpu_ns(pid: int) -> int:
    """CPU time of the process's main thread, which runs its event loop (the first field of
    /proc/PID/schedstat, in ns: proc(5), sched-stats in the kernel's documentation). Measured
    per request, it is the HTTP layer's cost, which a busy machine slows but does not change."""
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0])


@contextmanager
def mcpd_server(
    model: Model,
    max_batch: int,
    folder: Path,
    tree: Path = ROOT,
    suffix: str = "",
    uvloop: bool = False,
) -> Iterator[Server]:
    """The inference server of the checkout at `tree` (this one by default)."""
    sock = str(folder / f"{model.name}{suffix}.sock")
    command = [sys.executable, "bench/serving_server.py", str(model.path), str(max_batch), sock]
    command += ["uvloop"] if uvloop else []
    with process(command, cwd=tree) as proc:
        wait_for(lambda: _ready(sock), "mcpd")
        yield Server(sock, proc.pid)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def peer_server(model: Model) -> Iterator[int]:
    port = _port()
    command = [
        sys.executable,
        "-m",
        "uvicorn",
        "--app-dir",
        "bench",
        "serving_peer:app",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--log-level",
        "warning",
        "--no-access-log",
        "--timeout-keep-alive",
        "600",
    ]

    def up() -> bool:
        try:
            socket.create_connection(("127.0.0.1", port), 1).close()
            return True
        except OSError:
            return False

    with process(command, {"PEER_MODEL": str(model.path)}):
        wait_for(up, "the peer")
        yield port


def client_c1(sock: str, x: np.ndarray, seconds: float) -> Load:
    with Client(sock) as client:
        times = timed(lambda: client.infer("m", {"image": x}), seconds)
    return Load(len(times) / sum(times), *percentiles(times))


# -- the control loop while serving --------------------------------------------------------------


def loop_timing(model: Model, folder: Path, seconds: float, loaded: bool) -> dict[str, object]:
    """The real daemon on a simulated board: its control loop's own timing (the figures
    bench/control_loop.py reports), idle or with 32 clients saturating the server."""
    run = folder / ("loaded" if loaded else "idle")
    run.mkdir()
    sock = run / "mcpd.sock"
    (run / "mcpd.toml").write_text(
        f'[daemon]\nsocket = "{sock}"\nstate_dir = "{run / "state"}"\n'
        f'[[models]]\nname = "m"\npath = "{model.path}"\nmax_batch = {max(model.batches)}\n'
    )
    # The simulated board goes where mcpd puts it by default: on tmpfs, like sysfs.
    command = [
        sys.executable,
        "-m",
        "mcpd",
        "run",
        "--config",
        str(run / "mcpd.toml"),
        "--simulate",
        "jetson-orin-nano",
    ]
    with process(command):
        wait_for(lambda: _ready(str(sock)), "the daemon")
        x = np.random.default_rng(0).random((1, *model.shape), np.float32)
        if loaded:
            generator = LoadGenerator(
                lambda: asyncio.open_unix_connection(str(sock)), mcpd_request(x), 32
            )
            answered, elapsed = generator.measure(seconds)
            generator.close()
        else:
            time.sleep(seconds)
        with Client(str(sock)) as client:
            doc = client.status()
    result: dict[str, object] = {"loop": doc["loop"], "cpu_percent": doc["daemon"]["cpu_percent"]}
    if loaded:
        result["requests_per_s"] = round(len(answered) / elapsed, 1)
    return result


# -- the run -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Options:
    slices: int
    seconds: float
    concurrency: tuple[int, ...] = CONCURRENCY
    peer: bool = True
    baseline: Path | None = None
    """Another checkout whose server is measured beside this one's."""
    uvloop: bool = False
    """This checkout's server on uvloop."""
    max_batch: int | None = None
    """A second server of this checkout, with this max_batch instead of the best batch."""


def bench_model(model: Model, folder: Path, options: Options) -> dict[str, object]:
    """Each served measurement is a series of slices, each paired with an in-process slice taken
    right before it; ratios are per pair (medians), so background load drifting on a shared
    machine affects both sides of each ratio alike. The servers' slices are interleaved (one
    slice of each in turn), so that a drift between minutes does not fall on one server's
    slices and not on another's."""
    slices, seconds = options.slices, options.seconds
    seconds *= model.seconds_factor
    x = np.random.default_rng(1).random((1, *model.shape), np.float32)
    sweep = in_process(model, seconds, model.batches)
    best = max(sweep, key=lambda b: sweep[b].throughput)
    session = ort.InferenceSession(str(model.path), providers=["CPUExecutionProvider"])
    batch = np.repeat(x, best, axis=0)
    result: dict[str, object] = {
        "in_process_sweep": {b: round(load.throughput, 1) for b, load in sweep.items()},
        "best_batch": best,
    }
    # Served with the batch size that is best in-process: the comparison is like for like.
    with ExitStack() as servers:
        this = servers.enter_context(mcpd_server(model, best, folder, uvloop=options.uvloop))
        # name: how to connect, the request, the server process whose event loop is measured
        targets: dict[str, tuple[Callable[[], Any], bytes, int | None]] = {}
        served_here = [("", this)]
        if options.baseline is not None:
            before = servers.enter_context(
                mcpd_server(model, best, folder, options.baseline, "-before")
            )
            served_here.insert(0, ("before", before))
        if options.max_batch is not None:
            label = f"max_batch_{options.max_batch}"
            wide = servers.enter_context(mcpd_server(model, options.max_batch, folder, ROOT, label))
            served_here.append((label, wide))
        for label, server in served_here:

            def connect(sock: str = server.sock) -> Any:
                return asyncio.open_unix_connection(sock)

            shm = servers.enter_context(shm_request(server.sock, x))
            targets[label or "mcpd"] = (connect, mcpd_request(x), server.pid)
            targets[f"{label or 'mcpd'}_shm"] = (connect, shm, server.pid)
        if options.peer:
            port = servers.enter_context(peer_server(model))
            targets["peer"] = (
                lambda: asyncio.open_connection("127.0.0.1", port),
                peer_request(x),
                None,
            )
        for c in options.concurrency:
            generators = {
                name: LoadGenerator(connect, request, c)
                for name, (connect, request, _) in targets.items()
            }
            for generator in generators.values():
                generator.measure(min(1.0, seconds))  # warm up
            runs = {name: Slices() for name in targets}
            for _ in range(slices):
                for name, (_, _, pid) in targets.items():
                    runs[name].add(generators[name], pid, c == 1, session, x, batch, seconds)
            for generator in generators.values():
                generator.close()
            cell: dict[str, object] = {name: runs[name].summary() for name in targets}
            cell["in_process_best"] = round(
                statistics.median(r for run in runs.values() for r in run.reference), 1
            )
            result[f"c{c}"] = cell
            print(f"{model.name}: concurrency {c} done", file=sys.stderr)
        result["mcpd_client_c1"] = client_c1(this.sock, x, seconds * slices / 2)
    return result


@dataclass
class Slices:
    """One target's paired slices at one concurrency."""

    ratios: list[float] = field(default_factory=list)
    ratios_b1: list[float] = field(default_factory=list)
    overheads: list[float] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    reference: list[float] = field(default_factory=list)
    served_s: float = 0.0
    loop_ns: int = 0
    measured_loop: bool = False

    def add(
        self,
        generator: LoadGenerator,
        pid: int | None,
        single: bool,
        session: ort.InferenceSession,
        x: np.ndarray,
        batch: np.ndarray,
        seconds: float,
    ) -> None:
        """An in-process slice at the best batch (and at batch 1 for a single connection), then
        the served slice it is paired with."""
        ref = timed(lambda: session.run(None, {"image": batch}), seconds)
        ref_b1 = timed(lambda: session.run(None, {"image": x}), seconds) if single else []
        cpu_before = 0 if pid is None else loop_cpu_ns(pid)
        served, elapsed = generator.measure(seconds)
        if pid is not None:
            self.loop_ns += loop_cpu_ns(pid) - cpu_before
            self.measured_loop = True
        self.served_s += elapsed
        in_process_rate = len(batch) * len(ref) / sum(ref)
        self.ratios.append(len(served) / elapsed / in_process_rate)
        if ref_b1:
            self.ratios_b1.append(len(served) / elapsed / (len(ref_b1) / sum(ref_b1)))
            self.overheads.append((statistics.median(served) - statistics.median(ref_b1)) * 1e6)
        self.latencies += served
        self.reference.append(in_process_rate)

    def summary(self) -> dict[str, float]:
        p50, p99 = percentiles(self.latencies)
        out = {
            "throughput": round(len(self.latencies) / self.served_s, 1),
            "p50_ms": round(p50, 3),
            "p99_ms": round(p99, 3),
            "over_in_process": round(statistics.median(self.ratios), 3),
        }
        if self.measured_loop:
            out["loop_cpu_us_per_request"] = round(self.loop_ns / 1e3 / len(self.latencies), 1)
        if self.ratios_b1:
            # One request at a time never forms a batch: this is the like-for-like ratio
            # when the best in-process batch is larger than 1.
            out["over_in_process_batch1"] = round(statistics.median(self.ratios_b1), 3)
        if self.overheads:
            out["overhead_p50_us"] = round(statistics.median(self.overheads), 1)
        return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slices", type=int, default=6, help="paired slices per measurement")
    parser.add_argument("--seconds", type=float, default=0.75, help="per slice (small model)")
    parser.add_argument("--loop-seconds", type=float, default=20.0)
    parser.add_argument(
        "--quick",
        action="store_true",
        help="only the ~1 ms model at concurrency 1 and 8, no peer, no control loop",
    )
    parser.add_argument("--baseline-tree", type=Path, help="a checkout to measure beside this one")
    parser.add_argument("--uvloop", action="store_true", help="this checkout's server on uvloop")
    parser.add_argument(
        "--max-batch", type=int, help="also this checkout's server with this max_batch"
    )
    args = parser.parse_args()
    options = Options(
        args.slices,
        args.seconds,
        (1, 8) if args.quick else CONCURRENCY,
        peer=not args.quick,
        baseline=None if args.baseline_tree is None else args.baseline_tree.resolve(),
        uvloop=args.uvloop,
        max_batch=args.max_batch,
    )
    with tempfile.TemporaryDirectory(prefix="mcpd-bench-") as tmp:
        folder = Path(tmp)
        onnx.save(resnet50(), folder / "resnet50.onnx")
        onnx.save(classifier(size=160, width=32), folder / "small.onnx")
        models = [
            Model("resnet50", folder / "resnet50.onnx", (3, 224, 224), (1, 2, 4, 8), 2.0),
            Model("small", folder / "small.onnx", (3, 160, 160), (1, 2, 4, 8, 16, 32), 1.0),
        ]
        report: dict[str, object] = {
            "date": time.strftime("%Y-%m-%d"),
            "cpus": os.cpu_count(),
            "onnxruntime": ort.__version__,
            "load_average_at_start": os.getloadavg(),
        }
        for model in models[1:] if args.quick else models:
            report[model.name] = bench_model(model, folder, options)
        small = models[1]
        report["load_average_at_end"] = os.getloadavg()
        if args.quick:
            print(json.dumps(report, indent=2, default=lambda o: o.__dict__))
            return
        report["control_loop"] = {
            "idle": loop_timing(small, folder, args.loop_seconds, loaded=False),
            "serving_at_full_load": loop_timing(small, folder, args.loop_seconds, loaded=True),
        }
    print(json.dumps(report, indent=2, default=lambda o: o.__dict__))


if __name__ == "__main__":
    main()
