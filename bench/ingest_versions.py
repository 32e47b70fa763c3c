"""mcpctl ingest's own work per message, this tree against a git revision, side by side.

    nice .venv/bin/python bench/ingest_versions.py REV [--boards 2000] [--rounds 7]

The same telemetry messages (the daemon's encoder on tests/support/mqtt_status.py's boards, made once by
this tree) go through each version's parse, mapping and encoding (mcpd.ctl.ingest_samples,
mcpd.ctl.ingest_batch: the writer thread's work, without broker, store or network), each run in a
process of its own, the two versions alternating round by round so that both see the same load
on a shared machine. Prints one JSON object: messages/s per core of each round, their medians,
the median of the per-round ratios, the load average before and after, and the CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mcpd.telemetry import encoder  # noqa: E402
from tests.support.mqtt_status import FakeBoard  # noqa: E402

CHILD = """
import pickle, sys, time
sys.path.insert(0, sys.argv[1])
from mcpd.ctl.ingest_batch import Templates, encode
from mcpd.ctl.ingest_samples import telemetry
rounds = pickle.load(open(sys.argv[2], "rb"))
templates = Templates("mcpd")
rates = []
for batch in rounds:
    began = time.process_time()
    encode([telemetry(device, body) for device, body in batch], templates)
    rates.append(len(batch) / (time.process_time() - began))
print(sorted(rates[1:])[len(rates[1:]) // 2])  # the first makes the templates
"""


def messages(boards: int, passes: int) -> list[list[tuple[str, bytes]]]:
    """`passes` rounds of one message per board, each board's documents moving on."""
    fleet = {f"b{i:05d}": FakeBoard() for i in range(boards)}
    start = time.time()
    return [
        [
            (device, encoder.telemetry(
                {**board(), "ts": start + n}, device=device, seq=n + 1,
                requests_per_s=1.0, queued=0, dropped=0,
            ))
            for device, board in fleet.items()
        ]
        for n in range(passes)
    ]  # fmt: skip


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "?"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("revision")
    parser.add_argument("--boards", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        before = Path(folder) / "before"
        before.mkdir()
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", args.revision, "mcpd", "safefs", "sensors",
             "governors"],
            check=True, capture_output=True,
        ).stdout  # fmt: skip
        subprocess.run(["tar", "-x", "-C", str(before)], input=archive, check=True)
        data = Path(folder) / "messages.pickle"
        data.write_bytes(pickle.dumps(messages(args.boards, 4)))
        load_before = os.getloadavg()
        rates: dict[str, list[float]] = {args.revision: [], "this tree": []}
        for _ in range(args.rounds):
            for name, root in ((args.revision, before), ("this tree", ROOT)):
                out = subprocess.run(
                    [sys.executable, "-c", CHILD, str(root), str(data)],
                    check=True, capture_output=True, text=True,
                ).stdout  # fmt: skip
                rates[name].append(round(float(out)))
        load_after = os.getloadavg()
    ratios = [new / old for old, new in zip(rates[args.revision], rates["this tree"], strict=True)]
    print(
        json.dumps(
            {
                "boards": args.boards,
                "messages_per_s_per_core": rates,
                "medians": {name: statistics.median(r) for name, r in rates.items()},
                "median_ratio": round(statistics.median(ratios), 3),
                "load_average": [load_before, load_after],
                "cpu": cpu_model(),
                "cpus": os.cpu_count(),
                "python": sys.version.split()[0],
            }
        )
    )


if __name__ == "__main__":
    main()
