"""`mcpd`: the daemon and its admin commands."""

from __future__ import annotations

import argparse
import os
import sys

from mcpd import __version__, config, logs
from mcpd.cli import bench, check_config, optimize, probe, reload, restore, run, sim
from mcpd.subcommands import Command, add_commands

COMMANDS: tuple[Command, ...] = (run, check_config, probe, reload, restore, sim, optimize, bench)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mcpd", description=__doc__)
    parser.add_argument("--version", action="version", version=f"mcpd {__version__}")
    parser.add_argument("--log-level", default=None, choices=["debug", "info", "warning", "error"])
    add_commands(parser, COMMANDS)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logs.setup(args.log_level or args.default_level, os.environ, sys.stderr)
    try:
        return int(args.func(args))
    except config.ConfigError as exc:
        print(exc, file=sys.stderr)
        return 1
