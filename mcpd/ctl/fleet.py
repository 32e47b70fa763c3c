"""`mcpctl fleet`: every board on a broker in one live table, hottest first (or, with `--sort
drift`, the worst cooling first: the thermal resistance furthest over its own baseline).

Subscribes to `<prefix>/+/status` (retained: every board the broker has heard of, online or not)
and `<prefix>/+/telemetry`, and redraws every `--interval` seconds; `--json` prints one snapshot
per line instead, for scripts (`--count 1` for a single one).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.reasoncodes import ReasonCode


@dataclass(frozen=True)
class Row:
    device: str
    online: bool | None
    """None: no status seen (a board that never connected with mcpd's status topic)."""
    platform: str | None
    temperature_c: float | None
    power_w: float | None
    caps_mhz: dict[str, float | None]
    governor: str | None
    cooling: str | None
    """The cooling's state (README, "Cooling health"); None from a board that does not say."""
    drift_ratio: float | None
    """Its thermal resistance over its baseline."""
    requests_per_s: float | None
    last_seen_s: float | None
    """Seconds since its last telemetry; None if none seen yet."""


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


class FleetView:
    """What the broker has said about each board. Updated from paho's thread, read from ours."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self._online: dict[str, bool] = {}
        self._telemetry: dict[str, tuple[float, dict[str, Any]]] = {}
        self._lock = threading.Lock()

    def update(self, topic: str, payload: bytes, now: float) -> None:
        head, _, leaf = topic.rpartition("/")
        base, _, device = head.rpartition("/")
        if base != self.prefix or not device:
            return
        if leaf == "status" and payload in (b"online", b"offline"):
            with self._lock:
                self._online[device] = payload == b"online"
        elif leaf == "telemetry":
            try:
                body = json.loads(payload)
            except ValueError:
                return  # not mcpd's; keep the last good one
            if isinstance(body, dict):
                with self._lock:
                    self._telemetry[device] = (now, body)

    def rows(self, now: float, sort: str = "temperature") -> list[Row]:
        """Hottest first; by `sort="drift"`, the worst cooling first, then hottest. A board
        without the figure comes after those with it."""
        with self._lock:
            devices = sorted(self._online.keys() | self._telemetry.keys())
            rows = [self._row(device, now) for device in devices]
        rows.sort(key=lambda r: (r.temperature_c is None, -(r.temperature_c or 0)))
        if sort == "drift":
            rows.sort(key=lambda r: (r.drift_ratio is None, -(r.drift_ratio or 0)))
        return rows

    def _row(self, device: str, now: float) -> Row:
        seen, body = self._telemetry.get(device, (None, {}))
        domains = body.get("domains")
        governor = body.get("governor")
        cooling = body.get("cooling")
        if not isinstance(cooling, dict):
            cooling = {}
        return Row(
            device=device,
            online=self._online.get(device),
            platform=body.get("platform") if isinstance(body.get("platform"), str) else None,
            temperature_c=_number(body.get("temperature_c")),
            power_w=_number(body.get("power_w")),
            caps_mhz={
                str(name): _number(d.get("cap_mhz")) if isinstance(d, dict) else None
                for name, d in (domains.items() if isinstance(domains, dict) else ())
            },
            governor=str(governor.get("state")) if isinstance(governor, dict) else None,
            cooling=str(cooling["state"]) if "state" in cooling else None,
            drift_ratio=_number(cooling.get("drift_ratio")),
            requests_per_s=_number(body.get("requests_per_s")),
            last_seen_s=None if seen is None else round(now - seen, 1),
        )


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def table(rows: list[Row]) -> str:
    header = (
        "DEVICE",
        "ONLINE",
        "PLATFORM",
        "TEMP °C",
        "POWER W",
        "CAPS MHz",
        "GOVERNOR",
        "COOLING",
        "REQ/S",
        "LAST SEEN",
    )
    lines = [header]
    for row in rows:
        caps = " ".join(
            f"{name.rsplit('.', 1)[-1]} {_fmt(cap, '.0f')}" for name, cap in row.caps_mhz.items()
        )
        online = {True: "yes", False: "NO", None: "?"}[row.online]
        lines.append(
            (
                row.device,
                online,
                row.platform or "-",
                _fmt(row.temperature_c, ".1f"),
                _fmt(row.power_w, ".2f"),
                caps or "-",
                row.governor or "-",
                " x".join(
                    (row.cooling or "-", *([f"{row.drift_ratio:.2f}"] if row.drift_ratio else []))
                ),
                _fmt(row.requests_per_s, ".1f"),
                "-" if row.last_seen_s is None else f"{row.last_seen_s:.1f} s",
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    right = {3, 4, 8, 9}
    return "\n".join(
        "  ".join(
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(line, widths, strict=True))
        ).rstrip()
        for line in lines
    )


def _connect(args: argparse.Namespace, view: FleetView) -> paho.Client:
    host, colon, port = args.broker.rpartition(":")
    if not colon:
        host, port = args.broker, ""
    client = paho.Client(CallbackAPIVersion.VERSION2, protocol=paho.MQTTv5)
    if args.username:
        password = (
            Path(args.password_file).read_text().rstrip("\r\n") if args.password_file else None
        )
        client.username_pw_set(args.username, password)
    if args.ca_file:
        client.tls_set(ca_certs=args.ca_file)
    answered = threading.Event()
    refusal: list[ReasonCode] = []

    def on_connect(c: paho.Client, _u: Any, _f: Any, reason: ReasonCode, _p: Any) -> None:
        if reason.is_failure:
            refusal.append(reason)
        else:
            c.subscribe([(f"{view.prefix}/+/status", 1), (f"{view.prefix}/+/telemetry", 0)])
        answered.set()

    client.on_connect = on_connect
    client.on_message = lambda _c, _u, m: view.update(m.topic, bytes(m.payload), time.monotonic())
    client.connect(host, int(port or (8883 if args.ca_file else 1883)), keepalive=30)
    client.loop_start()
    if not answered.wait(10) or refusal:
        client.loop_stop()
        why = refusal[0].getName() if refusal else "no answer"
        raise ConnectionError(f"broker refused the connection: {why}")
    return client


def run(args: argparse.Namespace) -> int:
    view = FleetView(args.prefix)
    try:
        client = _connect(args, view)
    except (OSError, ValueError) as exc:
        print(f"mcpctl fleet: cannot connect to {args.broker}: {exc}", file=sys.stderr)
        return 1
    live = sys.stdout.isatty() and not args.json
    shown = 0
    try:
        while args.count == 0 or shown < args.count:
            time.sleep(args.interval)
            rows = view.rows(time.monotonic(), args.sort)
            if args.json:
                snapshot = {"ts": round(time.time(), 3), "devices": [asdict(r) for r in rows]}
                print(json.dumps(snapshot), flush=True)
            else:
                print(
                    ("\x1b[H\x1b[J" if live else "") + table(rows) + ("" if live else "\n"),
                    flush=True,
                )
            shown += 1
    except KeyboardInterrupt:
        pass
    finally:
        client.disconnect()
        client.loop_stop()
    return 0


def register(commands: Any) -> None:
    parser = commands.add_parser("fleet", help="live table of every board on an MQTT broker")
    parser.add_argument("--broker", required=True, metavar="HOST[:PORT]")
    parser.add_argument("--prefix", default="mcpd", help="topic prefix (default mcpd)")
    parser.add_argument("--json", action="store_true", help="one JSON snapshot per line")
    parser.add_argument(
        "--sort",
        choices=["temperature", "drift"],
        default="temperature",
        help="hottest first (default), or the worst cooling first: its thermal resistance over "
        "its baseline",
    )
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between redraws")
    parser.add_argument("--count", type=int, default=0, help="stop after N snapshots (0: never)")
    parser.add_argument("--ca-file", help="TLS: trust the broker's certificate from this CA")
    parser.add_argument("--username")
    parser.add_argument("--password-file")
    parser.set_defaults(func=run)
