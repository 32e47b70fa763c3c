"""Per-layer sensitivity: which quantized nodes lose the accuracy. Both the FP32 model and its INT8
QDQ version are run with every quantized node's input and output exposed; a node's score is the
error (1 − cosine to FP32) of its output minus the largest error already present in its inputs,
i.e. the error that node adds. Keeping the top-scoring nodes in FP32 (nodes_to_exclude) is
Intel Neural Compressor's accuracy-aware fallback, ranked in one pass instead of one quantization
per layer (docs/optimizer.md)."""

from __future__ import annotations

import tempfile
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from mcpd.optimize.measure import cosine, session
from mcpd.optimize.samples import Sample


@dataclass(frozen=True)
class Sensitivity:
    node: str
    op_type: str
    added_error: float  # 1 − cosine of its output, minus that of its worst input
    # The node and the producers of the activations it reads: QDQ quantizes a tensor once for all
    # its readers, so an input stays 8-bit while its producer is quantized.
    keep_fp32: tuple[str, ...]


def _quantized_nodes(quantized: onnx.ModelProto) -> set[str]:
    """Nodes (other than Q/DQ) that read at least one dequantized tensor."""
    dequantized = {
        out
        for node in quantized.graph.node
        if node.op_type == "DequantizeLinear"
        for out in node.output
    }
    return {
        node.name
        for node in quantized.graph.node
        if node.op_type not in ("QuantizeLinear", "DequantizeLinear")
        and any(name in dequantized for name in node.input)
    }


def _expose(
    model: onnx.ModelProto, names: list[str], types: dict[str, onnx.TypeProto], path: Path
) -> Path:
    exposed = onnx.ModelProto()
    exposed.CopyFrom(model)
    present = {o.name for o in exposed.graph.output}
    for name in names:
        if name not in present:
            value = exposed.graph.output.add()
            value.name = name
            value.type.CopyFrom(types[name])
    onnx.save(exposed, str(path))
    return path


def rank(fp32_path: Path, int8_path: Path, samples: list[Sample]) -> list[Sensitivity]:
    """Quantized nodes that add error, most sensitive first."""
    # Tensor types come from shape inference (a model not pre-processed has no value_info).
    fp32 = onnx.shape_inference.infer_shapes(onnx.load(str(fp32_path)))
    quantized = onnx.load(str(int8_path))
    in_int8 = _quantized_nodes(quantized)
    weights = {init.name for init in fp32.graph.initializer}
    types = {
        v.name: v.type
        for v in [*fp32.graph.value_info, *fp32.graph.output]
        if v.type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    }
    int8_tensors = {name for node in quantized.graph.node for name in node.output}
    nodes = [n for n in fp32.graph.node if n.name in in_int8 and n.output[0] in types]
    producer = {out: n.name for n in fp32.graph.node for out in n.output}
    probes: dict[str, list[str]] = {
        n.name: [i for i in n.input if i in types and i not in weights and i in int8_tensors]
        for n in nodes
    }
    names = sorted(
        {n.output[0] for n in nodes if n.output[0] in int8_tensors}
        | {i for ins in probes.values() for i in ins}
    )
    if not names:
        return []
    cosines: dict[str, list[float]] = defaultdict(list)
    with tempfile.TemporaryDirectory(prefix="mcpd-sensitivity-") as scratch:
        ref_run = session(_expose(fp32, names, types, Path(scratch, "fp32.onnx")))
        q_run = session(_expose(quantized, names, types, Path(scratch, "int8.onnx")))
        for sample in samples:
            ref = dict(zip(names, ref_run.run(names, sample), strict=True))
            got = dict(zip(names, q_run.run(names, sample), strict=True))
            for name in names:
                cosines[name].append(cosine(ref[name], got[name]))
    error = {name: 1.0 - float(np.mean(values)) for name, values in cosines.items()}
    scores = [
        Sensitivity(
            n.name,
            n.op_type,
            error.get(n.output[0], 0.0) - max((error[i] for i in probes[n.name]), default=0.0),
            (n.name, *(producer[i] for i in probes[n.name] if i in producer)),
        )
        for n in nodes
        if n.output[0] in error
    ]
    return sorted((s for s in scores if s.added_error > 0), key=lambda s: -s.added_error)
