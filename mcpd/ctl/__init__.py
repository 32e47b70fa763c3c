"""`mcpctl`: the client for a running mcpd."""

from __future__ import annotations

import argparse

from mcpd import __version__
from mcpd.ctl import fleet, infer, ingest, models, status, top
from mcpd.ctl.common import add_socket
from mcpd.subcommands import Command, add_commands

COMMANDS: tuple[Command, ...] = (fleet, ingest, status, models, infer, top)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mcpctl", description=__doc__)
    parser.add_argument("--version", action="version", version=f"mcpctl {__version__}")
    add_socket(parser, top_level=True)
    add_commands(parser, COMMANDS)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args))
