"""`mcpctl top`: a live view of the board and the models (like jtop): temperature, power, caps,
governor, and per model the batch size, requests/s, latency and queue."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Mapping
from typing import Any

from mcpd.client import Client
from mcpd.ctl.common import add_socket, connected, number
from mcpd.subcommands import Subcommands

CLEAR = "\x1b[H\x1b[2J"
BAR = 24


def _bar(value: object, top: object) -> str:
    if not isinstance(value, int | float) or not isinstance(top, int | float) or top <= 0:
        return " " * BAR
    filled = round(BAR * max(0.0, min(1.0, value / top)))
    return "█" * filled + "·" * (BAR - filled)


def render(doc: Mapping[str, Any], previous: Mapping[str, Any] | None, seconds: float) -> str:
    """One frame; requests/s come from the counters' change since `previous`."""
    governor = doc.get("governor") or {}
    power = "no meter" if doc.get("power_w") is None else number(doc.get("power_w"), " W", 2)
    if doc.get("power_w") is not None and doc.get("power_source") == "estimate":
        power += " est."
    lines = [
        f"mcpd on {doc.get('platform')}  {doc.get('model') or ''}".rstrip(),
        f"temp {number(doc.get('temperature_c'), ' °C')}   power {power}   "
        f"governor {governor.get('state', '-')}",
        "",
    ]
    for name, d in (doc.get("domains") or {}).items():
        lines.append(
            f"{name:<16} {_bar(d.get('cap_mhz'), d.get('max_mhz'))} "
            f"cap {number(d.get('cap_mhz'), '', 0):>6} / {number(d.get('max_mhz'), '', 0):>6} MHz"
        )
    last = governor.get("last_action")
    if last:
        lines.append(f"last action: {last['action']} ({last['reason']})")
    lines += [
        "",
        f"{'model':<16} {'batch':>5} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} "
        f"{'queue':>6} {'errors':>7}",
    ]
    before = (previous or {}).get("inference") or {}
    batch = doc.get("batch") or {}
    for name, m in (doc.get("inference") or {}).items():
        rate = None
        if name in before and seconds > 0:
            rate = (m.get("requests", 0) - before[name].get("requests", 0)) / seconds
        state = "" if m.get("ready") else "  (not ready)"
        lines.append(
            f"{name:<16} {batch.get(name, '-'):>5} {number(rate, '', 1):>8} "
            f"{number(m.get('p50_ms'), '', 2):>8} {number(m.get('p99_ms'), '', 2):>8} "
            f"{m.get('queue_depth', 0):>6} {m.get('errors', 0):>7}{state}"
        )
    return "\n".join(lines)


@connected
def run(args: argparse.Namespace, client: Client) -> int:
    previous: Mapping[str, Any] | None = None
    taken = time.monotonic()
    frames = 0
    plain = args.plain or not sys.stdout.isatty()  # `mcpctl top | cat`: no escape codes in a pipe
    try:
        while args.count is None or frames < args.count:
            if frames:
                time.sleep(args.interval)
            doc, now = client.status(), time.monotonic()
            frame = render(doc, previous, now - taken)
            print(frame if plain else CLEAR + frame, flush=True)
            previous, taken, frames = doc, now, frames + 1
    except KeyboardInterrupt:
        pass
    return 0


def add_parser(commands: Subcommands) -> argparse.ArgumentParser:
    parser = commands.add_parser("top", help="live view: temperature, power, caps, batch, req/s")
    add_socket(parser)
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between frames")
    parser.add_argument("--count", type=int, default=None, help="stop after this many frames")
    parser.add_argument(
        "--plain",
        action="store_true",
        help="do not clear the screen (the default when output is not a terminal)",
    )
    return parser
