"""mcpctl ingest benchmark: telemetry messages/s into VictoriaMetrics, and broker -> queryable time.

    nice .venv/bin/python bench/ingest.py [--backlog 40000] [--boards 2000] [--window 20]
        [--probes 20] [--members 1] [--phases pipeline,throughput,latency]

Everything runs here, on loopback: mosquitto (tests/support/mqtt_broker.py), VictoriaMetrics
(tests/support/stores.py, with `-dedup.minScrapeInterval=1ms` as docs/ingest.md §2 says), and
`mcpctl ingest` as processes of their own.

1. Throughput, one process and two in one shared group: the ingest writes one message of each
   of `--boards` boards (their series then exist in the store, as in a fleet in service) and
   stops; `--backlog` telemetry messages (the daemon's encoder's) wait in its sessions on the
   broker; then the ingest starts again and drains them;
   messages/s = messages written after its first accepted request / time from that request
   until its own counters say every message was written (process start and connection left
   out). So the figure is the ingest's (with the broker sending and the store taking), not a
   publisher's.
2. Latency: `--boards` boards at 1 Hz (one client publishing pre-encoded messages at their
   times, QoS 1) through `--members` ingest processes (one group) for `--warmup` + `--window` seconds; every 100 ms
   the store is asked how many samples of `mcpd_temperature_celsius` it has of `--probes`
   boards spread over the fleet (their messages go through the same queue and requests as
   everyone's; asking about every board made the store read 2 000 series ten times a second, a
   third of a core taken from what it measures); a probe's message is queryable at the first
   answer that counts it (counted in publish order), and its latency is that time minus its
   publish time. Only the window's messages are measured: a
   VictoriaMetrics 1.79 shows a new series about 10 s after its first sample (and a known one's
   samples after its 1 s flush), and a fleet in service has its series.

0. Pipeline: the ingest's own work per message (parse, map, encode) in this process, without
   broker, store or network: messages/s on one core (median of 3 rounds of `--boards`).

Prints one JSON object (and each phase's on stderr as it ends); the CPU of each process
(psutil) is in cores over the phase.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
import psutil
from paho.mqtt.enums import CallbackAPIVersion

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mcpd.ctl import paho_thread
from mcpd.telemetry import encoder
from tests.support.mqtt_broker import Mosquitto, free_port
from tests.support.mqtt_status import FakeBoard
from tests.support.stores import VictoriaMetrics

MCPCTL = str(Path(__file__).resolve().parent.parent / ".venv/bin/mcpctl")
GOAL_PER_S = 10_000
GOAL_P99_S = 2.0


def messages(
    boards: int, count: int, start: float, period_s: float
) -> list[tuple[str, bytes, float]]:
    """(topic, payload, ts): `count` messages, board after board, `period_s` apart per board."""
    document = FakeBoard()()
    out = []
    for i in range(count):
        device, seq = f"b{i % boards:05d}", i // boards + 1
        ts = start + seq * period_s + (i % boards) * period_s / boards
        body = encoder.telemetry(
            {**document, "ts": ts}, device=device, seq=seq, requests_per_s=1.0, queued=0, dropped=0
        )
        out.append((f"mcpd/{device}/telemetry", body, ts))
    return out


def publisher(port: int) -> paho.Client:
    client = paho.Client(CallbackAPIVersion.VERSION2, "bench-boards", protocol=paho.MQTTv5)
    client.max_queued_messages_set(0)
    client.max_inflight_messages_set(1000)
    client.connect("127.0.0.1", port)
    client.loop_start()
    return client


def ingest(
    port: int, store: VictoriaMetrics, client_id: str, group: str | None, metrics: int, log: Path
) -> subprocess.Popen[bytes]:
    command = [MCPCTL, "ingest", "--broker", f"127.0.0.1:{port}", "--remote-write", store.write_url,
               "--client-id", client_id, "--metrics-listen", f"127.0.0.1:{metrics}"]  # fmt: skip
    if group:
        command += ["--group", group]
    with open(log, "ab") as out:
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)


def written(port: int) -> float:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
            text = answer.read().decode()
    except OSError:
        return 0.0
    for line in text.splitlines():
        if line.startswith("mcpd_ingest_messages_written_total "):
            return float(line.split()[1])
    return 0.0


def cores(processes: list[psutil.Process], action: Any) -> tuple[Any, list[float]]:
    before = [p.cpu_times() for p in processes]
    began = time.monotonic()
    result = action()
    elapsed = time.monotonic() - began
    after = [p.cpu_times() for p in processes]
    used = [
        round((a.user + a.system - b.user - b.system) / elapsed, 3)
        for a, b in zip(after, before, strict=True)
    ]
    return result, used


def publish_all(port: int, batch: list[tuple[str, bytes, float]]) -> None:
    client = publisher(port)
    infos = [client.publish(topic, body, qos=1) for topic, body, _ in batch]
    for info in infos:
        info.wait_for_publish(120)
    paho_thread.close(client)


def wait_written(ports: list[int], count: int, limit_s: float) -> float:
    deadline = time.monotonic() + limit_s
    while (total := sum(written(p) for p in ports)) < count and time.monotonic() < deadline:
        time.sleep(0.05)
    return total


def throughput(folder: Path, members: int, backlog: int, boards: int) -> dict[str, Any]:
    group = "bench" if members > 1 else None
    ids = [f"ingest-{i}" for i in range(members)]
    ports = [free_port() for _ in ids]
    with Mosquitto(folder / "broker") as broker, VictoriaMetrics(folder / "vm") as vm:
        planned = messages(boards, boards + backlog, time.time() - 3600, 1.0)
        # A fleet in service: every board's series already in the store (a new series costs
        # VictoriaMetrics far more than a sample), and every member's session on the broker.
        processes = [
            ingest(broker.port, vm, i, group, p, folder / f"{i}.log")
            for i, p in zip(ids, ports, strict=True)
        ]
        time.sleep(3)
        publish_all(broker.port, planned[:boards])
        wait_written(ports, boards, 120)
        time.sleep(12)  # VictoriaMetrics registers new series in the background
        for process in processes:
            process.send_signal(signal.SIGTERM)
            process.wait(60)
        publish_all(broker.port, planned[boards:])  # waits in the sessions
        ports = [free_port() for _ in ids]
        processes = [
            ingest(broker.port, vm, i, group, p, folder / f"{i}.log")
            for i, p in zip(ids, ports, strict=True)
        ]
        watched = [psutil.Process(p.pid) for p in processes] + [
            psutil.Process(broker.process.pid),  # type: ignore[union-attr]
            psutil.Process(vm.process.pid),  # type: ignore[union-attr]
        ]
        wait_written(ports, 1, 60)  # started, connected, first request accepted: not counted
        first = sum(written(p) for p in ports)
        began = time.monotonic()

        def drain() -> float:
            wait_written(ports, backlog, 300)
            return time.monotonic() - began

        elapsed, used = cores(watched, drain)
        total = sum(written(p) for p in ports) - first
        for process in processes:
            process.send_signal(signal.SIGTERM)
            process.wait(60)
    result = {
        "members": members,
        "messages": int(total),
        "seconds": round(elapsed, 2),
        "messages_per_s": round(total / elapsed),
        "ingest_cores": used[:members],
        "broker_cores": used[-2],
        "store_cores": used[-1],
        "goal_per_s": GOAL_PER_S,
    }
    print(json.dumps(result), file=sys.stderr)
    return result


def pipeline(boards: int) -> dict[str, Any]:
    """The writer's CPU alone, in this process: messages/s parsed, mapped and encoded (no
    broker, no store, no network), the templates warm."""
    from mcpd.ctl.ingest_batch import Templates, encode
    from mcpd.ctl.ingest_samples import telemetry

    rounds = [messages(boards, boards, time.time() + r, 1.0) for r in range(4)]
    templates = Templates("mcpd")
    rates = []
    for batch in rounds:
        began = time.perf_counter()
        parsed = [telemetry(topic.split("/")[1], body) for topic, body, _ in batch]
        encode(parsed, templates)
        rates.append(len(batch) / (time.perf_counter() - began))
    result = {"messages_per_s_per_core": round(sorted(rates[1:])[1])}
    print(json.dumps(result), file=sys.stderr)
    return result


def latency(
    folder: Path, boards: int, window: int, warmup: int, probes: int, members: int
) -> dict[str, Any]:
    step = max(1, boards // probes)
    probed = [f"b{i:05d}" for i in range(0, boards, step)]
    with Mosquitto(folder / "broker") as broker, VictoriaMetrics(folder / "vm") as vm:
        group = "bench" if members > 1 else None
        processes = [
            ingest(broker.port, vm, f"ingest-{i}", group, free_port(), folder / f"latency{i}.log")
            for i in range(members)
        ]
        time.sleep(2)
        start = time.time() + 1
        planned = messages(boards, boards * (warmup + window), start - 1.0, 1.0)
        client = publisher(broker.port)
        published: list[float] = []
        """When each probe's message was published, in order."""
        counts: list[tuple[float, int]] = []
        selector = f'mcpd_temperature_celsius{{job="mcpd",instance=~"{"|".join(probed)}"}}'
        query = f"sum(count_over_time({selector}[1h]))"
        probes_set = frozenset(probed)
        is_probe = [topic.split("/")[1] in probes_set for topic, _, _ in planned]
        expected = sum(is_probe)
        watched = [psutil.Process(p.pid) for p in processes] + [
            psutil.Process(broker.process.pid),  # type: ignore[union-attr]
            psutil.Process(vm.process.pid),  # type: ignore[union-attr]
            psutil.Process(),  # the boards' publisher and the poller
        ]

        def count(at: float) -> None:
            result = vm.query(query, at)
            counts.append((time.time(), int(float(result[0]["value"][1])) if result else 0))

        def run() -> None:
            next_poll = time.time()
            for (topic, body, ts), probe in zip(planned, is_probe, strict=True):
                while (now := time.time()) < ts:
                    if now >= next_poll:
                        count(now)
                        next_poll = now + 0.1
                    time.sleep(min(0.002, max(0.0, ts - now)))
                client.publish(topic, body, qos=1)
                if probe:
                    published.append(time.time())
            deadline = time.time() + 30
            while (not counts or counts[-1][1] < expected) and time.time() < deadline:
                count(time.time())
                time.sleep(0.1)

        _, used = cores(watched, run)
        paho_thread.close(client)
        for process in processes:
            process.send_signal(signal.SIGTERM)
            process.wait(60)
    latencies = []
    seen = 0
    for at, count in counts:
        while seen < min(count, len(published)):
            if seen >= len(probed) * warmup:
                latencies.append(at - published[seen])
            seen += 1
    latencies.sort()

    def pct(q: float) -> float:
        return round(latencies[min(len(latencies) - 1, int(q * len(latencies)))], 3)

    result = {
        "boards": boards,
        "rate_hz": 1,
        "seconds": window,
        "warmup_s": warmup,
        "probes": len(probed),
        "probe_messages": len(published),
        "queryable": seen,
        "p50_s": pct(0.5),
        "p99_s": pct(0.99),
        "max_s": round(latencies[-1], 3),
        "members": members,
        "ingest_cores": used[:members],
        "broker_cores": used[-3],
        "store_cores": used[-2],
        "bench_cores": used[-1],
        "goal_p99_s": GOAL_P99_S,
    }
    print(json.dumps(result), file=sys.stderr)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backlog", type=int, default=40_000)
    parser.add_argument("--boards", type=int, default=2_000)
    parser.add_argument("--window", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=15)
    parser.add_argument("--probes", type=int, default=20, help="boards whose latency is measured")
    parser.add_argument(
        "--members", type=int, default=1, help="ingest processes in one group, for the latency"
    )
    parser.add_argument("--phases", default="pipeline,throughput,latency")
    args = parser.parse_args()
    phases = args.phases.split(",")
    with open("/proc/cpuinfo") as cpuinfo:
        model = next(
            (line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")),
            "?",
        )
    result: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"),
        "cpu": model,
        "cores": os.cpu_count(),
        "load_before": [round(x, 2) for x in os.getloadavg()],
    }
    if "pipeline" in phases:
        result["pipeline"] = pipeline(args.boards)
    with tempfile.TemporaryDirectory(prefix="mcpd-bench-ingest-") as folder:
        if "throughput" in phases:
            result["throughput"] = [
                throughput(Path(folder) / f"t{members}", members, args.backlog, args.boards)
                for members in (1, 2)
            ]
        if "latency" in phases:
            result["latency"] = latency(
                Path(folder) / "latency",
                args.boards,
                args.window,
                args.warmup,
                args.probes,
                args.members,
            )
    result["load_after"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
