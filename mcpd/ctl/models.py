"""`mcpctl models`: every configured model, its state, its tensors and the board energy per
inference attributed to it (mcpd/governor/energy.py)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from mcpd.client import Client, ServerError
from mcpd.ctl.common import add_socket, connected
from mcpd.subcommands import Subcommands


def _tensors(tensors: list[dict[str, Any]]) -> str:
    return ", ".join(
        f"{t['name']} {t['datatype']}[{','.join(str(d) for d in t['shape'])}]" for t in tensors
    )


def _optimized(summary: dict[str, Any]) -> str:
    """`int8 (openvino), 2.41x faster, cosine 0.9987, top-1 99.2 %` (what `optimize` swapped
    in, and the runtime it was measured in and serves through)."""
    runtime = summary.get("runtime")  # absent from an older daemon's status
    parts = [summary["precision"] + (f" ({runtime})" if runtime else "")]
    if summary.get("speedup"):
        parts.append(f"{summary['speedup']:.2f}x faster")
    parts.append(f"cosine {summary['cosine_min']:.4f}")
    if summary.get("top1_agreement") is not None:
        parts.append(f"top-1 {summary['top1_agreement'] * 100:.1f} %")
    return ", ".join(parts)


def _openvino(doc: dict[str, Any]) -> str:
    """`OpenVINO CPU, bf16 (the device runs BF16, FP32, FP16, INT8)`"""
    return (
        f"OpenVINO {doc['device']}, {doc['precision']} "
        f"(the device runs {', '.join(doc['capabilities'])})"
    )


@connected
def run(args: argparse.Namespace, client: Client) -> int:
    rows = []
    for entry in client.models():
        row = dict(entry)
        if entry["state"] == "READY":
            try:
                row["metadata"] = client.model_metadata(entry["name"])
            except ServerError as exc:  # unloaded between the two calls
                row["reason"] = exc.message
        rows.append(row)
    document = client.status()
    inference = document.get("inference", {})
    estimated = document.get("power_source") == "estimate"
    for row in rows:
        row["optimized"] = inference.get(row["name"], {}).get("optimized")
        row["joules_per_inference"] = inference.get(row["name"], {}).get("joules_per_inference")
        row["openvino"] = inference.get(row["name"], {}).get("openvino")
        row["power_estimated"] = estimated
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print("no models configured ([[models]] in the config)")
    for row in rows:
        print(f"{row['name']}  {row['state']}" + (f"  {row['reason']}" if row["reason"] else ""))
        meta = row.get("metadata")
        if meta:
            print(f"  platform {meta['platform']}")
            print(f"  inputs   {_tensors(meta['inputs'])}")
            print(f"  outputs  {_tensors(meta['outputs'])}")
        if row["openvino"]:
            print(f"  runs on  {_openvino(row['openvino'])}")
        if row["optimized"]:
            print(f"  serving  {_optimized(row['optimized'])}")
        if row["joules_per_inference"] is not None:
            note = " (power estimated)" if estimated else ""
            print(f"  energy   {row['joules_per_inference']:.4g} J per inference{note}")
    return 0


def add_parser(commands: Subcommands) -> argparse.ArgumentParser:
    parser = commands.add_parser("models", help="configured models, their state and tensors")
    add_socket(parser)
    parser.add_argument("--json", action="store_true")
    return parser
