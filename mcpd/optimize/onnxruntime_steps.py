"""The onnxruntime candidates of a search after its FP32 graph-optimized one: static INT8 QDQ
variants, per-layer sensitivity and mixed precision, Percentile and Entropy calibration, INT4
weight-only, and FP16 for GPU targets (candidates.py builds them; plan.py states when a step is
skipped)."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import onnx

from mcpd.optimize import candidates
from mcpd.optimize.candidates import Int8Recipe
from mcpd.optimize.plan import GPU_TARGETS
from mcpd.optimize.sensitivity import rank

if TYPE_CHECKING:  # search imports this module
    from mcpd.optimize.outcome import Candidate
    from mcpd.optimize.search import Search


def search_variants(search: Search) -> None:
    """onnxruntime's candidates after its FP32 one, as `--precision` asks."""
    wanted = search.options.precision
    gpu = search.options.target in GPU_TARGETS
    if wanted in ("auto", "int8"):
        _search_int8(search)
    weights = candidates.int4_weights(search.original)
    if wanted == "int4" or (wanted == "auto" and not gpu and weights):
        if weights == 0:
            search.progress("int4: no MatMul with large constant weights to quantize")
        elif search.within_budget("int4 weight-only MatMulNBits"):
            search.attempt(
                "int4 weight-only MatMulNBits",
                "int4",
                lambda: candidates.int4(search.model_path, search.file("int4")),
            )
    if wanted == "fp16" or (wanted == "auto" and gpu):
        search.attempt(
            "fp16", "fp16", lambda: candidates.fp16(search.model_path, search.file("fp16"))
        )


def _int8(search: Search, source: Path, recipe: Int8Recipe) -> Candidate | None:
    if not search.within_budget(recipe.label):
        return None
    return search.attempt(
        recipe.label,
        "int8",
        lambda: candidates.int8(
            source, search.file(recipe.label), search.calibration, recipe, search.workdir
        ),
        recipe.exclude,
    )


def _worth_calibrating(search: Search, source: Path, recipe: Int8Recipe) -> bool:
    probes = search.workdir / "probe"  # its own ranges cache, of one sample
    probes.mkdir(exist_ok=True)
    target = probes / f"{recipe.label.replace(' ', '_')}.onnx"
    return search.worth_calibrating(
        recipe.label,
        lambda: candidates.int8(source, target, search.calibration[:1], recipe, probes),
    )


def _search_int8(search: Search) -> None:
    gpu = search.options.target in GPU_TARGETS
    search.progress("pre-processing (shape inference, graph optimization)")
    pre = candidates.preprocess(search.model_path, search.workdir / "preprocessed.onnx")
    raw = search.workdir / "named.onnx"
    named = onnx.load(str(search.model_path))
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
        source = pre if recipe.preprocessed else raw
        if not _worth_calibrating(search, source, recipe):
            continue
        built = _int8(search, source, recipe)
        if built is not None:
            tried.append((recipe, built))
    # Mixed precision starts from the variant worth rescuing: the fastest one (CPU) when it
    # fails the gate and could beat every accepted candidate; on GPU targets the most accurate
    # one when none is accepted.
    accepted = [c for _, c in tried if c.accepted]
    # Only pre-processed QDQ variants keep the node names and Q/DQ pairs sensitivity is
    # ranked by (quantize_static rewrites a raw graph itself; QOperator fuses nodes).
    rescuable = [t for t in tried if t[0].preprocessed and not t[0].operator_format]
    if not rescuable:
        return
    if search.measures_latency:
        recipe, start = min(rescuable, key=lambda t: t[1].latency_ms or math.inf)
        # Keeping layers in FP32 or calibrating otherwise never makes a variant faster.
        why = f"keeping nodes of {recipe.label} in FP32 runs no faster than it"
        if start.accepted or not search.could_win("mixed precision", start.latency_ms, why):
            return
    else:
        if accepted:
            return
        recipe, start = max(rescuable, key=lambda t: t[1].accuracy.cosine_min)
    search.progress(f"per-layer sensitivity of {recipe.label}")
    search.sensitivity = tuple(rank(pre, start.path, search.validation[:8]))
    count = 1
    while count <= len(search.sensitivity):
        keep = (n for s in search.sensitivity[:count] for n in s.keep_fp32)
        mixed = _int8(search, pre, replace(recipe, exclude=tuple(dict.fromkeys(keep))))
        if mixed is None or mixed.accepted:
            return
        count *= 2
    if accepted:
        return
    for method in ("percentile", "entropy"):
        found = _int8(search, pre, replace(recipe, method=method))
        if found is not None and found.accepted:
            return
