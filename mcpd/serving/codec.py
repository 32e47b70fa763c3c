"""Inference requests in: JSON tensors, Triton's binary tensor data extension and shared memory
references (docs/serving-protocol.md §1.3, §2.1, §2.2); responses go out through
mcpd.serving.responses.

Decoding checks everything before anything runs (names, datatypes, shapes, byte counts, limits) and
names what is wrong; numbers arrive as numpy arrays that view the request body where they can,
without copying (shared memory tensors are read out with pread: see shm.py).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple, cast

import numpy as np

from mcpd.serving import strings
from mcpd.serving.errors import RequestError
from mcpd.serving.shm import PeerMemory, ShmRef
from mcpd.serving.tensors import TensorSpec
from mcpd.serving.values import brief, integer, parse_json

VERSION = "1"
"""mcpd serves one version of each model; clients may name it."""


@dataclass(frozen=True)
class Interface:
    """What a request is checked against."""

    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    max_batch: int
    limit: int
    """The most bytes one tensor may have ([daemon] max_request_bytes)."""
    by_name: dict[str, tuple[int, TensorSpec]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        by_name = {spec.name: (index, spec) for index, spec in enumerate(self.inputs)}
        object.__setattr__(self, "by_name", by_name)  # derived once, not per request


@dataclass(frozen=True)
class Wanted:
    index: int
    """Position in the model's outputs."""
    binary: bool
    shm: ShmRef | None


@dataclass(frozen=True)
class InferRequest:
    id: str | None
    inputs: tuple[np.ndarray, ...]
    """In the model's input order, all with the same batch dimension."""
    outputs: tuple[Wanted, ...]
    timeout_us: int | None


def parameters_of(item: Mapping[str, Any], what: str) -> Mapping[str, Any]:
    params = item.get("parameters", {})
    if not isinstance(params, dict):
        raise RequestError(f"{what}: parameters must be a JSON object")
    return params


def _shm(params: Mapping[str, Any], what: str) -> ShmRef | None:
    if "shared_memory_region" not in params and "shared_memory_byte_size" not in params:
        return None
    region = params.get("shared_memory_region")
    if not isinstance(region, str) or "shared_memory_byte_size" not in params:
        raise RequestError(
            f"{what}: shared memory needs both shared_memory_region (a name) and "
            "shared_memory_byte_size"
        )
    size = integer(params["shared_memory_byte_size"], f"{what}: shared_memory_byte_size")
    offset = integer(params.get("shared_memory_offset", 0), f"{what}: shared_memory_offset")
    return ShmRef(region, offset, size)


def _from_json(data: object, spec: TensorSpec, count: int, what: str) -> np.ndarray:
    if not isinstance(data, list):
        raise RequestError(f"{what}: data must be a (nested or flat) JSON list")
    try:
        array = np.array(data)
    except (ValueError, OverflowError, TypeError):
        raise RequestError(f"{what}: data is ragged or holds non-numbers") from None
    if array.size != count:
        raise RequestError(f"{what}: {array.size} values in data, the shape needs {count}")
    target = spec.dtype
    kind = array.dtype.kind
    if count and not (
        (target.kind == "b" and kind == "b")
        or (target.kind in "iu" and kind in "iu")
        or (target.kind == "f" and kind in "iuf")
    ):
        raise RequestError(f"{what}: data holds {array.dtype.name} values, not {spec.datatype}")
    if target.kind in "iu" and count:
        info = np.iinfo(cast(Any, target))
        if array.min() < info.min or array.max() > info.max:
            raise RequestError(f"{what}: values outside the range of {spec.datatype}")
    return array.astype(target, copy=False).reshape(-1)


def _within(nbytes: int, interface: Interface, what: str) -> None:
    if nbytes > interface.limit:
        raise RequestError(f"{what} exceed the limit of {interface.limit} bytes", 413)


class _Declared(NamedTuple):
    """An input as its JSON object declares it, checked against the model's."""

    position: int
    """In the model's inputs."""
    spec: TensorSpec
    what: str
    """How errors name it."""
    shape: list[int]
    elements: int
    nbytes: int
    """What the elements take (BYTES: known only once serialized)."""

    @property
    def text(self) -> bool:
        return self.spec.datatype == "BYTES"


def _declared(item: Mapping[str, Any], interface: Interface) -> _Declared:
    name = item["name"]
    if name not in interface.by_name:
        known = ", ".join(interface.by_name)
        raise RequestError(f"unknown input {brief(name)}; the model's inputs are {known}")
    index, spec = interface.by_name[name]
    what = f"input {name!r}"
    if item.get("datatype") != spec.datatype:
        got = brief(item.get("datatype"))
        raise RequestError(f"{what}: datatype {got}, expected {spec.datatype}")
    shape = item.get("shape")
    expected = [-1, *spec.shape[1:]]
    if (
        not isinstance(shape, list)
        or len(shape) != len(spec.shape)
        or any(isinstance(d, bool) or not isinstance(d, int) or d < 0 for d in shape)
        or any(want not in (-1, got) for want, got in zip(expected[1:], shape[1:], strict=True))
    ):
        raise RequestError(f"{what}: shape {brief(shape)}, expected {expected} (-1: any size)")
    if not 1 <= shape[0] <= interface.max_batch:
        raise RequestError(
            f"{what}: batch of {shape[0]}, this model takes 1..{interface.max_batch}"
        )
    count = math.prod(shape)
    declared = _Declared(index, spec, what, shape, count, count * spec.dtype.itemsize)
    if not declared.text:
        _within(declared.nbytes, interface, f"{what}: {count} elements ({declared.nbytes} bytes)")
    return declared


