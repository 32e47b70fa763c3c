"""bench/mqtt_cluster.py's figures for one engine's run, and the tables for BENCHMARKS.md.
Pure: what the run recorded in, numbers and text out."""

from __future__ import annotations

import json
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from cluster_measures import (
    Heard,
    Visibility,
    by_device,
    gaps,
    holes,
    latencies,
    percentile,
    silences,
    store_check,
    twice,
)

PHASES = ("steady", "down", "after")
WRITTEN = "mcpd_ingest_messages_written_total"


@dataclass(frozen=True)
class Run:
    messages: list[tuple[str, bytes, float]]
    """(topic, payload, arrival) of everything the consumer received."""
    visibility: Visibility
    stored: dict[str, list[int]]
    """Each board's sample times in the store (ms)."""
    marks: list[float]
    """The phases' bounds: steady from marks[0], down from the kill, after from the restart,
    to marks[3]."""
    stopped_at: float
    """When the boards were told to stop."""
    cores: list[dict[str, float]]
    """Per phase, the cores of each process that ran all through it."""
    ingested: list[dict[str, float]]
    """`mcpctl ingest`'s counters at each mark."""
    killed: tuple[int, int]
    """The node killed, and the client connections it had."""
    since: dict[str, float | None]
    """Per board, when its connection at the end began."""
    online: list[int]
    """Boards online in `mcpctl fleet` at its first snapshot and after a heartbeat."""


def spread(values: list[float]) -> list[float | None]:
    """p50, p99, max, rounded to ms."""
    found = [percentile(values, 50), percentile(values, 99), max(values, default=None)]
    return [None if v is None else round(v, 3) for v in found]


def figures(engine: str, boards: int, rate: float, run: Run) -> dict[str, Any]:
    heard, wills = [], set()
    killed_at, stopped_at = run.marks[1], run.stopped_at
    for topic, payload, at in run.messages:
        device, leaf = topic.split("/")[1:3]
        if leaf == "telemetry":
            body = json.loads(payload)
            heard.append(Heard(device, body["seq"], body["ts"], at))
        elif payload == b"offline" and killed_at <= at < stopped_at:
            wills.add(device)
    boards_heard = by_device(heard)
    spans = list(pairwise(run.marks))
    quiet = silences(boards_heard, run.marks[0], stopped_at)
    reconnected = {d for d, s in run.since.items() if s is not None and s > killed_at}
    fronted = {d for d in boards_heard if int(d[1:]) % 2}
    missing, doubled = store_check(boards_heard, run.stored)
    steady_cores = run.cores[0].get("ingest")
    written = [
        (b[WRITTEN] - a[WRITTEN]) / (t1 - t0)
        for (a, b), (t0, t1) in zip(pairwise(run.ingested), spans, strict=True)
    ]
    return {
        "engine": engine,
        "boards": boards,
        "rate_hz": rate,
        "boards_heard": len(boards_heard),
        "received_per_s": [
            round(sum(t0 <= h.at < t1 for h in heard) / (t1 - t0), 1) for t0, t1 in spans
        ],
        "written_per_s": [round(w, 1) for w in written],
        "seq_gaps": sum(gaps(boards_heard).values()),
        # When the message before each gap was made, from the kill (the missing one a period on).
        "seq_gaps_after_s": [round(m.ts - killed_at, 1) for m, _ in holes(boards_heard)][:20],
        "received_twice": sum(twice(boards_heard).values()),
        "store_missing": len(missing),
        # When the missing ones were made, from the kill: a start-up, a failover or an end effect.
        "store_missing_made_s": [round(m.ts - killed_at, 1) for m in missing][:20],
        "store_twice": doubled,
        "ingest_duplicates_dropped": run.ingested[-1].get("mcpd_ingest_duplicates_total"),
        "killed_node": run.killed[0],
        "connections_on_killed_node": run.killed[1],
        "reconnected": len(reconnected),
        "silence_s": {
            "list": spread([s for d, s in quiet.items() if d not in fronted]),
            "haproxy": spread([s for d, s in quiet.items() if d in fronted]),
            "reconnected": spread([s for d, s in quiet.items() if d in reconnected]),
            "stayed": spread([s for d, s in quiet.items() if d not in reconnected]),
        },
        "wills_after_kill": len(wills),
        "online_in_fleet": {"first_snapshot": run.online[0], "after_heartbeat": run.online[1]},
        "latency_s": {
            phase: [*spread(found), unseen]
            for phase, (t0, t1) in zip(PHASES, spans, strict=True)
            for found, unseen in [latencies(heard, run.visibility, t0, t1)]
        },
        "ingest_per_core": round(written[0] / steady_cores) if steady_cores else None,
        "cores": dict(zip(PHASES, run.cores, strict=True)),
    }


def _three(values: list[Any]) -> str:
    return " / ".join("–" if v is None else f"{v:g}" for v in values)


def tables(results: list[dict[str, Any]]) -> str:
    """Markdown: node loss; latency; CPU."""
    lines = [
        "| engine | boards × Hz | received/s steady / down / after | seq gaps | received "
        "twice | store: missing / twice | killed node's connections | reconnected | longest "
        "silence p50 / p99 / max s, list | haproxy | Wills after the kill | online in fleet: "
        "at once / after a heartbeat |",
        "|---|---|---|---:|---:|---|---:|---:|---|---|---:|---|",
    ]
    for r in results:
        lines.append(
            f"| {r['engine']} | {r['boards']} × {r['rate_hz']:g} | "
            f"{_three(r['received_per_s'])} | {r['seq_gaps']} | {r['received_twice']} | "
            f"{r['store_missing']} / {r['store_twice']} | {r['connections_on_killed_node']} | "
            f"{r['reconnected']} | {_three(r['silence_s']['list'])} | "
            f"{_three(r['silence_s']['haproxy'])} | {r['wills_after_kill']} | "
            f"{r['online_in_fleet']['first_snapshot']} / {r['online_in_fleet']['after_heartbeat']}"
            " |"
        )
    lines += [
        "",
        "| engine | broker → queryable p50 / p99 / max s: steady | down | after | not seen "
        "| ingest messages/s steady | ingest cores | messages/s per ingest core |",
        "|---|---|---|---|---:|---:|---:|---:|",
    ]
    for r in results:
        latency = r["latency_s"]
        lines.append(
            f"| {r['engine']} | {_three(latency['steady'][:3])} | {_three(latency['down'][:3])} "
            f"| {_three(latency['after'][:3])} | {sum(latency[p][3] for p in PHASES)} | "
            f"{r['written_per_s'][0]:g} | {r['cores']['steady'].get('ingest', '–')} | "
            f"{r['ingest_per_core'] or '–'} |"
        )
    names = ["node0", "node1", "node2", "haproxy", "store", "ingest", "boards", "bench"]
    lines += [
        "",
        "| engine | phase | " + " | ".join(names) + " |",
        "|---|---|" + "---:|" * len(names),
    ]
    for r in results:
        for phase in PHASES:
            cores = r["cores"][phase]
            lines.append(
                f"| {r['engine']} | {phase} | "
                + " | ".join(f"{cores[n]:.3f}" if n in cores else "–" for n in names)
                + " |"
            )
    return "\n".join(lines)
