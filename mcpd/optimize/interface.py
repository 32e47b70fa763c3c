"""Reading a model and its interface: input/output names, datatypes and shapes (dynamic axes by
name). The optimizer promises the same interface in what it writes, so it is read once here and
written back onto every candidate. An OpenVINO build is held to the interface OpenVINO reads from
the original (openvino_interface), which is what the openvino backend would serve the original
with: OpenVINO infers some output shapes more precisely than an ONNX file declares them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper


class OptimizeError(Exception):
    """Bad input to `mcpd optimize`: one line that names the problem (exit status 2)."""


Dim = int | str | None  # a fixed size, a named dynamic axis, or an unnamed one


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: np.dtype[np.generic] | None  # None: not a plain tensor (a sequence or map)
    shape: tuple[Dim, ...] | None  # None: rank unknown

    def describe(self) -> str:
        dims = (
            "?"
            if self.shape is None
            else ",".join("?" if d is None else str(d) for d in self.shape)
        )
        return f"{self.name} {self.dtype} [{dims}]"


@dataclass(frozen=True)
class Interface:
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]


def load(path: Path) -> onnx.ModelProto:
    """The model at `path`, checked; large models' external data is read from beside it."""
    if not path.is_file():
        raise OptimizeError(f"{path}: no such model file")
    try:
        model = onnx.load(str(path))
        onnx.checker.check_model(model)
    except Exception as exc:  # onnx raises DecodeError, ValidationError, OSError, ...
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise OptimizeError(f"{path}: not a valid ONNX model ({first})") from None
    if not model.graph.output:
        raise OptimizeError(f"{path}: the model has no outputs")
    return model


def _spec(value: onnx.ValueInfoProto) -> TensorSpec:
    kind = value.type.WhichOneof("value")
    if kind != "tensor_type":
        return TensorSpec(value.name, None, None)
    tensor = value.type.tensor_type
    dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.elem_type))
    if not tensor.HasField("shape"):
        return TensorSpec(value.name, dtype, None)
    dims: list[Dim] = []
    for dim in tensor.shape.dim:
        which = dim.WhichOneof("value")
        dims.append(dim.dim_value if which == "dim_value" else dim.dim_param or None)
    return TensorSpec(value.name, dtype, tuple(dims))


def interface(model: onnx.ModelProto) -> Interface:
    weights = {init.name for init in model.graph.initializer}
    return Interface(
        inputs=tuple(_spec(v) for v in model.graph.input if v.name not in weights),
        outputs=tuple(_spec(v) for v in model.graph.output),
    )


def openvino_interface(path: Path) -> Interface:
    """The interface of a model file (IR or ONNX) as OpenVINO reads it (a dynamic axis has no
    name there); OptimizeError when OpenVINO is missing or cannot read the file."""
    from mcpd.serving.backends import openvino
    from mcpd.serving.errors import LoadError

    if not path.is_file():
        raise OptimizeError(f"{path}: no such model file")
    try:
        model = openvino.runtime().Core().read_model(str(path))
    except LoadError as exc:
        raise OptimizeError(str(exc)) from None
    except RuntimeError as exc:
        raise OptimizeError(
            f"{path}: not a model OpenVINO reads ({openvino.reason(exc)})"
        ) from None
    return Interface(
        tuple(_port_spec(port) for port in model.inputs),
        tuple(_port_spec(port) for port in model.outputs),
    )


def _port_spec(port: Any) -> TensorSpec:
    from mcpd.serving.backends.openvino import OV_TYPES
    from mcpd.serving.tensors import DTYPES

    type_name = port.get_element_type().get_type_name()
    dtype = DTYPES[OV_TYPES[type_name]] if type_name in OV_TYPES else None
    shape = port.get_partial_shape()
    dims = (
        None
        if shape.rank.is_dynamic
        else tuple(d.get_length() if d.is_static else None for d in shape)
    )
    return TensorSpec(port.get_any_name(), dtype, dims)


def restore_interface(candidate: onnx.ModelProto, original: onnx.ModelProto) -> None:
    """Give `candidate` the graph input and output declarations of `original` (shape inference in
    pre-processing may rename or fix a dynamic axis; the types themselves must not change)."""
    declared = {v.name: v for v in [*original.graph.input, *original.graph.output]}
    for value in [*candidate.graph.input, *candidate.graph.output]:
        if value.name in declared:
            value.type.CopyFrom(declared[value.name].type)


def check_same(written: Interface, original: Interface) -> None:
    """Raise unless the two interfaces are identical (a defect of a candidate builder)."""
    for kind, got, want in (
        ("inputs", written.inputs, original.inputs),
        ("outputs", written.outputs, original.outputs),
    ):
        if got != want:
            mine = ", ".join(s.describe() for s in got)
            theirs = ", ".join(s.describe() for s in want)
            raise RuntimeError(f"candidate {kind} changed: {mine} instead of {theirs}")
