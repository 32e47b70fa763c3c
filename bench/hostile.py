"""Hostile clients against the real daemon: does governing hold while they run?

    .venv/bin/python bench/hostile.py [--seconds 60] [--rounds 1] [--only KIND ...]

Runs `mcpd run --simulate jetson-orin-nano` (sustained full load, thermal time 4x) serving the
bundled demo model and `spread` (one value in, 4 million out), with `[metrics] listen` on, the
descriptor limit at 1 024 as on a stock system, and, for the command flood, MQTT commands on
through a local mosquitto; twice, one after the other: quiet (one polite client inferring, one
scraping /metrics once a second), then hostile (the same, plus for the whole run: 1 100
connections that send half a request header and wait, reconnecting when closed; 4 clients sending
60 MB JSON bodies and 8 sending 60 MB binary bodies; 4 clients sending valid JSON requests just
under max_json_bytes; a client registering shared memory, shrinking it and inferring from it, and
registering keys with NULs, paths and symlinks; 8 clients on the socket and 8 on the metrics port
that pipeline scrapes and never read, reconnecting when dropped; 4 clients asking for the demo
model to be loaded again, over and over; 4 clients asking for `spread`'s answer as JSON; and a
flood of MQTT commands, refused or doing nothing). Reports per run: the control loop's sample
lateness (status document, whole run), the simulated die temperature (the plant's true state, last
half of the run), the governor's and the serving process's peak RSS, and what each kind of client
got back; with --rounds N, quiet and hostile runs alternate N times and the report gives the
medians over rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.hostile_clients import (
    LOAD,
    SPREAD_WIDTH,
    big_bodies,
    command_flood,
    exchange,
    json_near_limit,
    never_reading,
    repeat,
    shm_tricks,
    slow_header,
    spread_json,
)
from mcpd.client import Client, ServerError
from mcpd.demo import MODEL
from mcpd.serving.service import METRICS_CONNECTIONS
from mcpd.sim import MEMORY_DIR, STATE_FILE
from tests.support.daemon import mcpd_run, simulated
from tests.support.mqtt_broker import Mosquitto, free_port
from tests.support.serving_models import spread

DAEMON_NOFILE = 1024
DEVICE = "bench"
"""The daemon's MQTT device id: its commands are mcpd/bench/cmd/<name>."""
NEVER_READING = METRICS_CONNECTIONS
"""Clients that never read, on the socket and as many on the metrics port: enough to take every
connection of the port."""


@dataclass(frozen=True)
class Daemon:
    process: subprocess.Popen[bytes]
    sock: Path
    board: Path
    metrics_port: int
    broker_port: int | None


@contextmanager
def daemon(folder: Path, broker_port: int | None) -> Iterator[Daemon]:
    sock, board, metrics_port = folder / "mcpd.sock", folder / "board", free_port()
    mqtt = (
        f'[mqtt]\nenabled = true\nhost = "127.0.0.1"\nport = {broker_port}\n'
        f'device_id = "{DEVICE}"\ncommands_enabled = true\n'
        if broker_port is not None
        else ""
    )
    config = folder / "mcpd.toml"
    config.write_text(
        f'[daemon]\nsocket = "{sock}"\nstate_dir = "{folder / "state"}"\n'
        f'[metrics]\nlisten = "127.0.0.1:{metrics_port}"\n{mqtt}'
        f'[[models]]\nname = "demo"\npath = "{MODEL}"\nmax_batch = 8\n'
        f'[[models]]\nname = "spread"\npath = "{spread(folder / "spread.onnx", SPREAD_WIDTH)}"\n'
        "max_batch = 1\n"
    )
    command = mcpd_run(
        config, *simulated("jetson-orin-nano", board, "--sim-load", "sustained", "--sim-speed", "4")
    )
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
                    if client.model_ready("demo") and client.model_ready("spread"):
                        break
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError((folder / "daemon.log").read_text())
            time.sleep(0.2)
        yield Daemon(process, sock, board, metrics_port, broker_port)
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


def scraper(port: int, stop: threading.Event, outcomes: Counter[str]) -> None:
    """GET /metrics on the `[metrics] listen` port once a second with Prometheus' default 10 s
    timeout, as the board's Prometheus would."""
    while not stop.wait(1.0):
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        try:
            connection.request("GET", "/metrics")
            outcomes[str(connection.getresponse().status)] += 1
        except OSError as exc:
            outcomes[type(exc).__name__] += 1
        finally:
            connection.close()


KINDS = (
    "slow header",
    "60 MB JSON",
    "60 MB binary",
    "256 KiB JSON",
    "shm tricks",
    "never reading",
    "load flood",
    "large JSON outputs",
    "command flood",
)