def _from_shared_memory(
    declared: _Declared, ref: ShmRef, interface: Interface, shm: PeerMemory
) -> np.ndarray:
    what, count = declared.what, declared.elements
    if declared.text:
        _within(ref.byte_size, interface, f"{what}: shared_memory_byte_size {ref.byte_size}")
        return strings.from_binary(
            shm.read(ref, np.dtype(np.uint8), ref.byte_size).data, count, what
        )
    if ref.byte_size != declared.nbytes:
        raise RequestError(
            f"{what}: shared_memory_byte_size {ref.byte_size}, needs {declared.nbytes}"
        )
    return shm.read(ref, declared.spec.dtype, count)


def _from_binary(
    declared: _Declared, params: Mapping[str, Any], binary: memoryview, offset: int
) -> tuple[np.ndarray, int]:
    """The array in the binary section at `offset`, and the bytes it takes there."""
    what, nbytes = declared.what, declared.nbytes
    size = integer(params["binary_data_size"], f"{what}: binary_data_size")
    if size != nbytes and not declared.text:
        raise RequestError(
            f"{what}: binary_data_size {size}, shape {declared.shape} needs {nbytes}"
        )
    if offset + size > len(binary):
        raise RequestError(f"{what}: its binary data runs past the end of the body")
    raw = binary[offset : offset + size]
    if declared.text:
        return strings.from_binary(raw, declared.elements, what), size
    return np.frombuffer(raw, declared.spec.dtype), size


def _input(
    item: object,
    interface: Interface,
    binary: memoryview,
    offset: int,
    shm: PeerMemory,
) -> tuple[int, np.ndarray, int]:
    """(position in the model's inputs, the array, bytes of the binary section consumed)."""
    if not isinstance(item, dict) or not isinstance(item.get("name"), str):
        raise RequestError("each input must be a JSON object with a name")
    declared = _declared(item, interface)
    what, count = declared.what, declared.elements
    params = parameters_of(item, what)
    ref = _shm(params, what)
    used = 0
    if ref is not None:
        if "data" in item:
            raise RequestError(f"{what}: give data or shared memory, not both")
        flat = _from_shared_memory(declared, ref, interface, shm)
    elif "binary_data_size" in params:
        flat, used = _from_binary(declared, params, binary, offset)
    elif "data" in item:
        data = item["data"]
        flat = (
            strings.from_json(data, count, what)
            if declared.text
            else _from_json(data, declared.spec, count, what)
        )
    else:
        raise RequestError(f"{what}: no data, binary_data_size or shared_memory_region")
    return declared.position, flat.reshape(declared.shape), used


def decode(
    body: bytes | bytearray, header_length: int | None, interface: Interface, shm: PeerMemory
) -> InferRequest:
    if header_length is None:
        header_length = len(body)
    elif not 0 < header_length <= len(body):
        raise RequestError(
            f"Inference-Header-Content-Length {header_length} is outside the body "
            f"({len(body)} bytes)"
        )
    header = parse_json(body[:header_length], "the request")
    if not isinstance(header, dict):
        raise RequestError("the request must be a JSON object")
    request_id = header.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise RequestError("id must be a string")
    params = parameters_of(header, "request")
    items = header.get("inputs")
    if not isinstance(items, list) or not items:
        raise RequestError("inputs must be a non-empty list")
    binary = memoryview(body)[header_length:]
    offset = 0
    arrays: dict[int, np.ndarray] = {}
    for item in items:
        index, array, used = _input(item, interface, binary, offset, shm)
        if index in arrays:
            raise RequestError(f"input {interface.inputs[index].name!r} is given twice")
        arrays[index] = array
        offset += used
    if offset != len(binary):
        raise RequestError(
            f"{len(binary) - offset} bytes at the end of the body belong to no input"
        )
    missing = [spec.name for i, spec in enumerate(interface.inputs) if i not in arrays]
    if missing:
        raise RequestError(f"missing input(s): {', '.join(missing)}")
    inputs = tuple(arrays[i] for i in range(len(interface.inputs)))
    if len({array.shape[0] for array in inputs}) > 1:
        batches = {spec.name: a.shape[0] for spec, a in zip(interface.inputs, inputs, strict=True)}
        raise RequestError(f"inputs disagree on the batch dimension: {batches}")
    timeout = params.get("timeout")
    return InferRequest(
        request_id,
        inputs,
        _outputs(header, params, interface),
        None if timeout is None else integer(timeout, "parameter timeout (µs)"),
    )


def _outputs(
    header: Mapping[str, Any], params: Mapping[str, Any], interface: Interface
) -> tuple[Wanted, ...]:
    default = params.get("binary_data_output", False)
    if not isinstance(default, bool):
        raise RequestError("parameter binary_data_output must be true or false")
    names = {spec.name: index for index, spec in enumerate(interface.outputs)}
    items = header.get("outputs")
    if items is None:
        return tuple(Wanted(index, default, None) for index in range(len(interface.outputs)))
    if not isinstance(items, list):
        raise RequestError("outputs must be a list")
    wanted: dict[int, Wanted] = {}
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise RequestError("each requested output must be a JSON object with a name")
        name = item["name"]
        if name not in names:
            raise RequestError(
                f"unknown output {brief(name)}; the model's outputs are {', '.join(names)}"
            )
        if names[name] in wanted:
            raise RequestError(f"output {name!r} is requested twice")
        what = f"output {name!r}"
        out_params = parameters_of(item, what)
        binary = out_params.get("binary_data", default)
        if not isinstance(binary, bool):
            raise RequestError(f"{what}: binary_data must be true or false")
        wanted[names[name]] = Wanted(names[name], binary, _shm(out_params, what))
    return tuple(wanted.values())
