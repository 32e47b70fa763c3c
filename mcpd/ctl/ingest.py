"""`mcpctl ingest`: every board's telemetry into a time-series store, by Prometheus remote write.

A long-running consumer (packaging/systemd/mcpd-ingest@.service runs it): it subscribes to the
fleet's telemetry and status on the broker, turns each message into the series of the board's own
`/metrics` (mcpd/ctl/ingest_samples.py) stamped with the message's `ts`, and writes them with
Remote-Write 1.0 to VictoriaMetrics, Prometheus, Mimir, Thanos Receive or any other store that
takes it. A message is acknowledged to the broker only after the request that holds it was
accepted. Run N of them with one `--group` where the broker has shared subscriptions, else one per
site prefix (mcpd/ctl/ingest_topics.py); docs/ingest.md says how, and what each guarantee rests on.

The machinery (mcpd/ctl/ingest_service.py) is imported only when the command runs: it needs
protobuf and cramjam, `pip install 'mcpd[fleet]'`, which the rest of mcpctl does not.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys

from mcpd import logs
from mcpd.ctl.ingest_topics import valid_group
from mcpd.subcommands import Subcommands


def run(args: argparse.Namespace) -> int:
    if args.group is not None and not valid_group(args.group):
        print(
            f"mcpctl ingest: --group {args.group!r} may not hold '/', '+' or '#'", file=sys.stderr
        )
        return 2
    if args.group is not None and args.protocol != "5":
        print(
            "mcpctl ingest: MQTT 3.1.1 has no shared subscriptions (a $share/... there is "
            "the broker's own extension, or a topic like any other): run one per site prefix "
            "(--prefix mcpd/site-N), without --group",
            file=sys.stderr,
        )
        return 2
    try:
        from mcpd.ctl.ingest_service import Ingest
    except ImportError as exc:
        print(f"mcpctl ingest: {exc.name} is missing: pip install 'mcpd[fleet]'", file=sys.stderr)
        return 2
    try:
        ingest = Ingest(args)
    except ValueError as exc:
        print(f"mcpctl ingest: {exc}", file=sys.stderr)
        return 2
    logs.setup(args.log_level, os.environ, sys.stderr)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: ingest.stopping.set())
    logging.getLogger("mcpctl.ingest").info(
        "writing %s's telemetry to %s", args.prefix, args.remote_write
    )
    return ingest.run()


def add_parser(commands: Subcommands) -> argparse.ArgumentParser:
    parser = commands.add_parser(
        "ingest", help="write every board's telemetry to a time-series store (remote write)"
    )
    parser.add_argument(
        "--broker",
        action="append",
        required=True,
        metavar="HOST[:PORT]",
        help="the MQTT broker; given again, the next one to try when it fails",
    )
    parser.add_argument("--prefix", default="mcpd", help="the boards' topic prefix (default mcpd)")
    parser.add_argument(
        "--remote-write", required=True, metavar="URL", help="the store's remote-write endpoint"
    )
    parser.add_argument(
        "--group", help="share the fleet with the other ingest processes of this group"
    )
    parser.add_argument(
        "--client-id",
        help="the session's client id, the same at every start (default mcpctl-ingest-HOSTNAME)",
    )
    parser.add_argument(
        "--metrics-listen", metavar="HOST:PORT", help="serve this process's own /metrics there"
    )
    parser.add_argument(
        "--job", default="mcpd", help="the `job` label of every series (default mcpd)"
    )
    parser.add_argument(
        "--protocol",
        choices=["5", "3.1.1"],
        default="5",
        help="MQTT version (default 5; 3.1.1 for brokers without 5: no --group then)",
    )
    parser.add_argument("--ca-file", help="TLS: trust the broker's certificate from this CA")
    parser.add_argument("--username")
    parser.add_argument("--password-file")
    parser.add_argument(
        "--log-level",
        choices=["debug", "info", "warning", "error"],
        default="info",
        help="debug: a line per delivery (its packet id) and per written message (device, seq)",
    )
    return parser
