"""What `mcpd optimize` builds and when a step is not worth its time, decided from the target, the
runtimes installed and what the device runs natively. Pure: the search (search.py) acts on these,
and the tests drive them directly.

The rules (docs/optimizer.md gives the sources):
- Runtimes: `--target cpu` measures onnxruntime and, on an x86 CPU where it is installed,
  OpenVINO, side by side; `--target openvino` OpenVINO alone, on `--device`.
- OpenVINO candidates, cheapest first: the float precisions need no calibration, only a compile
  (f32; bf16 where the CPU runs it natively, i.e. has AMX or AVX512-BF16; f16 on a GPU or NPU),
  then NNCF's post-training INT8, then, only when that INT8 misses the gate, NNCF's
  accuracy-aware INT8, which gives operations back to float until the gate holds.
- A step is skipped under `auto` when what it can reach at best is no faster than a candidate
  that already meets the gate (could_win). An INT8 model runs at the same speed whatever ranges
  it was calibrated with (the same operators and kernels), so each INT8 variant is first
  quantized with one sample's ranges and timed (seconds), and calibrated on every sample only if
  that speed can win; a step that keeps more of an INT8 model in float (mixed precision,
  accuracy-aware INT8) or calibrates it otherwise (Percentile, Entropy) is no faster than that
  INT8 model, so it is tried only when the INT8 model would win if it were accurate.
"""

from __future__ import annotations

from collections.abc import Sequence

import onnx

from mcpd.optimize.measure import Accuracy

GPU_TARGETS = ("cuda", "tensorrt")
"""onnxruntime's GPU providers: no latency measured here (no GPU)."""
X86 = ("x86_64", "amd64", "i686", "i386")
"""platform.machine() of the CPUs OpenVINO is measured on by default (OpenVINO also runs on Arm,
untested here: ask for it with --runtime)."""

FLOATS = ("fp32", "bf16", "fp16")
HINTS = {"fp32": "f32", "bf16": "bf16", "fp16": "f16"}
"""A float precision as OpenVINO's inference precision hint (`[models.openvino] precision`)."""


def device_family(device: str) -> str:
    """CPU, GPU or NPU: "GPU.1" is a GPU."""
    return device.split(".")[0]


def default_runtimes(openvino_installed: bool, machine: str) -> tuple[str, ...]:
    """The runtimes `--target cpu` measures when --runtime does not say: onnxruntime always, and
    OpenVINO where it is installed on an x86 CPU."""
    x86 = machine.lower() in X86
    return ("onnxruntime", "openvino") if openvino_installed and x86 else ("onnxruntime",)


def openvino_candidates(device: str, capabilities: Sequence[str], wanted: str) -> tuple[str, ...]:
    """The OpenVINO precisions to build, cheapest first, for `--precision wanted` (auto: all).

    CPU: fp32, and bf16 where OpenVINO says the CPU runs BF16 natively (AMX or AVX512-BF16; on
    another CPU OpenVINO would quietly run bf16 as f32); GPU: fp32 and fp16 (its default); NPU:
    fp16 (what it computes in). INT8 (NNCF) on every device."""
    family = device_family(device)
    if family == "CPU":
        floats = ["fp32", *(["bf16"] if "BF16" in capabilities else [])]
    elif family == "GPU":
        floats = ["fp32", "fp16"]
    else:
        floats = ["fp16"]
    every = (*floats, "int8")
    return every if wanted == "auto" else tuple(p for p in every if p == wanted)


def int8_float_precision(device: str, accepted_floats: Sequence[str]) -> str:
    """The precision an INT8 model's operations that stay in float run at: the lowest float
    precision that met the gate on its own (bf16 or fp16 before fp32, as OpenVINO's own default
    on such a device would be), else fp32 (fp16 on an NPU, which has no other)."""
    for precision in ("bf16", "fp16", "fp32"):
        if precision in accepted_floats:
            return precision
    return "fp16" if device_family(device) == "NPU" else "fp32"


def could_win(ceiling_ms: float | None, best_ms: float | None) -> bool:
    """Whether a step whose candidates can run no faster than `ceiling_ms` may still beat the
    fastest candidate accepted so far (`best_ms`); None: unknown, so it may."""
    return ceiling_ms is None or best_ms is None or ceiling_ms < best_ms


def accuracy_aware_seconds(
    quantizers: int, iterations: int, compile_s: float, samples: int, latency_s: float
) -> float:
    """About how long NNCF's accuracy-aware INT8 takes, for the budget: it ranks each group of
    quantizers by compiling the model with that group in float and running it on the samples,
    then compiles and validates the model once per iteration (nncf/quantization/algorithms/
    accuracy_control/ranker.py, algorithm.py); a group holds one activation quantizer or more, so
    the model's count bounds the groups. Its own graph work per group (copying the model,
    reverting the operations) measured as much again: on PP-OCRv4's recognizer here, 177 s for
    about 88 s of compiles and inferences (65 quantizers, 16 iterations, 0.77 s per compile)."""
    return 2 * (quantizers + iterations) * (compile_s + samples * latency_s)


def has_attention(model: onnx.ModelProto) -> bool:
    """Whether the graph has scaled dot-product attention, for NNCF's TRANSFORMER model type: a
    MatMul of two activations (neither input a weight) one of which comes straight from a
    Softmax, i.e. the attention weights times the values. A Softmax alone (a classifier's last
    layer) or a MatMul by weights (a dense layer) is not attention."""
    graph = model.graph
    constants = {init.name for init in graph.initializer}
    constants |= {out for node in graph.node if node.op_type == "Constant" for out in node.output}
    softmaxed = {out for node in graph.node if node.op_type == "Softmax" for out in node.output}
    return any(
        node.op_type == "MatMul"
        and not constants.intersection(node.input)
        and bool(softmaxed.intersection(node.input))
        for node in graph.node
    )


def gate_score(accuracy: Accuracy, min_cosine: float, min_top1: float) -> float:
    """The gate as one number for NNCF's accuracy-aware quantization, which keeps the drop of a
    metric from the float model's within a bound: the smallest margin over the gate's
    thresholds. A model meets the gate exactly when its score is >= 0, i.e. when its drop from
    the score of the original's own answers (the highest) is at most that score."""
    margins = [accuracy.cosine_min - min_cosine]
    if accuracy.top1_agreement is not None:
        margins.append(accuracy.top1_agreement - min_top1)
    return min(margins)
