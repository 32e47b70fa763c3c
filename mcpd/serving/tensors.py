"""Tensor descriptions and the protocol's datatype names (docs/serving-protocol.md §1.4).

BYTES (variable-length strings) and BF16 (no numpy dtype) are not served: a model using them fails
to load with a message that says so.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

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
}
DATATYPES: dict[np.dtype[np.generic], str] = {dtype: name for name, dtype in DTYPES.items()}


def datatype_of(dtype: np.dtype[np.generic]) -> str:
    try:
        return DATATYPES[dtype]
    except KeyError:
        raise ValueError(f"numpy dtype {dtype} has no protocol datatype") from None


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
