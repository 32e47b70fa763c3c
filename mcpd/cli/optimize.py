"""`mcpd optimize`: build the fastest model that still answers the same.

Only the command's options are here: the optimizer imports onnx, onnxruntime.quantization,
OpenVINO, NNCF and numpy, which the daemon's governing code must never load, so they are imported
when it runs.
"""

from __future__ import annotations

import argparse

from mcpd.optimize import PRECISIONS, TARGETS
from mcpd.subcommands import Subcommands


def run(args: argparse.Namespace) -> int:
    from mcpd.optimize.command import run

    return run(args)


def add_parser(commands: Subcommands) -> argparse.ArgumentParser:
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
    parser.set_defaults(default_level="error")
    return parser
