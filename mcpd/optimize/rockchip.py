"""`--target rk3588` (and the other Rockchip NPUs rknn-toolkit2 converts for): build a `.rknn`
with rknn-toolkit2 from the same calibration samples and check it in the toolkit's simulator
against onnxruntime FP32 on the held-out samples.

rknn-toolkit2 pins old numpy/onnx/protobuf/torch, so it never runs in mcpd's environment: it runs
from its own virtual environment (`MCPD_RKNN_PYTHON`, else ~/.local/share/mcpd/rknn-toolkit2),
through rknn_worker.py and a job file (this module is not named rknn.py: the worker's folder is on
its path, and would shadow the toolkit's `rknn` package). Candidates, in order: INT8 with the `normal` algorithm,
INT8 with `mmse` (slower to build, often more accurate), FP16 (no quantization); the first that
meets the gate is written. The NPU's speed is not measured (the simulator is not the NPU). Asked for,
each build also runs the toolkit's per-layer accuracy analysis on the first few held-out samples
(layers.py reads it)."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mcpd.optimize import layers
from mcpd.optimize.interface import Interface, OptimizeError
from mcpd.optimize.measure import Accuracy, Outputs, compare
from mcpd.optimize.samples import Sample

DEFAULT_VENV = Path.home() / ".local/share/mcpd/rknn-toolkit2"
WORKER = Path(__file__).with_name("rknn_worker.py")
ALGORITHMS: tuple[tuple[str, str | None], ...] = (
    ("int8", "normal"),
    ("int8", "mmse"),
    ("fp16", None),
)
ANALYSIS_FAILED = 3  # rknn_worker.py's exit status when accuracy_analysis fails


@dataclass(frozen=True)
class Build:
    label: str
    precision: str
    path: Path
    accuracy: Accuracy | None  # None: the toolkit could not build or run it
    layers: tuple[layers.Layer, ...] | None = None  # the per-layer analysis, when asked


def toolkit_python() -> Path:
    """The toolkit environment's python, or an error that says how to install it."""
    explicit = os.environ.get("MCPD_RKNN_PYTHON")
    python = Path(explicit) if explicit else DEFAULT_VENV / "bin" / "python"
    probe = (
        subprocess.run([str(python), "-c", "import rknn.api"], capture_output=True, check=False)
        if python.exists()
        else None
    )
    if probe is None or probe.returncode != 0:
        raise OptimizeError(
            f"--target rk3588 needs rknn-toolkit2 in its own virtual environment ({python} has "
            f"none): python3 -m venv {DEFAULT_VENV} && {DEFAULT_VENV}/bin/pip install "
            "rknn-toolkit2 (x86_64 or aarch64 host), or set MCPD_RKNN_PYTHON to its python"
        )
    return python


def _write_samples(samples: list[Sample], folder: Path) -> list[list[str]]:
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for index, sample in enumerate(samples):
        row = []
        for name, array in sample.items():
            path = folder / f"{index:04d}-{name.replace('/', '_')}.npy"
            np.save(path, array)
            row.append(str(path))
        rows.append(row)
    return rows


def convert(
    model: Path,
    spec: Interface,
    calibration: list[Sample],
    validation: list[Sample],
    reference: Outputs,
    target: str,
    workdir: Path,
    gate: Callable[[Accuracy], bool],
    progress: Callable[[str], None],
    python: Path,
    precisions: tuple[str, ...] = ("int8", "fp16"),
    layer_samples: int = 0,
) -> list[Build]:
    """Candidates, built until one meets the gate, each with the toolkit's per-layer analysis on
    the first `layer_samples` held-out samples (none: 0). Raises OptimizeError when an analysis
    that was asked for fails or cannot be read."""
    dataset = workdir / "dataset.txt"
    dataset.write_text(
        "".join(" ".join(row) + "\n" for row in _write_samples(calibration, workdir / "cal"))
    )
    held_out = _write_samples(validation, workdir / "val")
    names = [s.name for s in spec.inputs]
    shapes = [list(calibration[0][name].shape) for name in names]
    results: list[Build] = []
    for precision, algorithm in (a for a in ALGORITHMS if a[0] in precisions):
        label = f"rknn {precision}" + (f" {algorithm}" if algorithm else "")
        progress(f"building {label} for {target} (rknn-toolkit2)")
        out = workdir / f"{model.stem}.{target}.{precision}.{algorithm or 'float'}.rknn"
        answers = workdir / f"answers-{precision}-{algorithm}"
        answers.mkdir()
        job = workdir / f"job-{precision}-{algorithm}.json"
        analysis = workdir / f"analysis-{precision}-{algorithm}"
        job.write_text(
            json.dumps(
                {
                    "model": str(model),
                    "target": target,
                    "quantized_algorithm": algorithm,
                    "input_names": names,
                    "input_shapes": shapes,
                    "dataset": str(dataset),
                    "output": str(out),
                    "validation": held_out,
                    "results": str(answers),
                    "analysis": {"samples": held_out[:layer_samples], "folder": str(analysis)}
                    if layer_samples
                    else None,
                }
            )
        )
        run = subprocess.run(
            [str(python), str(WORKER), str(job)], capture_output=True, text=True, check=False
        )
        lines = run.stderr.strip().splitlines()
        why = lines[-1] if lines else f"exit status {run.returncode}"
        if run.returncode == ANALYSIS_FAILED:
            raise OptimizeError(f"{label}: {why}")
        if run.returncode != 0:
            progress(f"{label}: failed ({why}); skipped")
            results.append(Build(label, precision, out, None))
            continue
        got = []
        for index in range(len(validation)):
            with np.load(answers / f"{index}.npz") as archive:
                got.append([archive[f"arr_{i}"] for i in range(len(archive.files))])
        accuracy = compare(reference, got, spec.outputs)
        analysed = layers.read(analysis, len(held_out[:layer_samples])) if layer_samples else None
        results.append(Build(label, precision, out, accuracy, analysed))
        ok = gate(accuracy)
        progress(
            f"{label}: cosine {accuracy.cosine_min:.4f} in the simulator — "
            f"{'meets' if ok else 'below'} the gate"
        )
        if ok:
            break
    return results