def hostile(
    daemon: Daemon, stop: threading.Event, outcomes: dict[str, Counter[str]], kinds: tuple[str, ...]
) -> None:
    sock, scrapes = daemon.sock, ("127.0.0.1", daemon.metrics_port)
    near, (big_json, big_binary), spread = json_near_limit(), big_bodies(), spread_json()
    commands = None
    if "command flood" in kinds:
        assert daemon.broker_port is not None
        commands = threading.Thread(
            target=command_flood,
            args=(daemon.broker_port, f"mcpd/{DEVICE}", stop, outcomes["command flood"]),
        )
        commands.start()

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
            "never reading": [
                never_reading(address, done, outcomes["never reading"])
                for address in (sock, scrapes)
                for _ in range(NEVER_READING)
            ],
            "load flood": [
                repeat(done, exchange, sock, LOAD, outcomes["load flood"]) for _ in range(4)
            ],
            "large JSON outputs": [
                repeat(done, exchange, sock, spread, outcomes["large JSON outputs"])
                for _ in range(4)
            ],
        }
        for kind in every:
            if kind not in kinds:
                for unused in every[kind]:
                    unused.close()
        running = [
            asyncio.ensure_future(client)
            for kind, clients in every.items()
            if kind in kinds
            for client in clients
        ]
        await asyncio.get_running_loop().run_in_executor(None, stop.wait)
        done.set()
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)

    asyncio.run(main())
    if commands is not None:
        commands.join(30)


# -- one run -------------------------------------------------------------------------------------


def run(seconds: float, kinds: tuple[str, ...], broker_port: int | None) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="mcpd-hostile-", dir=MEMORY_DIR) as name:
        folder = Path(name)
        with daemon(folder, broker_port) as served:
            stop = threading.Event()
            polite_outcomes: Counter[str] = Counter()
            scrapes: Counter[str] = Counter()
            latencies: list[float] = []
            hostile_outcomes: dict[str, Counter[str]] = {kind: Counter() for kind in KINDS}
            threads = [
                threading.Thread(
                    target=polite, args=(served.sock, stop, polite_outcomes, latencies)
                ),
                threading.Thread(target=scraper, args=(served.metrics_port, stop, scrapes)),
            ]
            if kinds:
                threads.append(
                    threading.Thread(target=hostile, args=(served, stop, hostile_outcomes, kinds))
                )
            for thread in threads:
                thread.start()
            temperatures: list[float] = []
            governor_rss: list[float] = []
            serving_rss: list[float] = []
            governor = psutil.Process(served.process.pid)
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                time.sleep(1.0)
                temperatures.append(json.loads((served.board / STATE_FILE).read_text())["die_c"])
                governor_rss.append(governor.memory_info().rss / 2**20)
                serving_rss.append(sum(rss_mb(child) for child in governor.children()))
            stop.set()
            for thread in threads:
                thread.join(120)
            document = status(served.sock)
            alive = served.process.poll() is None
            log = (folder / "daemon.log").read_text()
        settled = temperatures[len(temperatures) // 2 :]
        return {
            "hostile clients": list(kinds),
            "loop": document["loop"],
            "die_c": {
                "mean_last_half": round(statistics.mean(settled), 1),
                "max": max(temperatures),
            },
            "governor_rss_mb_max": round(max(governor_rss), 1),
            "serving_rss_mb_max": round(max(serving_rss), 1),
            "polite": dict(polite_outcomes),
            "polite_p50_ms": round(statistics.median(latencies) * 1000, 2) if latencies else None,
            "scrapes": dict(scrapes),
            "hostile": {kind: dict(hostile_outcomes[kind]) for kind in kinds},
            "daemon_alive": alive,
            "log_lines": len(log.splitlines()),
            "emfile_lines": log.count("Too many open files"),
        }


def rss_mb(process: psutil.Process) -> float:
    """0 for a serving process that has just exited (the governor starts another)."""
    try:
        return float(process.memory_info().rss / 2**20)
    except psutil.Error:
        return 0.0


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
    """Median over rounds of each lateness figure, of the die's peak and of the two processes'
    RSS."""
    lateness = [run["loop"]["sample_lateness"] for run in runs]
    summary = {key: statistics.median(x[key] for x in lateness) for key in lateness[0]}
    summary["die_c_max"] = statistics.median(run["die_c"]["max"] for run in runs)
    for rss in ("governor_rss_mb_max", "serving_rss_mb_max"):
        summary[rss] = statistics.median(run[rss] for run in runs)
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
    with ExitStack() as stack:
        broker_port = None
        if "command flood" in kinds:  # for the quiet runs too, so that only the attack differs
            folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="mcpd-broker-")))
            broker_port = stack.enter_context(Mosquitto(folder)).port
        runs = [
            run(args.seconds, attack, broker_port)
            for _ in range(args.rounds)
            for attack in ((), kinds)
        ]
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
