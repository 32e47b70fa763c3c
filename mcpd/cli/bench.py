"""`mcpd bench`: a throughput-latency sweep over model files, runtimes, batch sizes and threads.

Only the command's options are here: the sweep imports numpy and the runtimes, which the daemon's
governing code must never load, so they are imported when it runs.
"""

from __future__ import annotations

import argparse

from mcpd.subcommands import Subcommands


def run(args: argparse.Namespace) -> int:
    from mcpd.optimize.sweep import run

    return run(args)


def add_parser(commands: Subcommands) -> argparse.ArgumentParser:
    parser = commands.add_parser(
        "bench",
        help="throughput-latency sweep (model files x runtime x batch x threads, OpenVINO's "
        "precisions and streams) and its Pareto frontier",
    )
    parser.add_argument(
        "models",
        nargs="+",
        metavar="MODEL",
        help="ONNX files (run through onnxruntime and OpenVINO) or OpenVINO IR (.xml), e.g. the "
        "original and what mcpd optimize wrote",
    )
    parser.add_argument("--batch", default="1,2,4,8", help="batch sizes (default 1,2,4,8)")
    parser.add_argument(
        "--threads", default="1,2", help="threads per model, every runtime (default 1,2)"
    )
    parser.add_argument(
        "--runtime",
        metavar="R,R",
        help="onnxruntime, openvino (default: each installed one that reads the file)",
    )
    parser.add_argument(
        "--precision",
        default="f32,bf16",
        help="OpenVINO's inference precisions: auto, f32, bf16, f16 (default f32,bf16; one the "
        "CPU lacks is reported as not applicable)",
    )
    parser.add_argument(
        "--streams",
        default="1,2",
        help="OpenVINO's streams, each an inference in flight, up to the threads (default 1,2)",
    )
    parser.add_argument("--seconds", type=float, default=1.0, help="per point (default 1)")
    parser.add_argument("--json", action="store_true", help="one JSON document on stdout")
    parser.add_argument("--plot", metavar="FILE.png", help="plot the sweep (needs matplotlib)")
    parser.add_argument(
        "--caps",
        metavar="F,F",
        help="also sweep frequency caps: each domain at these fractions of its maximum, put back "
        "afterwards (needs root; stops at --max-temp)",
    )
    parser.add_argument("--sysfs-root", default="/", help="the board's root (default /)")
    parser.add_argument(
        "--max-temp",
        type=float,
        default=85.0,
        help="stop a caps sweep when the board reaches this temperature (default 85)",
    )
    parser.set_defaults(default_level="error")
    return parser
