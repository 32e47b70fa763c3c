"""Serving benchmark: mcpd over its Unix socket versus the same model in-process (best batch) and versus
a conventional peer (FastAPI + uvicorn over TCP, JSON tensors), for a ResNet-50-shaped model and a
~1 ms model, both built here with onnx.helper (random weights); then the control loop's timing in
the real daemon, idle and with the server at full load.

    .venv/bin/python bench/serving.py [--slices 6] [--seconds 0.75]
    .venv/bin/python bench/serving.py --quick              # the ~1 ms model, concurrency 1 and 8
    .venv/bin/python bench/serving.py --baseline-tree DIR  # DIR's server beside this one
    .venv/bin/python bench/serving.py --max-batch 32       # and this one's with max_batch 32
    .venv/bin/python bench/serving.py --runtime openvino [--precision f32|bf16] [--concurrency 8]
    .venv/bin/python bench/serving.py --runtime openvino --streams 2 [--model resnet50]

The models run on onnxruntime's CPU provider, or with `--runtime openvino` on mcpd's OpenVINO
backend, which reads the same ONNX files (`backend = "openvino"`, not converted to IR: the file is
the one onnxruntime runs, OpenVINO's read_model converts it in memory as ov.convert_model would,
and the precision is the config's `[models.openvino] precision`, from `--precision`, rather than
one stored in an IR). The in-process reference is then the same compiled model: compiled by the
backend's open_compiled with the same OpenVinoOptions (the precision hint; threads 0, OpenVINO's
default; one stream, the LATENCY hint) and run through one inference request as the backend's
`run` does. With `--streams N`, a second server of this tree compiles the model to N streams
("streams_N", "streams_N_shm"; `[models.openvino] streams`, so it runs N batches at once), its
slices paired with that compiled model in-process at its own best batch, N inference requests
each looping on a thread of its own as the server's worker threads do (its sweep and best batch
under "streams_N"; "in_process_best_streams_N" beside "in_process_best" in each cell, so that
either server can be read against either configuration's best). The report gives OpenVINO's version, the precision asked for, the CPU's flags and
OpenVINO's capabilities ("openvino"), and per model what it compiled to in-process
("openvino_in_process": precision in force, threads, streams) and served ("openvino_served":
/metrics' backend labels, and how far one answer through mcpd.client over the socket and one
through tritonclient.http over a TCP listener are from in-process). The peer is left out (it runs
onnxruntime); the control loop's daemon serves through OpenVINO too; a `--baseline-tree` must have
a bench/serving_server.py that takes `--model`.

With `--baseline-tree`, the inference server of another checkout (for instance
`git worktree add /tmp/serving-before main` before a change) is measured in the same run, each of
its slices paired with an in-process slice like this tree's ("before", "before_shm"); with
`--max-batch N`, a second server of this tree that may batch up to N requests ("max_batch_N",
"max_batch_N_shm"). The servers take their slices in turn, one each, so that the host's speed
drifting over minutes falls on all of them alike. For every
mcpd server, `loop_cpu_us_per_request` is the CPU time its event-loop thread spent per request:
the HTTP layer's cost, which a machine busy with other work stretches in wall time but hardly
changes, unlike the throughput ratios; `batches` counts the batches it ran during the served
slices, by size (its statistics extension). `--model` measures one model alone, without the
control loop.

"mcpd" sends the input in the body (binary tensor data), "mcpd_shm" through a registered system
shared memory region. The load generator is a closed loop of C connections (asyncio, pre-encoded requests, a minimal
response reader), so that the client's own cost does not hide the server's, as Triton's
perf_analyzer does; `mcpd.client` (http.client) at concurrency 1 is reported beside it. This is
what issue 27's "served through the daemon (tritonclient, Unix socket)" is measured with:
tritonclient.http dials TCP only, and its own cost per request (geventhttpclient, JSON headers
built per call) would be counted as the server's; the load generator sends what it sends (binary
tensor data) over the socket, and tritonclient's one answer is checked above. The machine
is shared and noisy: every served slice is paired with an in-process slice taken just before it,
and ratios are the medians of the per-pair ratios. Models are served with the default config
(max_queue_delay_ms 2.0), the batch size fixed at the best in-process batch.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import optimize_openvino  # bench/optimize_openvino.py: the CPU's flags, OpenVINO's capabilities

from mcpd.client import Client
from mcpd.config import OpenVinoOptions
from mcpd.demo.build import classifier, resnet50
from mcpd.serving.backends.openvino import device_report, open_compiled, precision_in_force
from tests.support.daemon import mcpd_run

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


Infer = Callable[[np.ndarray], list[np.ndarray]]
"""One in-process inference of the model on a batch: its outputs."""


@dataclass(frozen=True)
class Runtime:
    """What serves the models and runs them in-process: onnxruntime's CPU provider, or, with
    `openvino`'s settings, mcpd's OpenVINO backend reading the same ONNX file."""

    openvino: OpenVinoOptions | None = None

    def with_streams(self, streams: int) -> Runtime:
        assert self.openvino is not None, "streams are OpenVINO's"
        return Runtime(dataclasses.replace(self.openvino, streams=streams))

    def table(self) -> dict[str, Any]:
        """The model's [[models]] keys that pick it (none for onnxruntime: the servers' default)."""
        if self.openvino is None:
            return {}
        # Only the keys set away from their defaults: a --baseline-tree older than a key reads it.
        default = dataclasses.asdict(OpenVinoOptions())
        keys = {k: v for k, v in dataclasses.asdict(self.openvino).items() if v != default[k]}
        return {"backend": "openvino", "openvino": keys}

    def open(self, path: Path) -> InProcess:
        """The model in-process, and for OpenVINO what it was compiled to, read back: compiled by
        the backend's own open_compiled with the served settings, so that in-process runs the
        very model that serves, through an inference request per stream as the backend's `run`
        on each of the worker's threads."""
        if self.openvino is None:
            session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
            return InProcess([lambda x: session.run(None, {"image": x})], {})
        compiled = open_compiled(path, self.openvino)
        parallel = int(compiled.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS"))
        requests = [compiled.create_infer_request() for _ in range(parallel)]
        compiled_as = {
            "precision": precision_in_force(compiled),
            "threads": int(compiled.get_property("INFERENCE_NUM_THREADS")),
            "streams": int(compiled.get_property("NUM_STREAMS")),
        }
        runs: list[Infer] = [
            lambda x, request=request: list(request.infer([x]).to_tuple()) for request in requests
        ]
        return InProcess(runs, compiled_as)


@dataclass(frozen=True)
class InProcess:
    runs: list[Infer]
    """One per inference that may be in flight at once (OpenVINO's streams; one otherwise)."""
    compiled_as: dict[str, object]

    def infer(self, x: np.ndarray) -> list[np.ndarray]:
        return self.runs[0](x)

    def rate(self, x: np.ndarray, seconds: float) -> tuple[float, list[float]]:
        """Images/s with every run looping on `x` at once, each on a thread of its own, as the
        served worker's threads run batches; and the time of each inference."""
        if len(self.runs) == 1:
            times = timed(lambda: self.infer(x), seconds)
            return len(x) * len(times) / sum(times), times
        each: list[list[float]] = [[] for _ in self.runs]
        threads = [
            threading.Thread(target=lambda r=run, out=out: out.extend(timed(lambda: r(x), seconds)))
            for run, out in zip(self.runs, each, strict=True)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return sum(len(x) * len(t) / sum(t) for t in each), [t for out in each for t in out]


def in_process(
    reference: InProcess, model: Model, seconds: float, batches: tuple[int, ...]
) -> dict[int, Load]:
    result = {}
    for batch in batches:
        x = np.random.default_rng(0).random((batch, *model.shape), np.float32)
        rate, times = reference.rate(x, seconds)
        result[batch] = Load(rate, *percentiles(times))
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
    table: dict[str, Any] | None = None,
    http: str = "",
) -> Iterator[Server]:
    """The inference server of the checkout at `tree` (this one by default), running the model
    as `table` says (bench/serving_server.py's --model; onnxruntime's CPU provider without one),
    on a TCP port too with `http`."""
    sock = str(folder / f"{model.name}{suffix}.sock")
    command = [sys.executable, "bench/serving_server.py", str(model.path), str(max_batch), sock]
    command += ["uvloop"] if uvloop else []
    command += ["--model", json.dumps(table)] if table else []
    command += ["--http", http] if http else []
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


def clients(sock: str, http: str, x: np.ndarray, expected: np.ndarray) -> dict[str, object]:
    """What serves the model (the labels of /metrics' mcpd_model_backend_info: the precision in
    force is read back from the served compiled model), and one inference of `x` through
    mcpd.client over the socket and through tritonclient.http over the TCP listener (it dials TCP
    only), each with how far its first output is from the in-process one."""
    import tritonclient.http as triton

    with Client(sock) as client:
        info = next(
            line for line in client.metrics().splitlines() if line.startswith("mcpd_model_backend")
        )
        by_mcpd = next(iter(client.infer("m", {"image": x}).values()))
    labels = dict(re.findall(r'(\w+)="([^"]*)"', info))
    tensor = triton.InferInput("image", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    tc = triton.InferenceServerClient(http)
    try:
        reply = tc.infer("m", [tensor])
        by_triton = reply.as_numpy(reply.get_response()["outputs"][0]["name"])
    finally:
        tc.close()
    return {
        "served_as": {k: labels[k] for k in ("backend", "device", "precision")},
        "max_abs_diff": {
            "mcpd.client": float(np.abs(by_mcpd - expected).max()),
            "tritonclient": float(np.abs(by_triton - expected).max()),
        },
    }


# -- the control loop while serving --------------------------------------------------------------


def loop_timing(
    model: Model, folder: Path, seconds: float, loaded: bool, runtime: Runtime
) -> dict[str, object]:
    """The real daemon on a simulated board: its control loop's own timing (the figures
    bench/control_loop.py reports), idle or with 32 clients saturating the server."""
    run = folder / ("loaded" if loaded else "idle")
    run.mkdir()
    sock = run / "mcpd.sock"
    table = runtime.table()  # as TOML: its values, then its sub-tables
    lines = [f"{k} = {json.dumps(v)}" for k, v in table.items() if not isinstance(v, dict)]
    for key, values in ((k, v) for k, v in table.items() if isinstance(v, dict)):
        lines += [f"[models.{key}]"] + [f"{k} = {json.dumps(v)}" for k, v in values.items()]
    (run / "mcpd.toml").write_text(
        f'[daemon]\nsocket = "{sock}"\nstate_dir = "{run / "state"}"\n'
        f'[[models]]\nname = "m"\npath = "{model.path}"\nmax_batch = {max(model.batches)}\n'
        + "".join(line + "\n" for line in lines)
    )
    # The simulated board goes where mcpd puts it by default: on tmpfs, like sysfs.
    with process(mcpd_run(run / "mcpd.toml", "--simulate", "jetson-orin-nano")):
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
    streams: int | None = None
    """A server of this checkout compiling the model to this many OpenVINO streams, each batch of
    its slices paired with the same compiled model in-process at its own best batch."""
    runtime: Runtime = Runtime()


@dataclass(frozen=True)
class Reference:
    """A compiled configuration in-process at its best batch: what a server's slices are paired
    with."""

    model: InProcess
    batch: np.ndarray
    label: str


@dataclass(frozen=True)
class Target:
    connect: Callable[[], Any]
    request: bytes
    server: Server | None
    """The mcpd server measured (its event loop's CPU, its batches); None for the peer."""
    reference: Reference


def reference(
    runtime: Runtime, model: Model, x: np.ndarray, seconds: float, label: str
) -> tuple[Reference, dict[str, object]]:
    """The model compiled as `runtime` says, in-process at its best batch, and its sweep."""
    compiled = runtime.open(model.path)
    sweep = in_process(compiled, model, seconds, model.batches)
    best = max(sweep, key=lambda b: sweep[b].throughput)
    report: dict[str, object] = {
        "in_process_sweep": {b: round(load.throughput, 1) for b, load in sweep.items()},
        "best_batch": best,
    }
    if compiled.compiled_as:
        report["openvino_in_process"] = compiled.compiled_as
    return Reference(compiled, np.repeat(x, best, axis=0), label), report


def bench_model(model: Model, folder: Path, options: Options) -> dict[str, object]:
    """Each served measurement is a series of slices, each paired with an in-process slice taken
    right before it; ratios are per pair (medians), so background load drifting on a shared
    machine affects both sides of each ratio alike. The servers' slices are interleaved (one
    slice of each in turn), so that a drift between minutes does not fall on one server's
    slices and not on another's."""
    slices, seconds = options.slices, options.seconds
    seconds *= model.seconds_factor
    x = np.random.default_rng(1).random((1, *model.shape), np.float32)
    main, result = reference(options.runtime, model, x, seconds, "in_process_best")
    best = len(main.batch)
    table = options.runtime.table()
    # tritonclient's check, over a TCP listener (OpenVINO only: onnxruntime's report is as before).
    http = f"127.0.0.1:{_port()}" if options.runtime.openvino else ""
    # Served with the batch size that is best in-process: the comparison is like for like.
    with ExitStack() as servers:
        this = servers.enter_context(
            mcpd_server(model, best, folder, uvloop=options.uvloop, table=table, http=http)
        )
        if http:
            result["openvino_served"] = clients(this.sock, http, x, main.model.infer(x)[0])
        targets: dict[str, Target] = {}
        # label, server, the in-process configuration its slices are paired with
        served_here = [("", this, main)]
        if options.baseline is not None:
            before = servers.enter_context(
                mcpd_server(model, best, folder, options.baseline, "-before", table=table)
            )
            served_here.insert(0, ("before", before, main))
        if options.max_batch is not None:
            label = f"max_batch_{options.max_batch}"
            wide = servers.enter_context(
                mcpd_server(model, options.max_batch, folder, ROOT, label, table=table)
            )
            served_here.append((label, wide, main))
        if options.streams is not None:
            label = f"streams_{options.streams}"
            runtime = options.runtime.with_streams(options.streams)
            streamed, result[label] = reference(
                runtime, model, x, seconds, f"in_process_best_{label}"
            )
            server = servers.enter_context(
                mcpd_server(model, len(streamed.batch), folder, ROOT, label, table=runtime.table())
            )
            served_here.append((label, server, streamed))
        for label, server, paired in served_here:

            def connect(sock: str = server.sock) -> Any:
                return asyncio.open_unix_connection(sock)

            shm = servers.enter_context(shm_request(server.sock, x))
            targets[label or "mcpd"] = Target(connect, mcpd_request(x), server, paired)
            targets[f"{label or 'mcpd'}_shm"] = Target(connect, shm, server, paired)
        if options.peer:
            port = servers.enter_context(peer_server(model))
            targets["peer"] = Target(
                lambda: asyncio.open_connection("127.0.0.1", port), peer_request(x), None, main
            )
        for c in options.concurrency:
            generators = {
                name: LoadGenerator(target.connect, target.request, c)
                for name, target in targets.items()
            }
            for generator in generators.values():
                generator.measure(min(1.0, seconds))  # warm up
            runs = {name: Slices() for name in targets}
            for _ in range(slices):
                for name, target in targets.items():
                    runs[name].add(generators[name], target, c == 1, x, seconds)
            for generator in generators.values():
                generator.close()
            cell: dict[str, object] = {name: runs[name].summary() for name in targets}
            for label in {target.reference.label for target in targets.values()}:
                paired_rates = (
                    r for name, run in runs.items() if targets[name].reference.label == label
                    for r in run.reference
                )  # fmt: skip
                cell[label] = round(statistics.median(paired_rates), 1)
            result[f"c{c}"] = cell
            print(f"{model.name}: concurrency {c} done", file=sys.stderr)
        result["mcpd_client_c1"] = client_c1(this.sock, x, seconds * slices / 2)
    return result


def batches_run(sock: str) -> Counter[int]:
    """How many batches of each size the server's model has run (its statistics extension)."""
    with Client(sock) as client:
        stats = client.request("GET", "/v2/models/m/stats").json()["model_stats"][0]
    return Counter({b["batch_size"]: b["compute_infer"]["count"] for b in stats["batch_stats"]})


@dataclass
class Slices:
    """One target's paired slices at one concurrency."""

    ratios: list[float] = field(default_factory=list)
    ratios_b1: list[float] = field(default_factory=list)
    overheads: list[float] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    reference: list[float] = field(default_factory=list)
    batches: Counter[int] = field(default_factory=Counter)
    """The batches the server ran during the served slices, by size."""
    served_s: float = 0.0
    loop_ns: int = 0
    measured_loop: bool = False

    def add(
        self,
        generator: LoadGenerator,
        target: Target,
        single: bool,
        x: np.ndarray,
        seconds: float,
    ) -> None:
        """An in-process slice at the best batch (and at batch 1 for a single connection), then
        the served slice it is paired with."""
        reference = target.reference
        in_process_rate, _ = reference.model.rate(reference.batch, seconds)
        ref_b1 = timed(lambda: reference.model.infer(x), seconds) if single else []
        server = target.server
        if server is not None:
            ran_before = batches_run(server.sock)
            cpu_before = loop_cpu_ns(server.pid)
        served, elapsed = generator.measure(seconds)
        if server is not None:
            self.loop_ns += loop_cpu_ns(server.pid) - cpu_before
            self.measured_loop = True
            self.batches += batches_run(server.sock) - ran_before
        self.served_s += elapsed
        self.ratios.append(len(served) / elapsed / in_process_rate)
        if ref_b1:
            self.ratios_b1.append(len(served) / elapsed / (len(ref_b1) / sum(ref_b1)))
            self.overheads.append((statistics.median(served) - statistics.median(ref_b1)) * 1e6)
        self.latencies += served
        self.reference.append(in_process_rate)

    def summary(self) -> dict[str, object]:
        p50, p99 = percentiles(self.latencies)
        out: dict[str, object] = {
            "throughput": round(len(self.latencies) / self.served_s, 1),
            "p50_ms": round(p50, 3),
            "p99_ms": round(p99, 3),
            "over_in_process": round(statistics.median(self.ratios), 3),
        }
        if self.measured_loop:
            out["loop_cpu_us_per_request"] = round(self.loop_ns / 1e3 / len(self.latencies), 1)
            out["batches"] = dict(sorted(self.batches.items()))
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
    parser.add_argument("--concurrency", type=int, nargs="+", help="instead of 1 8 32 (1 8 quick)")
    parser.add_argument(
        "--model", choices=("resnet50", "small"), help="only this model, no control loop"
    )
    parser.add_argument("--runtime", choices=("onnxruntime", "openvino"), default="onnxruntime")
    parser.add_argument(
        "--precision",
        choices=("auto", "f32", "bf16", "f16"),
        help="OpenVINO's inference precision hint (default auto: bf16 on CPUs with AMX)",
    )
    parser.add_argument(
        "--streams",
        type=int,
        help="also this checkout's server with this many OpenVINO streams (batches in flight)",
    )
    args = parser.parse_args()
    if (args.precision or args.streams) and args.runtime != "openvino":
        parser.error("--precision and --streams are OpenVINO's: use them with --runtime openvino")
    openvino = args.runtime == "openvino"
    runtime = Runtime(OpenVinoOptions(precision=args.precision or "auto") if openvino else None)
    options = Options(
        args.slices,
        args.seconds,
        tuple(args.concurrency or ((1, 8) if args.quick else CONCURRENCY)),
        # The peer runs onnxruntime: beside OpenVINO it would compare runtimes, not servers.
        peer=not args.quick and not openvino,
        baseline=None if args.baseline_tree is None else args.baseline_tree.resolve(),
        uvloop=args.uvloop,
        max_batch=args.max_batch,
        streams=args.streams,
        runtime=runtime,
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
        if openvino:
            report["openvino"] = {
                "version": (device_report() or {}).get("version"),
                "precision_hint": args.precision or "auto",
                **optimize_openvino.cpu_description(),
            }
        only = args.model or ("small" if args.quick else None)
        for model in (m for m in models if only in (None, m.name)):
            report[model.name] = bench_model(model, folder, options)
        small = models[1]
        report["load_average_at_end"] = os.getloadavg()
        if only:
            print(json.dumps(report, indent=2, default=lambda o: o.__dict__))
            return
        report["control_loop"] = {
            "idle": loop_timing(small, folder, args.loop_seconds, False, runtime),
            "serving_at_full_load": loop_timing(small, folder, args.loop_seconds, True, runtime),
        }
    print(json.dumps(report, indent=2, default=lambda o: o.__dict__))


if __name__ == "__main__":
    main()
