"""Measuring a candidate: its outputs on the validation samples against the reference's (cosine
per output, max abs error, top-1 agreement for classification-shaped outputs) and its latency
(median of repeated runs at batch 1 on this machine's CPU). A model file runs as mcpd serves it:
an OpenVINO IR (.xml) compiled by the openvino backend's own open_compiled (at the precision
stored in it, one stream), any other file in an onnxruntime CPU session; so one timing can set
candidates of both runtimes side by side."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

from mcpd.optimize.interface import TensorSpec
from mcpd.optimize.samples import Sample

Outputs = list[list[np.ndarray]]  # per sample, per output
Runner = Callable[[Sample], list[np.ndarray]]
"""One inference of a model: a sample in, its outputs in the model's order out."""


@dataclass(frozen=True)
class Accuracy:
    cosine: dict[str, float]  # per float output: mean over samples of the per-sample cosine
    max_abs: float
    top1_agreement: float | None  # None: no classification-shaped output

    @property
    def cosine_min(self) -> float:
        return min(self.cosine.values(), default=1.0)

    def meets(self, min_cosine: float, min_top1: float) -> bool:
        top1_ok = self.top1_agreement is None or self.top1_agreement >= min_top1
        return self.cosine_min >= min_cosine and top1_ok


def session(
    path: Path,
    threads: int = 0,
    config: Mapping[str, str] | None = None,
    level: ort.GraphOptimizationLevel | None = None,
) -> ort.InferenceSession:
    """A CPU session as mcpd times it; `config` (session config entries) and `level` (graph
    optimization) are for benchmarks that compare session settings."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.log_severity_level = 3  # quantized graphs make onnxruntime chatty about fusions
    # Idle pool threads spin for a while after each run by default; with several sessions timed
    # in turn, one model's spinning threads steal the cores from the next (measured here: 5 ms
    # models timed at 20–40 ms).
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    for key, value in (config or {}).items():
        options.add_session_config_entry(key, value)
    if level is not None:
        options.graph_optimization_level = level
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def runner(path: Path, device: str = "CPU") -> Runner:
    """The model file ready to run: an .xml through OpenVINO on `device`, else onnxruntime."""
    if path.suffix.lower() == ".xml":
        return _openvino(path, device)
    run = session(path).run
    return lambda sample: list(run(None, sample))


def _openvino(path: Path, device: str) -> Runner:
    from mcpd.config import OpenVinoOptions
    from mcpd.serving.backends.openvino import open_compiled

    # Precision "auto": the one the optimizer stored in the IR, as serving reads it.
    request = open_compiled(path, OpenVinoOptions(device=device)).create_infer_request()
    # Inputs by name; outputs are copies (the request's own are overwritten by its next run).
    return lambda sample: list(request.infer(sample).to_tuple())


def outputs(path: Path, samples: list[Sample], device: str = "CPU") -> Outputs:
    run = runner(path, device)
    return [run(sample) for sample in samples]


def latencies_ms(
    paths: list[Path],
    sample: Sample,
    rounds: int = 20,
    budget_s: float = 20.0,
    clock: Callable[[], float] = time.perf_counter,
    device: str = "CPU",
) -> list[float]:
    """Median latency of each model at batch 1, measured side by side (side_by_side_ms)."""
    runners = [runner(path, device) for path in paths]
    return side_by_side_ms(runners, sample, rounds, budget_s, clock)


def side_by_side_ms(
    runners: Sequence[Callable[[Sample], object]],
    sample: Sample,
    rounds: int = 20,
    budget_s: float = 20.0,
    clock: Callable[[], float] = time.perf_counter,
) -> list[float]:
    """Median latency of each runner: one run of each per round (after two warm-up runs each),
    so the machine's noise falls on all of them alike, starting each round one runner further on,
    so that none always runs right after the same one (in a fixed order a bf16 IR timed after
    onnxruntime's FP32 ran 8-11 % slower than the same IR timed after it). At least 5 rounds; more
    until `rounds` or `budget_s`."""
    for run in runners:
        for _ in range(2):
            run(sample)
    times: list[list[float]] = [[] for _ in runners]
    deadline = clock() + budget_s
    while len(times[0]) < rounds and (len(times[0]) < 5 or clock() < deadline):
        first = len(times[0]) % len(runners)
        for index in [*range(first, len(runners)), *range(first)]:
            start = clock()
            runners[index](sample)
            times[index].append(clock() - start)
    return [statistics.median(spent) * 1000 for spent in times]


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    """Cosine similarity of two tensors; two all-zero tensors agree, one all-zero tensor does not."""
    x = a.astype(np.float64).ravel()
    y = b.astype(np.float64).ravel()
    norms = float(np.linalg.norm(x) * np.linalg.norm(y))
    if norms == 0.0:
        return 1.0 if np.array_equal(x, y) else 0.0
    return float(np.dot(x, y) / norms)


def classification_shaped(spec: TensorSpec) -> bool:
    """Scores per class: [N, C] or a sequence of them [N, T, C], C >= 2 (argmax on the last axis)."""
    if spec.dtype is None or spec.dtype.kind != "f" or spec.shape is None:
        return False
    last = spec.shape[-1] if spec.shape else None
    return len(spec.shape) in (2, 3) and (not isinstance(last, int) or last >= 2)


def compare(reference: Outputs, candidate: Outputs, specs: tuple[TensorSpec, ...]) -> Accuracy:
    cosines: dict[str, float] = {}
    max_abs = 0.0
    agree: list[float] = []
    for index, spec in enumerate(specs):
        ref = [sample[index] for sample in reference]
        got = [sample[index] for sample in candidate]
        if spec.dtype is not None and spec.dtype.kind == "f":
            cosines[spec.name] = float(
                np.mean([cosine(a, b) for a, b in zip(ref, got, strict=True)])
            )
            max_abs = max(
                max_abs,
                *(
                    float(np.max(np.abs(a.astype(np.float64) - b), initial=0.0))
                    for a, b in zip(ref, got, strict=True)
                ),
            )
            if classification_shaped(spec):
                agree.extend(
                    float(np.mean(np.argmax(a, axis=-1) == np.argmax(b, axis=-1)))
                    for a, b in zip(ref, got, strict=True)
                )
        else:  # integer or boolean outputs (labels, indices): they must agree exactly
            agree.extend(float(np.mean(a == b)) for a, b in zip(ref, got, strict=True))
    return Accuracy(cosines, max_abs, float(np.mean(agree)) if agree else None)
