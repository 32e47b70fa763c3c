"""`mcpctl infer MODEL --input NAME=FILE.npy ...`: run a model on .npy files, save or show the
outputs."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from mcpd.client import Client
from mcpd.ctl.common import add_socket, connected
from mcpd.subcommands import Subcommands

SHOWN = 16
"""Outputs with at most this many values are printed; larger ones are summarised."""


def _inputs(specs: list[str]) -> dict[str, np.ndarray]:
    inputs = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            raise ValueError(f"--input {spec!r}: expected NAME=FILE.npy")
        try:
            inputs[name] = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise ValueError(f"--input {spec!r}: cannot read {path}: {exc}") from None
    return inputs


def _describe(name: str, array: np.ndarray) -> str:
    head = f"{name}  {array.dtype} {list(array.shape)}"
    if array.size <= SHOWN:
        return f"{head}  {np.array2string(array.reshape(-1), precision=5, separator=', ')}"
    if array.dtype.kind in "biuf":
        return f"{head}  min {array.min():.5g} max {array.max():.5g} mean {array.mean():.5g}"
    return head


@connected
def _run(args: argparse.Namespace, client: Client) -> int:
    outputs = client.infer(args.model, args.inputs, args.output or None)
    for name, array in outputs.items():
        if args.output_dir is not None:
            args.output_dir.mkdir(parents=True, exist_ok=True)
            path = args.output_dir / f"{name}.npy"
            np.save(path, array)
            print(f"{_describe(name, array)}  -> {path}")
        else:
            print(_describe(name, array))
    return 0


def run(args: argparse.Namespace) -> int:
    try:
        args.inputs = _inputs(args.input)
    except ValueError as exc:
        print(f"mcpctl infer: {exc}", file=sys.stderr)
        return 2
    return _run(args)


def add_parser(commands: Subcommands) -> argparse.ArgumentParser:
    parser = commands.add_parser("infer", help="run a model on .npy inputs")
    add_socket(parser)
    parser.add_argument("model")
    parser.add_argument(
        "--input", action="append", required=True, metavar="NAME=FILE.npy", help="repeatable"
    )
    parser.add_argument("--output", action="append", metavar="NAME", help="only these outputs")
    parser.add_argument(
        "--output-dir", type=Path, help="save each output as NAME.npy here (else print them)"
    )
    return parser
