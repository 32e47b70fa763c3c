"""Hostile clients against the real daemon: does governing hold while they run?

    .venv/bin/python bench/hostile.py [--seconds 60] [--rounds 1] [--only KIND ...]

Runs `mcpd run --simulate jetson-orin-nano` (sustained full load, thermal time 4x) serving the
bundled demo model, with the descriptor limit at 1 024 as on a stock system, twice, one after the
other: quiet (one polite client), then hostile (the same polite client, plus for the whole run:
1 100 connections that send half a request header and wait, reconnecting when closed; 4 clients
sending 60 MB JSON bodies and 8 sending 60 MB binary bodies; 4 clients sending valid JSON requests
just under max_json_bytes; and a client registering shared memory, shrinking it and inferring from
it, and registering keys with NULs, paths and symlinks). Reports per run: the control loop's sample
lateness (status document, whole run), the simulated die temperature (the plant's true state, last
half of the run), the daemon's peak RSS, and what each kind of client got back; with --rounds N,
quiet and hostile runs alternate N times and the report gives the medians over rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mcpd.client import Client, ServerError
from mcpd.demo import MODEL
from mcpd.sim import MEMORY_DIR, STATE_FILE

HEAD = b"POST /v2/models/demo/infer HTTP/1.1\r\nHost: mcpd\r\n"
BIG = 60 * 2**20
DAEMON_NOFILE = 1024


@contextmanager
def daemon(folder: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path, Path]]:
    sock, board = folder / "mcpd.sock", folder / "board"
    config = folder / "mcpd.toml"
    config.write_text(
        f'[daemon]\nsocket = "{sock}"\nstate_dir = "{folder / "state"}"\n'
        f'[[models]]\nname = "demo"\npath = "{MODEL}"\nmax_batch = 8\n'
    )
    command = [
        sys.executable,
        "-m",
        "mcpd",
        "run",
        "--config",
        str(config),
        "--simulate",
        "jetson-orin-nano",
        "--sim-root",
        str(board),
        "--sim-load",
        "sustained",
        "--sim-speed",
        "4",
    ]
    limit = (DAEMON_NOFILE, DAEMON_NOFILE)
    with open(folder / "daemon.log", "wb") as log:
        process = subprocess.Popen(
            command,
            stderr=log,
            preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, limit),
        )
    try:
        deadline = time.monotonic() + 120
        while True:
            if sock.exists():
                with Client(str(sock), timeout=10) as client:
                    if client.model_ready("demo"):
                        break
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError((folder / "daemon.log").read_text())
            time.sleep(0.2)
        yield process, sock, board
    finally:
        process.terminate()
        process.wait(60)


def status(sock: Path) -> dict[str, object]:
    """The status document, retried while the server turns connections away."""
    deadline = time.monotonic() + 60
    while True:
        try:
            with Client(str(sock), timeout=10) as client:
                return dict(client.status())
        except (ServerError, OSError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


# -- clients ---------------------------------------------------------------------------------------


def polite(
    sock: Path, stop: threading.Event, outcomes: Counter[str], latencies: list[float]
) -> None:
    """Demo inference at about 20 requests/s, as a well-behaved local program would."""
    image = np.random.default_rng(0).random((1, 3, 64, 64), np.float32)
    client = Client(str(sock), timeout=30)
    while not stop.wait(0.05):
        started = time.monotonic()
        try:
            client.infer("demo", {"image": image})
            outcomes["ok"] += 1
            latencies.append(time.monotonic() - started)
        except ServerError as exc:
            outcomes[str(exc.status)] += 1
        except OSError as exc:
            outcomes[type(exc).__name__] += 1
            client.close()
            client = Client(str(sock), timeout=30)
    client.close()


async def exchange(path: Path, data: bytes, outcomes: Counter[str]) -> None:
    """Send `data` (as far as the server takes it) and count the status it answers with; raw
    sockets, so that an answer sent before the server closed is read even after a failed send."""
    loop = asyncio.get_running_loop()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.setblocking(False)
        try:
            await loop.sock_connect(sock, str(path))
            sock.getpeername()  # asyncio reports a connect that failed with EAGAIN as done
        except OSError as exc:
            outcomes[f"not connected: {exc.strerror or type(exc).__name__}"] += 1
            return
        with contextlib.suppress(OSError):  # answered and closed early: read the answer below
            await loop.sock_sendall(sock, data)
        answer = b""
        with contextlib.suppress(OSError):
            while b"\r\n" not in answer and (chunk := await loop.sock_recv(sock, 4096)):
                answer += chunk
        outcomes[answer.split(b" ")[1].decode() if answer.count(b" ") >= 2 else "closed"] += 1


async def slow_header(sock: Path, stop: asyncio.Event, outcomes: Counter[str]) -> None:
    while not stop.is_set():
        await exchange(sock, HEAD[:30], outcomes)  # returns when the server answers or closes


async def repeat(stop: asyncio.Event, make: object, *args: object) -> None:
    while not stop.is_set():
        await make(*args)  # type: ignore[operator]


def json_near_limit() -> bytes:
    """A valid batch-2 request whose JSON is just under the default max_json_bytes (256 KiB)."""
    data = ",".join(["0.1234567"] * (2 * 3 * 64 * 64))
    body = (
        '{"inputs": [{"name": "image", "datatype": "FP32", "shape": [2, 3, 64, 64], "data": ['
        + data
        + "]}]}"
    ).encode()
    return HEAD + f"Content-Length: {len(body)}\r\n\r\n".encode() + body


def big_bodies() -> tuple[bytes, bytes]:
    json_body = HEAD + f"Content-Length: {BIG}\r\n\r\n".encode() + b"[" + b"0.5," * (BIG // 4 - 1)
    header = b'{"inputs": [{"name": "image", "datatype": "FP32", "shape": [1, 3, 64, 64], "parameters": {"binary_data_size": 49152}}]}'
    binary = (
        HEAD
        + f"Inference-Header-Content-Length: {len(header)}\r\nContent-Length: {BIG}\r\n\r\n".encode()
        + header
        + bytes(BIG - len(header))
    )
    return json_body, binary


async def shm_tricks(sock: Path, stop: asyncio.Event, outcomes: Counter[str]) -> None:
    key = f"mcpd-bench-hostile-{os.getpid()}"
    obj = Path("/dev/shm") / key
    link = Path("/dev/shm") / f"{key}-link"
    infer = json.dumps(
        {
            "inputs": [
                {
                    "name": "image",
                    "datatype": "FP32",
                    "shape": [1, 3, 64, 64],
                    "parameters": {"shared_memory_region": "h", "shared_memory_byte_size": 49152},
                }
            ]
        }
    ).encode()

    def post(target: str, body: bytes = b"") -> bytes:
        return (
            f"POST {target} HTTP/1.1\r\nHost: mcpd\r\nContent-Length: {len(body)}\r\n\r\n".encode()
            + body
        )

    region = "/v2/systemsharedmemory/region"
    link.unlink(missing_ok=True)
    link.symlink_to(obj)
    try:
        while not stop.is_set():
            obj.write_bytes(bytes(49152))
            await exchange(
                sock,
                post(f"{region}/h/register", json.dumps({"key": key, "byte_size": 49152}).encode()),
                outcomes,
            )
            os.truncate(obj, 100)  # shrink it under the daemon
            await exchange(sock, post("/v2/models/demo/infer", infer), outcomes)
            await exchange(sock, post(f"{region}/h/unregister"), outcomes)
            for bad in (f"{key}\u0000x", "../etc/passwd", link.name):
                await exchange(
                    sock,
                    post(f"{region}/b/register", json.dumps({"key": bad, "byte_size": 8}).encode()),
                    outcomes,
                )
    finally:
        obj.unlink(missing_ok=True)
        link.unlink(missing_ok=True)


KINDS = ("slow header", "60 MB JSON", "60 MB binary", "256 KiB JSON", "shm tricks")


def hostile(
    sock: Path, stop: threading.Event, outcomes: dict[str, Counter[str]], kinds: tuple[str, ...]
) -> None:
    near, (big_json, big_binary) = json_near_limit(), big_bodies()

    async def main() -> None:
        done = asyncio.Event()
        every = {
            "slow header": [slow_header(sock, done, outcomes["slow header"]) for _ in range(1100)],
            "60 MB JSON": [
                repeat(done, exchange, sock, big_json, outcomes["60 MB JSON"]) for _ in range(4)
            ],
            "60 MB binary": [
                repeat(done, exchange, sock, big_binary, outcomes["60 MB binary"]) for _ in range(8)
            ],
            "256 KiB JSON": [
                repeat(done, exchange, sock, near, outcomes["256 KiB JSON"]) for _ in range(4)
            ],
            "shm tricks": [shm_tricks(sock, done, outcomes["shm tricks"])],
        }
        for kind in KINDS:
            if kind not in kinds:
                for unused in every.pop(kind):
                    unused.close()
        running = [
            asyncio.ensure_future(client) for clients in every.values() for client in clients
        ]
        await asyncio.get_running_loop().run_in_executor(None, stop.wait)
        done.set()
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)

    asyncio.run(main())


# -- one run -------------------------------------------------------------------------------------


def run(seconds: float, kinds: tuple[str, ...]) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="mcpd-hostile-", dir=MEMORY_DIR) as name:
        folder = Path(name)
        with daemon(folder) as (process, sock, board):
            stop = threading.Event()
            polite_outcomes: Counter[str] = Counter()
            latencies: list[float] = []
            hostile_outcomes: dict[str, Counter[str]] = {kind: Counter() for kind in KINDS}
            threads = [
                threading.Thread(target=polite, args=(sock, stop, polite_outcomes, latencies))
            ]
            if kinds:
                threads.append(
                    threading.Thread(target=hostile, args=(sock, stop, hostile_outcomes, kinds))
                )
            for thread in threads:
                thread.start()
            temperatures: list[float] = []
            rss: list[float] = []
            info = psutil.Process(process.pid)
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                time.sleep(1.0)
                temperatures.append(json.loads((board / STATE_FILE).read_text())["die_c"])
                rss.append(info.memory_info().rss / 2**20)
            stop.set()
            for thread in threads:
                thread.join(120)
            document = status(sock)
            alive = process.poll() is None
            log = (folder / "daemon.log").read_text()
        settled = temperatures[len(temperatures) // 2 :]
        return {
            "hostile clients": list(kinds),
            "loop": document["loop"],
            "die_c": {
                "mean_last_half": round(statistics.mean(settled), 1),
                "max": max(temperatures),
            },
            "rss_mb_max": round(max(rss), 1),
            "polite": dict(polite_outcomes),
            "polite_p50_ms": round(statistics.median(latencies) * 1000, 2) if latencies else None,
            "hostile": {kind: dict(hostile_outcomes[kind]) for kind in kinds},
            "daemon_alive": alive,
            "log_lines": len(log.splitlines()),
            "emfile_lines": log.count("Too many open files"),
        }


def json_parse_ms_per_mib() -> float:
    """What parsing a request's JSON costs the interpreter: the median of 9 parses of the
    256 KiB JSON request the hostile clients send, per MiB."""
    body = json_near_limit().split(b"\r\n\r\n", 1)[1]
    times = []
    for _ in range(9):
        started = time.perf_counter()
        json.loads(body)
        times.append(time.perf_counter() - started)
    return round(statistics.median(times) * 1000 / (len(body) / 2**20), 1)


def medians(runs: list[dict[str, Any]]) -> dict[str, float]:
    """Median over rounds of each lateness figure, of the die's peak and of the daemon's RSS."""
    lateness = [run["loop"]["sample_lateness"] for run in runs]
    summary = {key: statistics.median(x[key] for x in lateness) for key in lateness[0]}
    summary["die_c_max"] = statistics.median(run["die_c"]["max"] for run in runs)
    summary["rss_mb_max"] = statistics.median(run["rss_mb_max"] for run in runs)
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="per run")
    parser.add_argument(
        "--rounds", type=int, default=1, help="quiet and hostile runs, alternating, this many each"
    )
    parser.add_argument(
        "--only", action="append", choices=KINDS, help="run only these hostile clients (repeatable)"
    )
    args = parser.parse_args()
    kinds = tuple(args.only or KINDS)
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # the attackers' own 1 100 sockets
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    runs = [run(args.seconds, attack) for _ in range(args.rounds) for attack in ((), kinds)]
    report = {
        "started": started,
        "load_average_at_end": os.getloadavg(),
        "json_parse_ms_per_mib": json_parse_ms_per_mib(),
        "medians": {"quiet": medians(runs[0::2]), "hostile": medians(runs[1::2])},
        "runs": runs,
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
