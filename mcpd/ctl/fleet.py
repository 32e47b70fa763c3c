"""`mcpctl fleet`: every board on a broker in one live table, hottest first (or, with `--sort
drift`, the worst cooling first: the thermal resistance furthest over its own baseline).

Subscribes to `<prefix>/+/status` (retained: every board the broker has heard of, online or not)
and `<prefix>/+/telemetry`, and redraws every `--interval` seconds; `--json` prints one snapshot
per line instead, for scripts (`--count 1` for a single one). `--site` narrows the subscriptions to
some sites' boards (`<prefix>/<site>/+/…`); `--from URL` reads the numbers from a time-series store
(mcpd/ctl/fleet_store.py) and takes only the statuses from the broker, if one is given.
"""

from __future__ import annotations

import argparse
import json
import secrets
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.reasoncodes import ReasonCode

from mcpd.config import MqttSection
from mcpd.ctl import fleet_store, paho_thread
from mcpd.ctl.fleet_view import FleetView, table
from mcpd.subcommands import Subcommands


def _connect(args: argparse.Namespace, view: FleetView, telemetry: bool) -> paho.Client:
    host, colon, port = args.broker.rpartition(":")
    if not colon:
        host, port = args.broker, ""
    v5 = args.protocol == "5"
    client = paho.Client(
        CallbackAPIVersion.VERSION2,
        f"mcpctl-fleet-{secrets.token_hex(4)}",
        protocol=paho.MQTTv5 if v5 else paho.MQTTv311,
    )
    if args.username:
        password = (
            Path(args.password_file).read_text().rstrip("\r\n") if args.password_file else None
        )
        client.username_pw_set(args.username, password)
    if args.ca_file:
        client.tls_set(ca_certs=args.ca_file)
    answered = threading.Event()
    refusal: list[ReasonCode] = []
    topics = [(f"{base}/+/status", 1) for base in view.bases()]
    if telemetry:
        topics += [(f"{base}/+/telemetry", 0) for base in view.bases()]

    def on_connect(c: paho.Client, _u: Any, _f: Any, reason: ReasonCode, _p: Any) -> None:
        if reason.is_failure:
            refusal.append(reason)
        else:
            c.subscribe(topics)
        answered.set()

    client.on_connect = on_connect
    client.on_message = lambda _c, _u, m: view.update(m.topic, bytes(m.payload), time.time())
    client.connect(host, int(port or (8883 if args.ca_file else 1883)), keepalive=30)
    client.loop_start()
    if not answered.wait(10) or refusal:
        paho_thread.stop(client)
        why = refusal[0].getName() if refusal else "no answer"
        raise ConnectionError(f"broker refused the connection: {why}")
    return client


def _usage(args: argparse.Namespace) -> str | None:
    if not args.broker and not args.source:
        return "give --broker, --from or both"
    if args.site and not args.broker:
        return "--site narrows the broker's topics: it needs --broker"
    return None


def run(args: argparse.Namespace) -> int:
    wrong = _usage(args)
    if wrong:
        print(f"mcpctl fleet: {wrong}", file=sys.stderr)
        return 2
    view = FleetView(args.prefix, tuple(args.site), args.heartbeat, statuses=bool(args.broker))
    client = None
    if args.broker:
        try:
            client = _connect(args, view, telemetry=not args.source)
        except (OSError, ValueError) as exc:
            print(f"mcpctl fleet: cannot connect to {args.broker}: {exc}", file=sys.stderr)
            return 1
    live = sys.stdout.isatty() and not args.json
    shown = 0
    try:
        while args.count == 0 or shown < args.count:
            time.sleep(args.interval)
            if args.source:
                for device, (at, body) in fleet_store.read(args.source, args.top).items():
                    view.measured(device, at, body)
            rows = view.rows(time.time(), args.sort)[: args.top or None]
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
    except fleet_store.StoreError as exc:
        print(f"mcpctl fleet: {exc}", file=sys.stderr)
        return 1
    finally:
        if client is not None:
            paho_thread.close(client)
    return 0


def add_parser(commands: Subcommands) -> argparse.ArgumentParser:
    parser = commands.add_parser("fleet", help="live table of every board on an MQTT broker")
    parser.add_argument("--broker", metavar="HOST[:PORT]", help="follow the boards on it")
    parser.add_argument(
        "--from",
        dest="source",
        metavar="URL",
        help="read the boards' numbers from a Prometheus-compatible store (PromQL over HTTP); "
        "with --broker, only the statuses come from the broker",
    )
    parser.add_argument("--prefix", default="mcpd", help="topic prefix (default mcpd)")
    parser.add_argument(
        "--site",
        action="append",
        default=[],
        help="follow only the boards under <prefix>/<SITE>/ (repeatable; + for every site)",
    )
    parser.add_argument(
        "--heartbeat",
        type=float,
        default=float(MqttSection.heartbeat_s),
        help="the boards' [mqtt] heartbeat_s: one not heard from for 3 x this is offline "
        f"(default {MqttSection.heartbeat_s})",
    )
    parser.add_argument("--protocol", choices=("5", "3.1.1"), default="5", help="MQTT version")
    parser.add_argument(
        "--top",
        type=int,
        default=0,
        metavar="N",
        help="only the N hottest boards (with --from, the store picks them: topk)",
    )
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
    return parser
