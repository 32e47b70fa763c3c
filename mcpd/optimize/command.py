"""`mcpd optimize MODEL --calibration DIR --out DIR`: check every input first (exit 2 with one
line naming the problem), search in a scratch folder, then write the chosen model into --out by
a temporary file and a rename, so --out never holds a half-written model."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mcpd.optimize.interface import OptimizeError

if TYPE_CHECKING:
    from mcpd.optimize.layers import Layer

LAYERS_SHOWN = 10  # worst layers in the --json document (5 in the table)


def _write_model(source: Path, out: Path, name: str) -> Path:
    """Write the model to out/name; an OpenVINO IR's weights (<name>.bin) first, so that an .xml
    in --out always has its weights beside it."""
    if source.suffix != ".xml":
        return _write(source, out, name)
    weights = _write(source.with_suffix(".bin"), out, Path(name).with_suffix(".bin").name)
    try:
        return _write(source, out, name)
    except BaseException:
        weights.unlink()
        raise


def _write(source: Path, out: Path, name: str) -> Path:
    """Copy `source` to out/name through a temporary file in `out` and a rename."""
    out.mkdir(parents=True, exist_ok=True)
    target = out / name
    fd, temporary = tempfile.mkstemp(dir=out, prefix=f".{name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o644)  # mkstemp's 0600 would keep a serving daemon's user out
        with os.fdopen(fd, "wb") as file, source.open("rb") as model:
            while chunk := model.read(1 << 20):
                file.write(chunk)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, target)
    except BaseException:
        os.unlink(temporary)
        raise
    directory = os.open(out, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
    return target


def _ms(value: float | None) -> float | None:
    # Four significant digits: a 0.09 ms model rounded to whole microseconds would report a
    # latency ratio several percent away from its speedup.
    return None if value is None else float(f"{value:.4g}")


def _ratio(reference: float | None, candidate: float | None) -> float | None:
    return round(reference / candidate, 3) if reference and candidate else None


def _layers(analysed: Sequence[Layer] | None, count: int) -> list[dict[str, Any]] | None:
    from mcpd.optimize.layers import worst_first

    if analysed is None:
        return None
    return [
        {
            "name": layer.name,
            "op_type": layer.op_type,
            "single_cosine": layer.single_cosine,
            "single_euclidean": layer.single_euclidean,
            "entire_cosine": layer.entire_cosine,
            "entire_euclidean": layer.entire_euclidean,
            "note": layer.note,
        }
        for layer in worst_first(analysed)[:count]
    ]


def document(model: Path, written: Path, target: str, outcome: Any) -> dict[str, Any]:
    """The --json document (keys are only ever added)."""
    chosen = outcome.chosen
    ref = outcome.reference_ms
    return {
        "model": str(model),
        "output": str(written),
        "target": target,
        "runtime": chosen.runtime,
        "precision": chosen.precision,
        "speedup": _ratio(ref, chosen.latency_ms),
        "latency_ms": {
            "reference": _ms(ref),
            "optimized": _ms(chosen.latency_ms),
        },
        "accuracy": {
            "cosine_min": round(chosen.accuracy.cosine_min, 6),
            "max_abs": chosen.accuracy.max_abs,
            "top1_agreement": chosen.accuracy.top1_agreement,
        },
        "fp32_nodes": list(chosen.fp32_nodes),
        "candidates": [
            {
                "name": c.label,
                "runtime": c.runtime,
                "precision": c.precision,
                "latency_ms": _ms(c.latency_ms),
                "speedup": _ratio(ref, c.latency_ms),
                "cosine_min": round(c.accuracy.cosine_min, 6),
                "max_abs": c.accuracy.max_abs,
                "top1_agreement": c.accuracy.top1_agreement,
                "fp32_nodes": len(c.fp32_nodes),
                "accepted": c.accepted,
                "chosen": c is chosen,
                "layers": _layers(c.layers, LAYERS_SHOWN),
                "seconds": None if c.seconds is None else round(c.seconds, 1),
            }
            for c in outcome.candidates
        ],
        "skipped": [
            {"name": s.label, "reason": s.reason, "speedup": s.speedup} for s in outcome.skipped
        ],
        "sensitivity": [
            {"node": s.node, "op_type": s.op_type, "added_error": s.added_error}
            for s in outcome.sensitivity[:10]
        ],
        "layers": _layers(chosen.layers, LAYERS_SHOWN),
    }


def table(doc: dict[str, Any]) -> str:
    def cell(value: float | None, fmt: str) -> str:
        width = int(fmt.split(".")[0] or 0)
        return "-".rjust(width) if value is None else format(value, fmt)

    lines = [
        f"{'candidate':<44} {'runtime':<11} {'ms':>8} {'speedup':>8} {'cosine':>8} "
        f"{'max abs':>9} {'top-1':>6} {'s':>6}",
    ]
    for c in doc["candidates"]:
        mark = "*" if c["chosen"] else ("" if c["accepted"] else " (below gate)")
        lines.append(
            f"{c['name']:<44} {c['runtime']:<11} {cell(c['latency_ms'], '8.2f')} "
            f"{cell(c['speedup'], '7.2f')}{'x' if c['speedup'] is not None else ' '} "
            f"{c['cosine_min']:8.4f} {c['max_abs']:9.3g} {cell(c['top1_agreement'], '6.3f')} "
            f"{cell(c['seconds'], '6.1f')}{mark}"
        )
    lines += [f"skipped {s['name']}: {s['reason']}" for s in doc["skipped"]]
    for c in doc["candidates"]:
        if c["layers"]:
            lines.append(f"worst layers of {c['name']} (single-layer cosine, entire, note):")
            lines.extend(
                f"  {'[' + layer['op_type'] + '] ' + layer['name']:<60} "
                f"{cell(layer['single_cosine'], '8.5f')} {cell(layer['entire_cosine'], '8.5f')}"
                f"{'  ' + layer['note'] if layer['note'] else ''}"
                for layer in c["layers"][:5]
            )
    speedup = "" if doc["speedup"] is None else f", {doc['speedup']:.2f}x"
    lines.append(f"wrote {doc['output']} ({doc['precision']}, {doc['runtime']}{speedup})")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except OptimizeError as exc:
        print(f"mcpd optimize: {exc}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    from mcpd.optimize import interface, samples
    from mcpd.optimize.measure import outputs
    from mcpd.optimize.options import from_args
    from mcpd.optimize.search import Search

    options = from_args(args)
    model_path = Path(args.model)
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise OptimizeError(f"--out {out}: exists and is not a folder")
    model = interface.load(model_path)
    spec = interface.interface(model)
    preprocess = (
        samples.Preprocess.parse(args.preprocess, "--preprocess") if args.preprocess else None
    )
    found = samples.load(Path(args.calibration), spec.inputs, preprocess)
    calibration, validation = samples.split(found)
    try:
        outputs(model_path, validation[:1])
    except Exception as exc:  # onnxruntime's Fail, InvalidArgument, NotImplemented, ...
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise OptimizeError(f"{model_path}: onnxruntime cannot run it ({first})") from None
    if "openvino" in options.runtimes:
        try:
            interface.openvino_interface(model_path)
        except OptimizeError as exc:
            if args.target == "openvino" or args.runtime is not None:
                raise
            # OpenVINO was only taken because it is installed: the model still gets onnxruntime's.
            print(f"mcpd optimize: onnxruntime only: {exc}", file=sys.stderr)
            options = dataclasses.replace(options, runtimes=("onnxruntime",))
    started = time.monotonic()

    def progress(line: str) -> None:
        print(f"[{time.monotonic() - started:6.1f} s] {line}", file=sys.stderr, flush=True)

    with tempfile.TemporaryDirectory(prefix="mcpd-optimize-") as scratch:
        search = Search(
            model_path, model, calibration, validation, options, Path(scratch), progress
        )
        outcome = search.run()
        name = f"{model_path.stem}.{outcome.chosen.precision}{outcome.chosen.path.suffix}"
        written = _write_model(outcome.chosen.path, out, name)
    doc = document(model_path, written, options.target, outcome)
    print(json.dumps(doc, indent=2) if args.json else table(doc))
    return 0
