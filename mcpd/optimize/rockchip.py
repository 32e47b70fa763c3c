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


@dataclass(frozen=True)
class _Job:
    """What every candidate's build is given: the samples written where the worker reads them."""

    model: Path
    target: str
    workdir: Path
    input_names: list[str]
    input_shapes: list[list[int]]
    dataset: Path
    """The calibration samples' list, one line of .npy files per sample (rknn-toolkit2's format)."""
    held_out: list[list[str]]
    layer_samples: int

    @classmethod
    def write(
        cls,
        model: Path,
        spec: Interface,
        calibration: list[Sample],
        validation: list[Sample],
        target: str,
        workdir: Path,
        layer_samples: int,
    ) -> _Job:
        dataset = workdir / "dataset.txt"
        dataset.write_text(
            "".join(" ".join(row) + "\n" for row in _write_samples(calibration, workdir / "cal"))
        )
        names = [s.name for s in spec.inputs]
        return cls(
            model,
            target,
            workdir,
            names,
            [list(calibration[0][name].shape) for name in names],
            dataset,
            _write_samples(validation, workdir / "val"),
            layer_samples,
        )

    def describe(self, out: Path, algorithm: str | None, answers: Path, analysis: Path) -> str:
        """The job file rknn_worker.py reads for one candidate."""
        analysed = self.held_out[: self.layer_samples]
        return json.dumps(
            {
                "model": str(self.model),
                "target": self.target,
                "quantized_algorithm": algorithm,
                "input_names": self.input_names,
                "input_shapes": self.input_shapes,
                "dataset": str(self.dataset),
                "output": str(out),
                "validation": self.held_out,
                "results": str(answers),
                "analysis": {"samples": analysed, "folder": str(analysis)}
                if self.layer_samples
                else None,
            }
        )


def _run_worker(python: Path, job: Path) -> tuple[int, str]:
    """rknn_worker.py's exit status, and why it failed (its last line on stderr)."""
    run = subprocess.run(
        [str(python), str(WORKER), str(job)], capture_output=True, text=True, check=False
    )
    lines = run.stderr.strip().splitlines()
    return run.returncode, lines[-1] if lines else f"exit status {run.returncode}"


def _read_answers(folder: Path, count: int) -> list[list[np.ndarray]]:
    """The outputs the simulator gave for each held-out sample, as the worker saved them."""
    got = []
    for index in range(count):
        with np.load(folder / f"{index}.npz") as archive:
            got.append([archive[f"arr_{i}"] for i in range(len(archive.files))])
    return got


def _build(
    job: _Job,
    precision: str,
    algorithm: str | None,
    python: Path,
    reference: Outputs,
    spec: Interface,
    progress: Callable[[str], None],
) -> Build:
    """One candidate built and run on the held-out samples in the simulator (its accuracy None
    when the toolkit could not). Raises OptimizeError when its per-layer analysis fails."""
    label = f"rknn {precision}" + (f" {algorithm}" if algorithm else "")
    progress(f"building {label} for {job.target} (rknn-toolkit2)")
    workdir = job.workdir
    out = workdir / f"{job.model.stem}.{job.target}.{precision}.{algorithm or 'float'}.rknn"
    answers = workdir / f"answers-{precision}-{algorithm}"
    answers.mkdir()
    description = workdir / f"job-{precision}-{algorithm}.json"
    analysis = workdir / f"analysis-{precision}-{algorithm}"
    description.write_text(job.describe(out, algorithm, answers, analysis))
    status, why = _run_worker(python, description)
    if status == ANALYSIS_FAILED:
        raise OptimizeError(f"{label}: {why}")
    if status != 0:
        progress(f"{label}: failed ({why}); skipped")
        return Build(label, precision, out, None)
    accuracy = compare(reference, _read_answers(answers, len(job.held_out)), spec.outputs)
    analysed = (
        layers.read(analysis, len(job.held_out[: job.layer_samples])) if job.layer_samples else None
    )
    return Build(label, precision, out, accuracy, analysed)


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
    job = _Job.write(model, spec, calibration, validation, target, workdir, layer_samples)
    results: list[Build] = []
    for precision, algorithm in (a for a in ALGORITHMS if a[0] in precisions):
        built = _build(job, precision, algorithm, python, reference, spec, progress)
        results.append(built)
        if built.accuracy is None:
            continue
        ok = gate(built.accuracy)
        progress(
            f"{built.label}: cosine {built.accuracy.cosine_min:.4f} in the simulator — "
            f"{'meets' if ok else 'below'} the gate"
        )
        if ok:
            break
    return results
