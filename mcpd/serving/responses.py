"""Inference responses out (docs/serving-protocol.md §1.3, §2.1, §2.2): outputs in shared memory,
as binary tensor data after the JSON header, or as JSON values in it.

JSON values cost far more than the tensor: one ~10 KB request for a model with a large output cost
726 MB and held the event loop 3.7 s while its answer was encoded (issue 26). So the JSON is
bounded from the outputs' shapes and datatypes before anything is written (`[daemon]
max_json_output_bytes`, 413 beyond it), and written apart from everything else
(`InferResponse.encode`, pure, for another thread), a slice of values at a time, so that the
values never exist whole as Python objects, and a thread that writes them lets the event loop in
between slices.
"""

from __future__ import annotations

import io
import json
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from mcpd.serving.codec import VERSION, InferRequest
from mcpd.serving.errors import RequestError
from mcpd.serving.shm import PeerMemory, ShmRef
from mcpd.serving.tensors import TensorSpec, datatype_of, serialize_bytes

NON_FINITE = {math.inf: "Infinity", -math.inf: "-Infinity"}
"""JSON has no NaN or infinities: they go out as the strings protobuf's JSON mapping uses
(https://protobuf.dev/programming-guides/json/, "NaN", "Infinity", "-Infinity")."""
JSON_SLICE = 4096
"""Values written at a time: 2.2 ms of FP32 on a 2-core x86, the longest the event loop waits for a
thread that writes JSON (Python lets another thread in only between such calls into C)."""
FLOAT_CHARS = len("-2.2250738585072014e-308")
"""The longest text of a float (any of FP16/FP32/FP64 goes out as a Python float): a sign, 17
significant digits, a point and a three-digit exponent; "-Infinity" in quotes is shorter."""
CHAR_ESCAPE = len("\\ud83d\\ude00")
"""The most JSON text one character of a string takes: outside the BMP, two escaped surrogates."""


_VALUES = json.JSONEncoder(separators=(",", ":"), allow_nan=False)
"""Made once: json.dumps with options makes one per call (it keeps nothing between calls)."""


def _text(value: str) -> bytes:
    """A JSON string."""
    return json.encoder.encode_basestring_ascii(value).encode()


def _value_chars(dtype: np.dtype[Any]) -> int:
    """The longest JSON text of one value of a fixed-size datatype, and its comma."""
    if dtype.kind == "f":
        return FLOAT_CHARS + 1
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return max(len(str(info.min)), len(str(info.max))) + 1
    return len("false") + 1


def _json_bound(flat: np.ndarray) -> int:
    """At most this many bytes of JSON text for the values of `flat`: from its datatype and size
    alone, or for strings from their lengths (quotes, comma and the longest escape of each
    character)."""
    if flat.dtype.kind == "O":
        return 2 + sum(CHAR_ESCAPE * len(element) + 3 for element in flat.tolist())
    return 2 + flat.size * _value_chars(flat.dtype)


def _json_values(flat: np.ndarray) -> list[Any]:
    values: list[Any] = flat.tolist()
    if flat.dtype.kind != "f" or np.isfinite(flat).all():
        return values
    return [v if math.isfinite(v) else NON_FINITE.get(v, "NaN") for v in values]


def _json_text(flat: np.ndarray) -> Iterator[bytes]:
    """The JSON list of the values of `flat`, in pieces of JSON_SLICE values."""
    yield b"["
    for start in range(0, flat.size, JSON_SLICE):
        if start:
            yield b","
        yield _VALUES.encode(_json_values(flat[start : start + JSON_SLICE]))[1:-1].encode()
    yield b"]"


@dataclass(frozen=True)
class InferResponse:
    """An answer whose tensors are out (in shared memory, or serialized as binary data) but whose
    JSON values are not written yet."""

    header: tuple[bytes | np.ndarray, ...]
    """The JSON header in order: its text, and between the pieces the flat outputs whose values
    go there."""
    blobs: tuple[bytes, ...]
    """The binary outputs, after the header."""
    json_bytes: int
    """At most this many bytes of JSON header."""

    def encode(self) -> tuple[bytes, int | None]:
        """The body, and the JSON header's length where binary tensors follow it. Touches nothing
        but this answer, so it may run in another thread."""
        # One buffer that grows, whose bytes getvalue() hands over without a copy: a list of
        # pieces joined at the end would hold the text twice.
        body = io.BytesIO()
        for part in self.header:
            if isinstance(part, bytes):
                body.write(part)
            else:
                body.writelines(_json_text(part))
        if not self.blobs:
            return body.getvalue(), None
        length = body.tell()
        body.writelines(self.blobs)
        return body.getvalue(), length


def respond(
    model: str,
    request: InferRequest,
    outputs: Sequence[np.ndarray],
    specs: Sequence[TensorSpec],
    shm: PeerMemory,
    json_limit: int,
) -> InferResponse:
    """Serialize the binary outputs and write those asked for in shared memory there, leaving the
    JSON values to InferResponse.encode; nothing is written if the JSON could take more than
    `json_limit` bytes ([daemon] max_json_output_bytes): RequestError 413."""
    header: list[bytes | np.ndarray] = [
        b'{"model_name":%s,"model_version":"%s","outputs":[' % (_text(model), VERSION.encode())
    ]
    blobs = []
    shared: list[tuple[ShmRef, bytes]] = []
    for position, want in enumerate(request.outputs):
        array = np.ascontiguousarray(outputs[want.index])
        # Written out rather than through json: a JSONEncoder made per object would cost the
        # event loop more than all the rest of this for a small answer.
        item = b'%s{"name":%s,"datatype":"%s","shape":[%s]' % (
            b"," if position else b"",
            _text(specs[want.index].name),
            datatype_of(array.dtype).encode(),
            ",".join(map(str, array.shape)).encode(),
        )
        if want.shm is not None or want.binary:
            raw = serialize_bytes(array) if array.dtype.kind == "O" else array.tobytes()
        if want.shm is not None:
            # Name, datatype and shape only, as Triton answers (docs/serving-protocol.md §8.5):
            # perf_analyzer fails on a parameters object here.
            shared.append((want.shm, raw))
            header.append(item + b"}")
        elif want.binary:
            blobs.append(raw)
            header.append(item + b',"parameters":{"binary_data_size":%d}}' % len(raw))
        else:
            header += [item + b',"data":', array.reshape(-1), b"}"]
    identity = b"" if request.id is None else b',"id":' + _text(request.id)
    header.append(b"]" + identity + b"}")
    size = sum(len(part) if isinstance(part, bytes) else _json_bound(part) for part in header)
    if size > json_limit:
        raise RequestError(
            f"the outputs as JSON could take {size} bytes, over the limit of {json_limit} bytes "
            "([daemon] max_json_output_bytes); ask for them as binary data (parameter "
            "binary_data_output, or binary_data per output) or in shared memory",
            413,
        )
    for ref, raw in shared:
        shm.write(ref, np.frombuffer(raw, np.uint8))
    return InferResponse(tuple(header), tuple(blobs), size)
