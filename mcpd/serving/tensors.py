"""Tensor descriptions, the protocol's datatype names (docs/serving-protocol.md §1.4) and Triton's
serialized form of a BYTES tensor (§2.1).

BYTES tensors are numpy object arrays: of `str` on the server (what onnxruntime's string tensors
take and give, §5.1), of `bytes` where a client reads them. BF16 (no numpy dtype) is not served: a
model using it fails to load with a message that says so.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

LENGTH = struct.Struct("<I")
"""A BYTES element's length before its bytes: 4 bytes, unsigned, little-endian (§2.1)."""

DTYPES: dict[str, np.dtype[np.generic]] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
    "BYTES": np.dtype(object),
}
DATATYPES: dict[np.dtype[np.generic], str] = {dtype: name for name, dtype in DTYPES.items()}


def datatype_of(dtype: np.dtype[np.generic]) -> str:
    try:
        return DATATYPES[dtype]
    except KeyError:
        raise ValueError(f"numpy dtype {dtype} has no protocol datatype") from None


def serialize_bytes(array: np.ndarray) -> bytes:
    """A BYTES tensor (elements `str`, written as UTF-8, or `bytes`) in Triton's serialized form,
    in row-major order."""
    parts: list[bytes] = []
    for element in array.reshape(-1):
        data = element.encode() if isinstance(element, str) else bytes(element)
        parts += (LENGTH.pack(len(data)), data)
    return b"".join(parts)


def deserialize_bytes(buffer: bytes | bytearray | memoryview, count: int) -> list[bytes]:
    """The `count` elements of a serialized BYTES tensor that must fill `buffer` exactly;
    ValueError says how it does not."""
    view = memoryview(buffer)
    elements = []
    offset = 0
    for index in range(count):
        if offset + LENGTH.size > len(view):
            raise ValueError(f"the data ends before element {index}'s length ({count} elements)")
        (length,) = LENGTH.unpack_from(view, offset)
        offset += LENGTH.size
        if offset + length > len(view):
            raise ValueError(f"element {index} of {length} bytes runs past the end of the data")
        elements.append(bytes(view[offset : offset + length]))
        offset += length
    if offset != len(view):
        raise ValueError(f"{len(view) - offset} bytes follow the last of the {count} elements")
    return elements


@dataclass(frozen=True)
class TensorSpec:
    name: str
    datatype: str
    shape: tuple[int, ...]
    """As the model declares it; -1 for a dimension of any size. shape[0] is the batch dimension."""

    @property
    def dtype(self) -> np.dtype[np.generic]:
        return DTYPES[self.datatype]

    def metadata(self) -> dict[str, object]:
        """The protocol's $metadata_tensor: the server batches, so the batch dimension is -1."""
        return {"name": self.name, "datatype": self.datatype, "shape": [-1, *self.shape[1:]]}
