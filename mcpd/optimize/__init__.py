"""`mcpd optimize`: make a model fast for its board and prove it still answers the same.

This module only registers the command: the optimizer imports onnx, onnxruntime.quantization,
OpenVINO, NNCF and numpy, which the daemon's governing code must never load, so they are imported
when it runs.
"""

from __future__ import annotations

import argparse
from typing import Any

ROCKCHIP = ("rk3588", "rk3576", "rk3568", "rk3566", "rk3562")  # rknn-toolkit2's NPUs
TARGETS = ("cpu", "openvino", "cuda", "tensorrt", *ROCKCHIP)
PRECISIONS = ("auto", "fp32", "bf16", "fp16", "int8", "int4")


def _run(args: argparse.Namespace) -> int:
    from mcpd.optimize.command import run

    return run(args)


def _bench(args: argparse.Namespace) -> int:
    from mcpd.optimize.sweep import run

    return run(args)


def add_parser(commands: Any) -> None:
    """Add `optimize` and `bench` to the `mcpd` command's subparsers."""
    parser = commands.add_parser(
        "optimize",
        help="build the fastest model that still answers the same (onnxruntime's and OpenVINO's "
        "INT8/INT4/BF16/FP16, measured)",
        description="Build candidates, measure latency and accuracy on held-out samples, and "
        "write the fastest one that meets the accuracy gate. Exit 2 on bad input.",
    )
    parser.add_argument("model", help="the ONNX model (FP32)")
    parser.add_argument(
        "--calibration",
        required=True,
        metavar="DIR",
        help="sample inputs: *.npy, *.npz or images (*.jpg, *.png)",
    )
    parser.add_argument("--out", required=True, metavar="DIR", help="folder for the written model")
    # Choices are checked by the command itself so that a bad one is one line and exit 2 like
    # every other bad input, not argparse's usage text.
    parser.add_argument("--target", default="cpu", help=f"{'|'.join(TARGETS)} (default cpu)")
    parser.add_argument(
        "--precision", default="auto", help=f"{'|'.join(PRECISIONS)} (default auto)"
    )
    parser.add_argument(
        "--runtime",
        metavar="R,R",
        help="--target cpu: onnxruntime, openvino (default: onnxruntime, and OpenVINO where it "
        "is installed on an x86 CPU)",
    )
    parser.add_argument(
        "--device",
        help="--target openvino: OpenVINO's device, CPU (default), GPU, GPU.1, NPU (GPU and NPU "
        "untested)",
    )
    parser.add_argument(
        "--min-cosine",
        type=float,
        default=0.98,
        help="lowest cosine to the original per output (default 0.98)",
    )
    parser.add_argument(
        "--min-top1",
        type=float,
        default=0.97,
        help="lowest top-1 agreement for classification-shaped outputs (default 0.97)",
    )
    parser.add_argument(
        "--preprocess",
        metavar="SPEC",
        help="for images: 'size=H,W order=rgb mean=R,G,B std=R,G,B layout=nchw "
        "scale=1/255' (else DIR/preprocess.toml)",
    )
    parser.add_argument(
        "--budget",
        type=float,
        default=150.0,
        metavar="SECONDS",
        help="time for the optional search steps (default 150)",
    )
    parser.add_argument(
        "--layer-analysis",
        action="store_true",
        help="NPU targets: rknn-toolkit2's per-layer accuracy analysis of each build (its worst "
        "layers in the table and in --json's 'layers')",
    )
    parser.add_argument("--json", action="store_true", help="one JSON document on stdout")
    # onnxruntime's quantizer logs advice to the root logger at warning level; progress is our own.
    parser.set_defaults(func=_run, default_level="error")

    bench = commands.add_parser(
        "bench",
        help="throughput-latency sweep (model files x runtime x batch x threads, OpenVINO's "
        "precisions and streams) and its Pareto frontier",
    )
    bench.add_argument(
        "models",
        nargs="+",
        metavar="MODEL",
        help="ONNX files (run through onnxruntime and OpenVINO) or OpenVINO IR (.xml), e.g. the "
        "original and what mcpd optimize wrote",
    )
    bench.add_argument("--batch", default="1,2,4,8", help="batch sizes (default 1,2,4,8)")
    bench.add_argument(
        "--threads", default="1,2", help="threads per model, every runtime (default 1,2)"
    )
    bench.add_argument(
        "--runtime",
        metavar="R,R",
        help="onnxruntime, openvino (default: each installed one that reads the file)",
    )
    bench.add_argument(
        "--precision",
        default="f32,bf16",
        help="OpenVINO's inference precisions: auto, f32, bf16, f16 (default f32,bf16; one the "
        "CPU lacks is reported as not applicable)",
    )
    bench.add_argument(
        "--streams",
        default="1,2",
        help="OpenVINO's streams, each an inference in flight, up to the threads (default 1,2)",
    )
    bench.add_argument("--seconds", type=float, default=1.0, help="per point (default 1)")
    bench.add_argument("--json", action="store_true", help="one JSON document on stdout")
    bench.add_argument("--plot", metavar="FILE.png", help="plot the sweep (needs matplotlib)")
    bench.add_argument(
        "--caps",
        metavar="F,F",
        help="also sweep frequency caps: each domain at these fractions of its maximum, put back "
        "afterwards (needs root; stops at --max-temp)",
    )
    bench.add_argument("--sysfs-root", default="/", help="the board's root (default /)")
    bench.add_argument(
        "--max-temp",
        type=float,
        default=85.0,
        help="stop a caps sweep when the board reaches this temperature (default 85)",
    )
    bench.set_defaults(func=_bench, default_level="error")
