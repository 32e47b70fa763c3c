"""Memory and time to replay a large telemetry spool at start, against reading the file whole.

    .venv/bin/python bench/spool_replay.py [--mb 300] [--runs 3]

Builds a spool of about `--mb` MiB on tmpfs: telemetry-sized messages (4 KiB), all but the newest
`--owed` acknowledged (DONE frames), as a long outage with a large `spool_messages` leaves it, then
in fresh processes, alternating, measures the peak RSS and wall time of (a) `Spool.open` on a copy
(the daemon's start: streamed replay, then the compacting rewrite) and (b) only reading the same
file whole into memory, the least any read-it-whole replay costs. Prints medians.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT))

from mcpd.telemetry import journal  # noqa: E402

CHILD = """
import json, resource, sys, time
from pathlib import Path
sys.path.insert(0, {project!r})
path, how = Path(sys.argv[1]), sys.argv[2]
started = time.monotonic()
if how == "spool":
    from mcpd.telemetry.spool import Spool
    kept = len(Spool.open(path, 10_000, time.monotonic))
else:
    kept = len(path.read_bytes())
print(json.dumps({{"rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "s": time.monotonic() - started, "kept": kept}}))
"""


def build(path: Path, mb: int, owed: int) -> int:
    payload = json.dumps({"schema": 1, "pad": "x" * 3900}).encode()
    count = mb * 2**20 // (len(payload) + 22)
    with open(path, "wb") as file:
        file.write(journal.MAGIC + journal.seq_frame(count))
        for ident in range(1, count + 1):
            file.write(journal.add_frame(journal.Message(ident, "telemetry", payload)))
            if ident % 1000 == 0 and ident <= count - owed:
                file.write(journal.done_frame(range(ident - 999, ident + 1)))
    return count


def measure(source: Path, folder: Path, how: str) -> dict[str, float]:
    copy = folder / "telemetry.spool"
    shutil.copyfile(source, copy)
    (folder / "telemetry.seq").unlink(missing_ok=True)
    child = CHILD.format(project=str(PROJECT))
    out = subprocess.run(
        [sys.executable, "-c", child, str(copy), how], capture_output=True, text=True, check=True
    )
    result: dict[str, float] = json.loads(out.stdout)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mb", type=int, default=300)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--owed", type=int, default=2000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir="/dev/shm") as tmp:
        folder = Path(tmp)
        source = folder / "source.spool"
        count = build(source, args.mb, args.owed)
        size = source.stat().st_size / 2**20
        results: dict[str, list[dict[str, float]]] = {"spool": [], "whole": []}
        for _ in range(args.runs):
            for how in results:
                results[how].append(measure(source, folder, how))
    print(f"spool of {size:.0f} MiB, {count} messages, {args.owed} owed; medians of {args.runs}")
    print("| replay | peak RSS MiB | seconds |")
    print("|---|---:|---:|")
    names = {"spool": "Spool.open (streamed)", "whole": "read the file whole, nothing else"}
    for how, runs in results.items():
        rss = statistics.median(r["rss_mb"] for r in runs)
        seconds = statistics.median(r["s"] for r in runs)
        print(f"| {names[how]} | {rss:.0f} | {seconds:.2f} |")
    print(f"kept by Spool.open: {int(results['spool'][0]['kept'])} messages")


if __name__ == "__main__":
    main()
