"""The search: build candidates cheapest first, measure each against the original on held-out
samples, and choose the fastest one that meets the accuracy gate. On the CPU the result is never
slower than the input (the original itself is the fallback).

Order and budget (Entropy calibration alone took minutes on real models; plan.py states the
rules): OpenVINO's float candidates (a compile each, seconds); onnxruntime's FP32 graph-optimized
model; OpenVINO's NNCF INT8, then its accuracy-aware INT8 when plain INT8 misses the gate
(openvino_steps.py); onnxruntime's INT8 variants, mixed precision, Percentile and Entropy
calibration and INT4 (onnxruntime_steps.py); FP16 for GPU targets. Under `auto` a step is
skipped when it cannot beat a candidate already accepted, and every optional step waits for the
budget. Each candidate is timed beside the original as it is built, and all side by side at the
end, whatever its runtime."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import onnx

from mcpd.optimize import candidates, onnxruntime_steps, openvino_steps, plan, rockchip
from mcpd.optimize.interface import (
    Interface,
    OptimizeError,
    check_same,
    interface,
    openvino_interface,
    restore_interface,
)
from mcpd.optimize.layers import describe, worst_first
from mcpd.optimize.measure import Accuracy, Outputs, compare, latencies_ms, outputs
from mcpd.optimize.options import Options
from mcpd.optimize.outcome import Candidate, Outcome, Skipped
from mcpd.optimize.plan import GPU_TARGETS
from mcpd.optimize.samples import Sample
from mcpd.optimize.sensitivity import Sensitivity

# GPU preference where latency cannot be measured here: the lowest precision that is accurate.
GPU_RANK = {"int8": 0, "fp16": 1, "int4": 2, "fp32": 3}


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
        self.skipped: list[Skipped] = []
        self.reference: Outputs = []
        self.reference_ms = 0.0
        self.sensitivity: tuple[Sensitivity, ...] = ()
        self._openvino_interface: Interface | None = None

    @property
    def measures_latency(self) -> bool:
        return self.options.target in ("cpu", "openvino")

    @property
    def asked(self) -> bool:
        """A precision was asked for: its steps are taken even where they cannot win."""
        return self.options.precision != "auto"

    def gate(self, accuracy: Accuracy) -> bool:
        return accuracy.meets(self.options.min_cosine, self.options.min_top1)

    def within_budget(self, what: str, needs_s: float = 0.0) -> bool:
        """Whether `what`, expected to take `needs_s` (0: unknown), can end within the budget."""
        left = self.deadline - self.clock()
        if needs_s < left:
            return True
        budget = self.options.budget_s
        spent = f"search budget of {budget:.0f} s spent"
        more = f"it would take about {needs_s:.0f} s, and {left:.0f} s of the {budget:.0f} s budget"
        self.skip(what, spent if left <= 0 else f"{more} are left")
        return False

    def skip(self, label: str, reason: str, speedup: float | None = None) -> None:
        self.skipped.append(Skipped(label, reason, speedup))
        self.progress(f"skipped {label}: {reason}")

    def best_accepted(self) -> Candidate | None:
        """The fastest candidate that meets the gate so far (by its timing beside the original)."""
        accepted = [r for r in self.results if r.accepted and r.latency_ms is not None]
        return min(accepted, key=lambda r: r.latency_ms or math.inf, default=None)

    def could_win(self, label: str, ceiling_ms: float | None, why: str) -> bool:
        """Under `auto`, whether `label`, which runs no faster than `ceiling_ms` (`why`), can
        beat the fastest candidate accepted so far (plan.could_win); says so when it cannot."""
        best = self.best_accepted()
        if self.asked or plan.could_win(ceiling_ms, best.latency_ms if best else None):
            return True
        assert best is not None and best.latency_ms is not None and ceiling_ms is not None
        speedup = self.reference_ms / ceiling_ms
        self.skip(
            label,
            f"{why}, {speedup:.2f}x at best, and {best.label} already meets the gate at "
            f"{self.reference_ms / best.latency_ms:.2f}x",
            round(speedup, 3),
        )
        return False

    def worth_calibrating(self, label: str, probe: Callable[[], Path]) -> bool:
        """Under `auto` on a CPU, whether an INT8 variant, at the speed it runs at, can beat what
        is accepted already: `probe` builds it with one sample's ranges (seconds; an INT8 graph
        runs at the same speed whatever its ranges), timed beside the original before it is
        calibrated on every sample (a minute on PP-OCRv4's detector here)."""
        if self.asked or not self.measures_latency or self.best_accepted() is None:
            return True
        try:
            ms = self.timed_ms(probe())
        except Exception:  # the full build says why, as for any candidate
            return True
        return self.could_win(label, ms, "its graph runs")

    def timed_ms(self, path: Path) -> float:
        """The model's latency, timed beside the original and scaled to the original's own."""
        reference_ms, ms = latencies_ms(
            [self.model_path, path], self.validation[0], 10, 5.0, device=self.options.device
        )
        return ms / reference_ms * self.reference_ms

    def file(self, label: str, suffix: str = ".onnx") -> Path:
        return self.workdir / f"{len(self.results):02d}-{label.replace(' ', '_')}{suffix}"

    def _matches_interface(self, path: Path) -> str:
        """Check that the candidate at `path` keeps the original's interface (an IR: the one
        OpenVINO reads from the original); returns the runtime that runs it."""
        if path.suffix == ".xml":
            if self._openvino_interface is None:
                self._openvino_interface = openvino_interface(self.model_path)
            check_same(openvino_interface(path), self._openvino_interface)
            return "openvino"
        model = onnx.load(str(path))
        restore_interface(model, self.original)
        onnx.save(model, str(path))
        check_same(interface(model), self.interface)
        return "onnxruntime"

    def evaluate(
        self,
        label: str,
        precision: str,
        path: Path,
        fp32_nodes: tuple[str, ...] = (),
        started: float | None = None,
    ) -> Candidate:
        begun = self.clock() if started is None else started
        runtime = self._matches_interface(path)
        got = outputs(path, self.validation, self.options.device)
        accuracy = compare(self.reference, got, self.interface.outputs)
        ok = self.gate(accuracy)
        # Beside the original, for the search's own decisions.
        ms = self.timed_ms(path) if self.measures_latency else None
        seconds = self.clock() - begun
        result = Candidate(
            label, precision, path, ms, accuracy, ok, fp32_nodes, runtime=runtime, seconds=seconds
        )
        self.results.append(result)
        verdict = "meets the gate" if ok else "below the gate"
        speed = "" if ms is None else f"{self.reference_ms / ms:.2f}x, "
        self.progress(
            f"{label}: {speed}cosine {accuracy.cosine_min:.4f} — {verdict} ({seconds:.1f} s)"
        )
        return result

    def attempt(
        self,
        label: str,
        precision: str,
        build: Callable[[], Path],
        fp32_nodes: tuple[str, ...] = (),
    ) -> Candidate | None:
        """Build and evaluate one candidate; one that the toolkit cannot build or the runtime
        cannot run is reported and skipped, never fatal (the original remains)."""
        started = self.clock()
        self.progress(f"building {label}")
        try:
            return self.evaluate(label, precision, build(), fp32_nodes, started)
        except Exception as exc:  # quantizers and sessions raise anything from odd graphs
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            self.progress(f"{label}: failed ({first}); skipped")
            return None

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
        openvino = "openvino" in self.options.runtimes
        onnxruntime = "onnxruntime" in self.options.runtimes
        if openvino:  # no calibration: found in seconds, and the bar every later step must beat
            openvino_steps.search_floats(self)
        if onnxruntime:
            gpu = self.options.target in GPU_TARGETS
            self.attempt(
                "fp32 graph-optimized",
                "fp32",
                lambda: candidates.graph_optimized(
                    self.model_path, self.file("fp32"), "basic" if gpu else "extended"
                ),
            )
        if openvino:
            openvino_steps.search_int8(self)
        if onnxruntime:
            onnxruntime_steps.search_variants(self)
        reference_ms = self._time_all()
        chosen = self._choose(reference_ms)
        return Outcome(
            reference_ms, chosen, tuple(self.results), self.sensitivity, tuple(self.skipped)
        )

    def _search_rknn(self, toolkit: Path) -> Outcome:
        built = rockchip.convert(
            self.model_path,
            self.interface,
            self.calibration,
            self.validation,
            self.reference,
            self.options.target,
            self.workdir,
            self.gate,
            self.progress,
            toolkit,
            ("int8", "fp16") if self.options.precision == "auto" else (self.options.precision,),
            self.options.layer_samples,
        )
        for b in built:
            if b.accuracy is not None:
                ok = self.gate(b.accuracy)
                found = Candidate(b.label, b.precision, b.path, None, b.accuracy, ok, (), b.layers)
                self.results.append(replace(found, runtime="rknn"))
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
        reference, *timed = latencies_ms(paths, self.validation[0], device=self.options.device)
        self.results = [
            replace(r, latency_ms=ms) for r, ms in zip(self.results, timed, strict=True)
        ]
        return reference

    def _original(self, reference_ms: float | None) -> Candidate:
        exact = compare(self.reference, self.reference, self.interface.outputs)
        return Candidate("original (unchanged)", "fp32", self.model_path, reference_ms, exact, True)

    def _choose(self, reference_ms: float | None) -> Candidate:
        """The fastest accepted candidate if it beats the original (CPU); on GPU targets the
        lowest accepted precision; else the original itself, unchanged. For the openvino target
        the fastest accepted OpenVINO build even where onnxruntime runs the original faster: the
        original would be served by OpenVINO too, and its fp32 build is that same graph."""
        accepted = [r for r in self.results if r.accepted]
        if self.measures_latency:
            best = min(accepted, key=lambda r: r.latency_ms or math.inf, default=None)
            faster = best is not None and (best.latency_ms or math.inf) < (reference_ms or 0.0)
            if best is not None and (faster or self.options.target == "openvino"):
                return best
        elif accepted:
            return min(accepted, key=lambda r: GPU_RANK[r.precision])
        original = self._original(reference_ms)
        self.results.append(original)
        return original
