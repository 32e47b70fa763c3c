"""`mcpd reload`: make the running daemon reload its config and wait for its verdict (systemd's
ExecReload)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from mcpd import config
from mcpd.subcommands import Subcommands


def add_parser(commands: Subcommands) -> argparse.ArgumentParser:
    parser = commands.add_parser(
        "reload", help="reload the running daemon's config and wait for its verdict (ExecReload)"
    )
    parser.add_argument("--pid", help="the daemon's process id (default $MAINPID, as systemd sets)")
    parser.add_argument(
        "--runtime-dir",
        help="the daemon's [daemon] runtime_dir, where it writes its verdict "
        "(default $RUNTIME_DIRECTORY, as systemd sets, else /run/mcpd)",
    )
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds to wait (default 60)")
    parser.set_defaults(default_level="warning")
    return parser


def run(args: argparse.Namespace) -> int:
    from mcpd.governor import reloading

    pid = args.pid or os.environ.get("MAINPID", "")
    if not pid.isdigit() or int(pid) <= 0:
        print("mcpd reload: give the daemon's process id (--pid, or $MAINPID)", file=sys.stderr)
        return 2
    # Not from the config file: the file being reloaded may be the broken one.
    given = args.runtime_dir or os.environ.get("RUNTIME_DIRECTORY", "").split(":")[0]
    folder = Path(given or config.DaemonSection().runtime_dir)
    try:
        verdict = reloading.request(int(pid), folder, args.timeout)
    except reloading.NoDaemon as exc:
        print(f"mcpd reload: {exc}", file=sys.stderr)
        return 2
    if verdict is None:
        print(f"mcpd reload: no verdict in {folder} within {args.timeout:g} s", file=sys.stderr)
        return 2
    print(verdict.message, file=sys.stdout if verdict.ok else sys.stderr)
    return 0 if verdict.ok else 1
