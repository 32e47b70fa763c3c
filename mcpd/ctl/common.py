"""What every socket subcommand of mcpctl shares: the --socket option and one way to fail."""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Callable

from mcpd.client import Client, ServerError, default_socket

Command = Callable[[argparse.Namespace, Client], int]


def add_socket(parser: argparse.ArgumentParser, *, top_level: bool = False) -> None:
    """--socket, on mcpctl itself (before the subcommand, as systemctl takes its options) and on
    each socket subcommand; a subcommand's copy sets nothing unless given (SUPPRESS), else its
    default would undo a value given before the subcommand."""
    parser.add_argument(
        "--socket",
        default=None if top_level else argparse.SUPPRESS,
        help="mcpd's socket (default $MCPD_SOCKET or /run/mcpd/mcpd.sock)",
    )


def connected(command: Command) -> Callable[[argparse.Namespace], int]:
    """Run `command` with a client; a daemon that is not there or says no is one line, exit 1."""

    @functools.wraps(command)
    def run(args: argparse.Namespace) -> int:
        path = args.socket or default_socket()
        try:
            with Client(path) as client:
                return command(args, client)
        except ServerError as exc:
            print(f"mcpctl: mcpd says {exc.status}: {exc.message}", file=sys.stderr)
        except OSError as exc:
            print(f"mcpctl: cannot talk to mcpd on {path}: {exc.strerror or exc}", file=sys.stderr)
        return 1

    return run


def number(value: object, unit: str = "", digits: int = 1) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return "-"
    return f"{value:.{digits}f}{unit}"
