"""The OpenVINO candidates of a search, cheapest first (plan.openvino_candidates decides which):
the float precisions, each the model compiled at another inference precision (seconds, no
calibration); then NNCF's INT8; then, only when that INT8 misses the gate and would win if it
met it, NNCF's accuracy-aware INT8 with the gate as its metric (openvino_build.py builds them)."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from mcpd.config import OpenVinoOptions
from mcpd.optimize import openvino_build, plan
from mcpd.optimize.measure import Outputs, compare, outputs
from mcpd.serving.backends.openvino import open_compiled

if TYPE_CHECKING:  # search imports this module
    from mcpd.optimize.outcome import Candidate
    from mcpd.optimize.search import Search


def _planned(search: Search) -> tuple[str, ...]:
    options = search.options
    return plan.openvino_candidates(options.device, options.capabilities, options.precision)


def search_floats(search: Search) -> None:
    for precision in _planned(search):
        if precision in plan.FLOATS:
            label = f"openvino {precision}"
            target = search.file(label, ".xml")
            build = partial(openvino_build.float_ir, search.model_path, target, precision)
            search.attempt(label, precision, build)


def search_int8(search: Search) -> None:
    if "int8" not in _planned(search):
        return
    device = search.options.device
    floats = [r.precision for r in search.results if r.runtime == "openvino" and r.accepted]
    elsewhere = plan.int8_float_precision(device, floats)
    transformer = plan.has_attention(search.original)
    label = f"openvino int8 nncf{' transformer' if transformer else ''} {elsewhere}"

    def int8(samples: int, target: Path) -> Path:
        return openvino_build.int8_ir(
            search.model_path, target, search.calibration[:samples], elsewhere, transformer, device
        )

    probe = search.workdir / "probe" / "openvino-int8.xml"
    probe.parent.mkdir(exist_ok=True)
    if not search.worth_calibrating(label, lambda: int8(1, probe)):
        return
    if not search.within_budget(label):
        return
    plain = search.attempt(
        label, "int8", lambda: int8(len(search.calibration), search.file(label, ".xml"))
    )
    if plain is not None and not plain.accepted:
        _accuracy_aware(search, plain, transformer)


def _accuracy_aware(search: Search, plain: Candidate, transformer: bool) -> None:
    """NNCF's accuracy-aware INT8 with the gate as its metric, checked on the calibration samples
    (the held-out ones stay unseen until the gate is measured on them as for every candidate)."""
    label = "openvino int8 nncf accuracy-aware fp32"
    why = f"giving operations of {plain.label} back to float runs no faster than it"
    if not search.could_win(label, plain.latency_ms, why):
        return
    needs_s = _accuracy_aware_seconds(search, plain)
    if not search.within_budget(label, needs_s):
        return
    search.progress(f"{label}: expected to take about {needs_s:.0f} s")
    specs = search.interface.outputs
    options = search.options

    def score(reference: Outputs, got: Outputs) -> float:
        accuracy = compare(reference, got, specs)
        return plan.gate_score(accuracy, options.min_cosine, options.min_top1)

    def build() -> Path:
        expected = outputs(search.model_path, search.calibration)
        return openvino_build.accuracy_aware_ir(
            search.model_path,
            search.file(label, ".xml"),
            search.calibration,
            list(zip(search.calibration, expected, strict=True)),
            score,
            score(search.reference, search.reference),  # the original's: any drop beyond fails
            transformer,
            options.device,
        )

    search.attempt(label, "int8", build)


def _accuracy_aware_seconds(search: Search, plain: Candidate) -> float:
    """plan.accuracy_aware_seconds for this model: its quantizers, one compile of plain INT8
    timed, and plain INT8's latency."""
    started = search.clock()
    open_compiled(plain.path, OpenVinoOptions(device=search.options.device))
    return plan.accuracy_aware_seconds(
        openvino_build.quantizers(plain.path),
        openvino_build.ACCURACY_AWARE_ITERATIONS,
        search.clock() - started,
        len(search.calibration),
        (plain.latency_ms or 0.0) / 1000,
    )
