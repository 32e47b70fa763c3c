"""The search: build candidates cheapest first, measure each against the original on held-out
samples, and choose the fastest one that meets the accuracy gate. The FP32 graph-optimized model
is always a candidate, so the result is never worse than the input.

Order and budget (Entropy calibration alone took minutes on real models): FP32; INT8 MinMax in
the variants that cost only a quantization pass once the ranges are cached (U8S8/S8S8,
with and without pre-processing); if none meets the gate, per-layer sensitivity and INT8 with the
most sensitive nodes kept in FP32 (1, 2, 4, … nodes); then Percentile and Entropy calibration
while the budget lasts; INT4 where large MatMul weights exist; FP16 for GPU targets."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import onnx

from mcpd.optimize import candidates, rockchip
from mcpd.optimize.candidates import Int8Recipe
from mcpd.optimize.interface import (
    Interface,
    OptimizeError,
    check_same,
    interface,
    restore_interface,
)
from mcpd.optimize.layers import Layer, describe, worst_first
from mcpd.optimize.measure import Accuracy, Outputs, compare, latencies_ms, outputs
from mcpd.optimize.samples import Sample
from mcpd.optimize.sensitivity import Sensitivity, rank

GPU_TARGETS = ("cuda", "tensorrt")
# GPU preference where latency cannot be measured here: the lowest precision that is accurate.
GPU_RANK = {"int8": 0, "fp16": 1, "int4": 2, "fp32": 3}


@dataclass(frozen=True)
class Options:
    target: str = "cpu"
    precision: str = "auto"
    min_cosine: float = 0.98
    min_top1: float = 0.97
    budget_s: float = 150.0
    toolkit: Path | None = None  # rknn-toolkit2's python, for the Rockchip NPU targets
    layer_samples: int = 0  # the toolkit's per-layer analysis on this many held-out samples


@dataclass(frozen=True)
class Candidate:
    label: str
    precision: str
    path: Path
    latency_ms: float | None  # None: not measurable here (GPU targets)
    accuracy: Accuracy
    accepted: bool
    fp32_nodes: tuple[str, ...] = ()
    layers: tuple[Layer, ...] | None = None  # rknn-toolkit2's per-layer analysis, when asked


@dataclass(frozen=True)
class Outcome:
    reference_ms: float | None
    chosen: Candidate
    candidates: tuple[Candidate, ...]
    sensitivity: tuple[Sensitivity, ...]


class Search:
    def __init__(
        self,
        model_path: Path,
        original: onnx.ModelProto,
        calibration: list[Sample],
        validation: list[Sample],
        options: Options,
        workdir: Path,
        progress: Callable[[str], None] = lambda line: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.model_path = model_path
        self.original = original
        self.interface: Interface = interface(original)
        self.calibration = calibration
        self.validation = validation
        self.options = options
        self.workdir = workdir
        self.progress = progress
        self.clock = clock
        self.deadline = 0.0
        self.results: list[Candidate] = []
        self.reference: Outputs = []
        self.reference_ms = 0.0
        self.sensitivity: tuple[Sensitivity, ...] = ()

    @property
    def measures_latency(self) -> bool:
        return self.options.target == "cpu"

    def _within_budget(self, what: str) -> bool:
        if self.clock() < self.deadline:
            return True
        self.progress(f"skipped {what}: search budget of {self.options.budget_s:.0f} s spent")
        return False

    def _evaluate(
        self, label: str, precision: str, path: Path, fp32_nodes: tuple[str, ...] = ()
    ) -> Candidate:
        model = onnx.load(str(path))
        restore_interface(model, self.original)
        onnx.save(model, str(path))
        check_same(interface(model), self.interface)
        got = outputs(path, self.validation)
        accuracy = compare(self.reference, got, self.interface.outputs)
        ok = accuracy.meets(self.options.min_cosine, self.options.min_top1)
        ms = None
        if self.measures_latency:  # beside the original, for the search's own decisions
            reference_ms, ms = latencies_ms([self.model_path, path], self.validation[0], 10, 5.0)
            ms = ms / reference_ms * self.reference_ms
        result = Candidate(label, precision, path, ms, accuracy, ok, fp32_nodes)
        self.results.append(result)
        verdict = "meets the gate" if ok else "below the gate"
        speed = "" if ms is None else f"{self.reference_ms / ms:.2f}x, "
        self.progress(f"{label}: {speed}cosine {accuracy.cosine_min:.4f} — {verdict}")
        return result

    def _file(self, label: str) -> Path:
        return self.workdir / f"{len(self.results):02d}-{label.replace(' ', '_')}.onnx"

    def _int8(self, source: Path, recipe: Int8Recipe) -> Candidate | None:
        if not self._within_budget(recipe.label):
            return None
        self.progress(f"building {recipe.label}")
        return self._attempt(
            recipe.label,
            "int8",
            lambda: candidates.int8(
                source, self._file(recipe.label), self.calibration, recipe, self.workdir
            ),
            recipe.exclude,
        )

    def _attempt(
        self,
        label: str,
        precision: str,
        build: Callable[[], Path],
        fp32_nodes: tuple[str, ...] = (),
    ) -> Candidate | None:
        """Build and evaluate one candidate; one that the toolkit cannot build or onnxruntime
        cannot run is reported and skipped, never fatal (the FP32 candidate remains)."""
        try:
            return self._evaluate(label, precision, build(), fp32_nodes)
        except Exception as exc:  # quantizers and sessions raise anything from odd graphs
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            self.progress(f"{label}: failed ({first}); skipped")
            return None

    def _search_int8(self) -> None:
        gpu = self.options.target in GPU_TARGETS
        self.progress("pre-processing (shape inference, graph optimization)")
        pre = candidates.preprocess(self.model_path, self.workdir / "preprocessed.onnx")
        raw = self.workdir / "named.onnx"
        named = onnx.load(str(self.model_path))
        candidates.name_nodes(named)
        onnx.save(named, str(raw))
        # TensorRT consumes S8S8 QDQ with symmetric activations only. On CPUs U8S8 is usually
        # the fast path (S8S8 measured 2x slower on AMD here), and QOperator sometimes beats QDQ:
        # all are measured, not assumed (docs/optimizer.md).
        base = (
            [Int8Recipe(activations="s8", symmetric=True)]
            if gpu
            else [
                Int8Recipe(activations="u8"),
                Int8Recipe(activations="s8"),
                Int8Recipe(activations="u8", operator_format=True),
                Int8Recipe(activations="u8", preprocessed=False),
            ]
        )
        tried: list[tuple[Int8Recipe, Candidate]] = []
        for recipe in base:
            built = self._int8(pre if recipe.preprocessed else raw, recipe)
            if built is not None:
                tried.append((recipe, built))
        if not tried:
            return
        # Mixed precision starts from the variant worth rescuing: the fastest one (CPU) when it
        # fails the gate, beats the original and no accepted variant is as fast; on GPU targets
        # the most accurate one when none is accepted.
        accepted = [c for _, c in tried if c.accepted]
        # Only pre-processed QDQ variants keep the node names and Q/DQ pairs sensitivity is
        # ranked by (quantize_static rewrites a raw graph itself; QOperator fuses nodes).
        rescuable = [t for t in tried if t[0].preprocessed and not t[0].operator_format]
        if not rescuable:
            return
        if self.measures_latency:
            recipe, start = min(rescuable, key=lambda t: t[1].latency_ms or math.inf)
            # Keeping layers in FP32 only slows a variant down: under `auto`, no rescue for one
            # that is not faster than the original already (an asked-for int8 is still sought).
            slower = self.options.precision == "auto" and (
                (start.latency_ms or math.inf) >= self.reference_ms
            )
            if start.accepted or slower or any(c.latency_ms == start.latency_ms for c in accepted):
                return
        else:
            if accepted:
                return
            recipe, start = max(rescuable, key=lambda t: t[1].accuracy.cosine_min)
        source = pre
        self.progress(f"per-layer sensitivity of {recipe.label}")
        self.sensitivity = tuple(rank(source, start.path, self.validation[:8]))
        count = 1
        while count <= len(self.sensitivity):
            keep = (n for s in self.sensitivity[:count] for n in s.keep_fp32)
            mixed = self._int8(source, replace(recipe, exclude=tuple(dict.fromkeys(keep))))
            if mixed is None or mixed.accepted:
                return
            count *= 2
        if accepted:
            return
        for method in ("percentile", "entropy"):
            found = self._int8(source, replace(recipe, method=method))
            if found is not None and found.accepted:
                return

    def run(self) -> Outcome:
        self.deadline = self.clock() + self.options.budget_s
        self.progress(
            f"reference: {self.model_path.name} on {len(self.validation)} held-out samples"
        )
        self.reference = outputs(self.model_path, self.validation)
        if self.options.toolkit is not None:
            return self._search_rknn(self.options.toolkit)
        if self.measures_latency:
            (self.reference_ms,) = latencies_ms([self.model_path], self.validation[0], 10, 5.0)
        gpu = self.options.target in GPU_TARGETS
        fp32 = candidates.graph_optimized(
            self.model_path, self._file("fp32"), "basic" if gpu else "extended"
        )
        self._evaluate("fp32 graph-optimized", "fp32", fp32)
        wanted = self.options.precision
        if wanted in ("auto", "int8"):
            self._search_int8()
        weights = candidates.int4_weights(self.original)
        if wanted == "int4" or (wanted == "auto" and not gpu and weights):
            if weights == 0:
                self.progress("int4: no MatMul with large constant weights to quantize")
            elif self._within_budget("int4"):
                self._attempt(
                    "int4 weight-only MatMulNBits",
                    "int4",
                    lambda: candidates.int4(self.model_path, self._file("int4")),
                )
        if wanted == "fp16" or (wanted == "auto" and gpu):
            self._attempt(
                "fp16", "fp16", lambda: candidates.fp16(self.model_path, self._file("fp16"))
            )
        reference_ms = self._time_all()
        chosen = self._choose(reference_ms)
        return Outcome(reference_ms, chosen, tuple(self.results), self.sensitivity)

    def _search_rknn(self, toolkit: Path) -> Outcome:
        def gate(accuracy: Accuracy) -> bool:
            return accuracy.meets(self.options.min_cosine, self.options.min_top1)

        built = rockchip.convert(
            self.model_path,
            self.interface,
            self.calibration,
            self.validation,
            self.reference,
            self.options.target,
            self.workdir,
            gate,
            self.progress,
            toolkit,
            ("int8", "fp16") if self.options.precision == "auto" else (self.options.precision,),
            self.options.layer_samples,
        )
        for b in built:
            if b.accuracy is not None:
                ok = gate(b.accuracy)
                self.results.append(
                    Candidate(b.label, b.precision, b.path, None, b.accuracy, ok, layers=b.layers)
                )
        accepted = [r for r in self.results if r.accepted]
        if not accepted:
            best = max(self.results, key=lambda r: r.accuracy.cosine_min, default=None)
            why = ""
            if best is not None:
                layer = (
                    f"; worst layer {describe(worst_first(best.layers)[0])}" if best.layers else ""
                )
                why = f" (best: {best.label}, cosine {best.accuracy.cosine_min:.4f}{layer})"
            raise OptimizeError(f"no {self.options.target} build met the accuracy gate{why}")
        chosen = min(accepted, key=lambda r: GPU_RANK[r.precision])
        return Outcome(None, chosen, tuple(self.results), ())

    def _time_all(self) -> float | None:
        """Latency of the original and every candidate, side by side (CPU targets only)."""
        if not self.measures_latency:
            return None
        self.progress(f"timing the original and {len(self.results)} candidates side by side")
        paths = [self.model_path, *(r.path for r in self.results)]
        reference, *timed = latencies_ms(paths, self.validation[0])
        self.results = [
            replace(r, latency_ms=ms) for r, ms in zip(self.results, timed, strict=True)
        ]
        return reference

    def _original(self, reference_ms: float | None) -> Candidate:
        exact = compare(self.reference, self.reference, self.interface.outputs)
        return Candidate("original (unchanged)", "fp32", self.model_path, reference_ms, exact, True)

    def _choose(self, reference_ms: float | None) -> Candidate:
        """The fastest accepted candidate if it beats the original (CPU); on GPU targets the
        lowest accepted precision; else the original itself, unchanged."""
        accepted = [r for r in self.results if r.accepted]
        if self.measures_latency:
            best = min(accepted, key=lambda r: r.latency_ms or math.inf, default=None)
            if best is not None and (best.latency_ms or math.inf) < (reference_ms or 0.0):
                return best
        elif accepted:
            return min(accepted, key=lambda r: GPU_RANK[r.precision])
        original = self._original(reference_ms)
        self.results.append(original)
        return original
