"""Request decoding and response encoding: every mistake is a RequestError naming it; nothing else
ever escapes, whatever the bytes (hypothesis)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mcpd.serving import codec, responses
from mcpd.serving.errors import RequestError
from mcpd.serving.shm import SharedMemory
from mcpd.serving.tensors import DTYPES, TensorSpec, datatype_of, serialize_bytes

IMAGE = TensorSpec("image", "FP32", (-1, 3, 2))
MASK = TensorSpec("mask", "UINT8", (-1, 3))
IFACE = codec.Interface(
    (IMAGE, MASK), (TensorSpec("out", "FP32", (-1,)), TensorSpec("n", "INT64", (-1, 1))), 4, 4096
)
SHM = SharedMemory().peer(0)


def respond(
    model: str,
    request: codec.InferRequest,
    outputs: list[np.ndarray],
    specs: tuple[TensorSpec, ...],
) -> tuple[bytes, int | None]:
    return responses.respond(model, request, outputs, specs, SHM, 2**20).encode()


def body(header: dict[str, Any], *blobs: bytes) -> tuple[bytes, int | None]:
    head = json.dumps(header).encode()
    return head + b"".join(blobs), (len(head) if blobs else None)


def decode(header: dict[str, Any], *blobs: bytes) -> codec.InferRequest:
    data, length = body(header, *blobs)
    return codec.decode(data, length, IFACE, SHM)


def error(header: dict[str, Any], *blobs: bytes) -> RequestError:
    with pytest.raises(RequestError) as info:
        decode(header, *blobs)
    return info.value


def image(data: Any = None, shape: list[int] | None = None, **extra: Any) -> dict[str, Any]:
    item = {"name": "image", "datatype": "FP32", "shape": shape or [1, 3, 2], **extra}
    if data is not None:
        item["data"] = data
    return item


MASK_JSON = {"name": "mask", "datatype": "UINT8", "shape": [1, 3], "data": [1, 2, 3]}


def test_json_tensors_nested_or_flat() -> None:
    nested = decode({"id": "7", "inputs": [image([[[1, 2], [3, 4], [5, 6]]]), MASK_JSON]})
    flat = decode({"inputs": [MASK_JSON, image([1, 2, 3, 4, 5, 6])]})
    assert nested.id == "7"
    for request in (nested, flat):
        assert request.inputs[0].dtype == np.float32
        np.testing.assert_array_equal(request.inputs[0], np.arange(1, 7).reshape(1, 3, 2))
        np.testing.assert_array_equal(request.inputs[1], [[1, 2, 3]])
        assert [w.index for w in request.outputs] == [0, 1]
        assert not any(w.binary for w in request.outputs)


def test_binary_tensors_in_json_order() -> None:
    pixels = np.arange(12, dtype=np.float32).reshape(2, 3, 2)
    mask = np.array([[1, 2, 3], [4, 5, 6]], np.uint8)
    request = decode(
        {
            "inputs": [
                {
                    "name": "mask",
                    "datatype": "UINT8",
                    "shape": [2, 3],
                    "parameters": {"binary_data_size": 6},
                },
                image(shape=[2, 3, 2], parameters={"binary_data_size": 48}),
            ],
            "outputs": [{"name": "n", "parameters": {"binary_data": True}}, {"name": "out"}],
        },
        mask.tobytes(),
        pixels.tobytes(),
    )
    np.testing.assert_array_equal(request.inputs[0], pixels)
    np.testing.assert_array_equal(request.inputs[1], mask)
    assert [(w.index, w.binary) for w in request.outputs] == [(1, True), (0, False)]


def test_binary_data_output_default_and_override() -> None:
    request = decode(
        {
            "inputs": [image([0] * 6), MASK_JSON],
            "parameters": {"binary_data_output": True},
            "outputs": [{"name": "out"}, {"name": "n", "parameters": {"binary_data": False}}],
        }
    )
    assert [w.binary for w in request.outputs] == [True, False]


@pytest.mark.parametrize(
    ("header", "blobs", "message"),
    [
        ({"inputs": [image([0] * 6)]}, (), "missing input(s): mask"),
        (
            {"inputs": [MASK_JSON, {**MASK_JSON, "name": "nose"}]},
            (),
            "unknown input 'nose'; the model's inputs are image, mask",
        ),
        ({"inputs": [MASK_JSON, MASK_JSON, image([0] * 6)]}, (), "input 'mask' is given twice"),
        (
            {"inputs": [MASK_JSON, image([0] * 6, datatype="FP64")]},
            (),
            "input 'image': datatype 'FP64', expected FP32",
        ),
        (
            {"inputs": [MASK_JSON, image([0] * 8, shape=[1, 4, 2])]},
            (),
            "input 'image': shape [1, 4, 2], expected [-1, 3, 2]",
        ),
        ({"inputs": [MASK_JSON, image([0] * 6, shape=[1, 6])]}, (), "expected [-1, 3, 2]"),
        (
            {"inputs": [MASK_JSON, image([0] * 30, shape=[5, 3, 2])]},
            (),
            "input 'image': batch of 5, this model takes 1..4",
        ),
        (
            {"inputs": [MASK_JSON, image([0] * 5)]},
            (),
            "input 'image': 5 values in data, the shape needs 6",
        ),
        ({"inputs": [MASK_JSON, image([[0, 0], [0]])]}, (), "input 'image': data is ragged"),
        ({"inputs": [MASK_JSON, image(["a"] * 6)]}, (), "input 'image': data holds str"),
        (
            {"inputs": [{**MASK_JSON, "data": [1.5, 2, 3]}, image([0] * 6)]},
            (),
            "input 'mask': data holds float64 values, not UINT8",
        ),
        (
            {"inputs": [{**MASK_JSON, "data": [1, 2, 300]}, image([0] * 6)]},
            (),
            "input 'mask': values outside the range of UINT8",
        ),
        (
            {"inputs": [MASK_JSON, image()]},
            (),
            "input 'image': no data, binary_data_size or shared_memory_region",
        ),
        (
            {"inputs": [MASK_JSON, image(parameters={"binary_data_size": 20})]},
            (b"x" * 20,),
            "input 'image': binary_data_size 20, shape [1, 3, 2] needs 24",
        ),
        (
            {"inputs": [MASK_JSON, image(parameters={"binary_data_size": 24})]},
            (b"x" * 10,),
            "its binary data runs past the end of the body",
        ),
        (
            {"inputs": [MASK_JSON, image(parameters={"binary_data_size": 24})]},
            (b"x" * 30,),
            "6 bytes at the end of the body belong to no input",
        ),
        (
            {"inputs": [MASK_JSON, image([0] * 6)], "outputs": [{"name": "nope"}]},
            (),
            "unknown output 'nope'; the model's outputs are out, n",
        ),
        (
            {"inputs": [MASK_JSON, image([0] * 6)], "outputs": [{"name": "n"}, {"name": "n"}]},
            (),
            "output 'n' is requested twice",
        ),
        (
            {"inputs": [MASK_JSON, image([0] * 6)], "parameters": {"binary_data_output": "yes"}},
            (),
            "binary_data_output must be true or false",
        ),
        (
            {"inputs": [MASK_JSON, image([0] * 6, parameters={"shared_memory_region": "r"})]},
            (),
            "needs both shared_memory_region",
        ),
        (
            {
                "inputs": [
                    MASK_JSON,
                    image(
                        [0] * 6,
                        parameters={"shared_memory_region": "r", "shared_memory_byte_size": 24},
                    ),
                ]
            },
            (),
            "give data or shared memory, not both",
        ),
        (
            {
                "inputs": [
                    MASK_JSON,
                    image(parameters={"shared_memory_region": "r", "shared_memory_byte_size": 24}),
                ]
            },
            (),
            "unknown shared memory region 'r'",
        ),
        ({"inputs": []}, (), "inputs must be a non-empty list"),
        ({"inputs": [MASK_JSON, image([0] * 6)], "id": 5}, (), "id must be a string"),
        (
            {"inputs": [MASK_JSON, image([0] * 6)], "parameters": {"timeout": 1.5}},
            (),
            "parameter timeout (µs) must be an integer",
        ),
    ],
)
def test_mistakes_are_named(header: dict[str, Any], blobs: tuple[bytes, ...], message: str) -> None:
    assert message in error(header, *blobs).message


def test_batches_must_agree() -> None:
    message = error({"inputs": [MASK_JSON, image([0] * 12, shape=[2, 3, 2])]}).message
    assert message == "inputs disagree on the batch dimension: {'image': 2, 'mask': 1}"


def test_a_tensor_over_the_limit_is_413_before_any_data_is_read() -> None:
    huge = error({"inputs": [MASK_JSON, image(shape=[1, 3, 2**40])]})
    assert huge.message.startswith("input 'image': shape")  # wrong shape first
    iface = codec.Interface((TensorSpec("x", "FP32", (-1, -1)),), IFACE.outputs, 4, 4096)
    header = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2**40], "data": []}]}
    with pytest.raises(RequestError) as info:
        codec.decode(json.dumps(header).encode(), None, iface, SHM)
    assert info.value.status == 413
    assert (
        "1099511627776 elements (4398046511104 bytes) exceed the limit of 4096"
        in info.value.message
    )


def test_header_length_outside_the_body() -> None:
    with pytest.raises(RequestError, match="Inference-Header-Content-Length 99 is outside"):
        codec.decode(b"{}", 99, IFACE, SHM)


def test_malformed_json() -> None:
    with pytest.raises(RequestError, match="malformed JSON in the request"):
        codec.decode(b'{"inputs": [', None, IFACE, SHM)
    with pytest.raises(RequestError, match="must be a JSON object"):
        codec.decode(b"[1, 2]", None, IFACE, SHM)


def test_encode_json_and_binary_outputs() -> None:
    request = decode(
        {
            "id": "x1",
            "inputs": [image([0] * 6), MASK_JSON],
            "outputs": [{"name": "out"}, {"name": "n", "parameters": {"binary_data": True}}],
        }
    )
    out = np.array([0.5, 1.5], np.float32)
    n = np.array([[7], [9]], np.int64)
    payload, length = respond("m", request, [out, n], IFACE.outputs)
    assert length is not None
    header = json.loads(payload[:length])
    assert header == {
        "model_name": "m",
        "model_version": "1",
        "id": "x1",
        "outputs": [
            {"name": "out", "datatype": "FP32", "shape": [2], "data": [0.5, 1.5]},
            {
                "name": "n",
                "datatype": "INT64",
                "shape": [2, 1],
                "parameters": {"binary_data_size": 16},
            },
        ],
    }
    assert np.frombuffer(payload[length:], np.int64).tolist() == [7, 9]
    only_json, no_length = respond(
        "m", decode({"inputs": [image([0] * 6), MASK_JSON]}), [out, n], IFACE.outputs
    )
    assert no_length is None
    assert json.loads(only_json)["outputs"][1]["data"] == [7, 9]


arrays = st.sampled_from(sorted(name for name in DTYPES if name != "BYTES")).flatmap(
    lambda name: st.tuples(
        st.just(name),
        st.integers(1, 4),
        st.integers(0, 3),
        st.binary(min_size=1, max_size=64),
    )
)


@settings(max_examples=200, deadline=None)
@given(arrays)
def test_binary_round_trip_for_every_fixed_size_datatype(case: tuple[str, int, int, bytes]) -> None:
    name, rows, width, seed = case
    dtype = DTYPES[name]
    raw = (seed * (rows * width * dtype.itemsize + 1))[: rows * width * dtype.itemsize]
    if name == "BOOL":
        raw = bytes(b & 1 for b in raw)
    array = np.frombuffer(raw, dtype).reshape(rows, width)
    spec = TensorSpec("t", name, (-1, width))
    iface = codec.Interface((spec,), (spec,), 4, 4096)
    item = {
        "name": "t",
        "datatype": name,
        "shape": [rows, width],
        "parameters": {"binary_data_size": array.nbytes},
    }
    head = json.dumps({"inputs": [item], "parameters": {"binary_data_output": True}}).encode()
    request = codec.decode(head + array.tobytes(), len(head), iface, SHM)
    assert request.inputs[0].tobytes() == array.tobytes()
    payload, length = respond("m", request, [request.inputs[0]], (spec,))
    assert length is not None and payload[length:] == array.tobytes()


def extremes(dtype: np.dtype[Any]) -> list[Any]:
    """The values of a datatype with the longest JSON text."""
    if dtype.kind == "f":
        info = np.finfo(dtype)
        return [info.min, -info.smallest_subnormal, -info.tiny / 3, np.nan, -np.inf, -1 / 3]
    if dtype.kind in "iu":
        return [np.iinfo(dtype).min, np.iinfo(dtype).max]
    return [False, True]


def json_answer(values: np.ndarray, identity: str | None = None) -> tuple[bytes, int]:
    """The JSON header of an answer with `values` as its one output, and its bound."""
    spec = TensorSpec("y", datatype_of(values.dtype), (-1,))
    request = codec.InferRequest(identity, (), (codec.Wanted(0, False, None),), None)
    response = responses.respond("m", request, [values], (spec,), SHM, 2**30)
    header, length = response.encode()
    assert length is None
    return header, response.json_bytes


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(sorted(name for name in DTYPES if name != "BYTES")),
    st.binary(max_size=64),
    st.text(max_size=8) | st.none(),
)
def test_the_json_bound_is_never_below_the_json(
    name: str, seed: bytes, identity: str | None
) -> None:
    dtype = DTYPES[name]
    raw = seed[: len(seed) // dtype.itemsize * dtype.itemsize]
    values = np.concatenate([np.frombuffer(raw, dtype), np.array(extremes(dtype), dtype)])
    header, bound = json_answer(values, identity)
    assert len(header) <= bound
    expected = values.tolist()
    if dtype.kind == "f":
        expected = [v if math.isfinite(v) else responses.NON_FINITE.get(v, "NaN") for v in expected]
    assert json.loads(header)["outputs"][0]["data"] == expected


@pytest.mark.parametrize("name", sorted(name for name in DTYPES if name != "BYTES"))
def test_the_json_bound_holds_for_the_longest_values_alone(name: str) -> None:
    dtype = DTYPES[name]
    longest = max(extremes(dtype), key=lambda v: len(json.dumps(np.array(v, dtype).tolist())))
    header, bound = json_answer(np.full(100, longest, dtype))
    assert len(header) <= bound


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(), max_size=6))
def test_the_json_bound_of_strings_is_never_below_the_json(texts: list[str]) -> None:
    texts += ['\U0001f600\x01"\\\u2028']
    header, bound = json_answer(np.array(texts, dtype=object))
    assert len(header) <= bound
    assert json.loads(header)["outputs"][0]["data"] == texts


def test_json_values_are_written_a_slice_at_a_time_and_come_out_whole() -> None:
    values = np.arange(3 * responses.JSON_SLICE + 5, dtype=np.float32) / 7
    values[responses.JSON_SLICE] = np.nan
    data = json.loads(json_answer(values)[0])["outputs"][0]["data"]
    assert data[responses.JSON_SLICE] == "NaN"
    data[responses.JSON_SLICE] = float(values[responses.JSON_SLICE])
    assert np.array_equal(np.array(data, np.float32), values, equal_nan=True)


def test_outputs_too_large_for_json_leave_shared_memory_untouched(tmp_path: Path) -> None:
    (tmp_path / "obj").write_bytes(bytes(16))
    registry = SharedMemory(str(tmp_path))
    try:
        registry.register("r", "obj", 0, 16, 0)
        in_region = {"shared_memory_region": "r", "shared_memory_byte_size": 16}
        request = decode(
            {
                "inputs": [image([0] * 6), MASK_JSON],
                "outputs": [{"name": "n", "parameters": in_region}, {"name": "out"}],
            }
        )
        outputs = [np.zeros(200, np.float32), np.array([[7], [9]], np.int64)]
        with pytest.raises(RequestError, match="max_json_output_bytes") as info:
            responses.respond("m", request, outputs, IFACE.outputs, registry.peer(0), 1024)
        assert info.value.status == 413
        assert (tmp_path / "obj").read_bytes() == bytes(16)  # nothing half done
        responses.respond("m", request, outputs, IFACE.outputs, registry.peer(0), 8192)
        assert np.frombuffer((tmp_path / "obj").read_bytes(), np.int64).tolist() == [7, 9]
    finally:
        registry.close()


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
fields = st.fixed_dictionaries(
    {},
    optional={
        "name": st.sampled_from(["image", "mask", "x"]) | json_values,
        "datatype": st.sampled_from(["FP32", "UINT8", "BYTES"]) | json_values,
        "shape": st.lists(st.integers(-2, 5), max_size=4) | json_values,
        "data": st.lists(st.integers(-300, 300) | st.floats(), max_size=8) | json_values,
        "parameters": st.fixed_dictionaries(
            {},
            optional={
                "binary_data_size": st.integers(-1, 40) | json_values,
                "shared_memory_region": json_values,
                "shared_memory_byte_size": json_values,
            },
        )
        | json_values,
    },
)
requests = st.fixed_dictionaries(
    {},
    optional={
        "id": json_values,
        "inputs": st.lists(fields, max_size=3) | json_values,
        "outputs": st.lists(
            st.fixed_dictionaries({"name": st.sampled_from(["out", "n", "q"]) | json_values}),
            max_size=3,
        )
        | json_values,
        "parameters": st.dictionaries(
            st.sampled_from(["binary_data_output", "timeout"]), json_values
        ),
    },
)


@settings(max_examples=400, deadline=None)
@given(requests, st.binary(max_size=64), st.integers(-2, 200) | st.none())
def test_any_request_is_decoded_or_refused_with_a_request_error(
    header: dict[str, Any], tail: bytes, length: int | None
) -> None:
    head = json.dumps(header).encode()
    data = head + tail
    for header_length in (len(head), length):
        try:
            codec.decode(data, header_length, IFACE, SHM)
        except RequestError as exc:
            assert exc.message and exc.status in (400, 404, 413)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_any_bytes_are_refused_cleanly(data: bytes) -> None:
    try:
        codec.decode(data, None, IFACE, SHM)
    except RequestError as exc:
        assert exc.status == 400


TEXT = TensorSpec("text", "BYTES", (-1, 2))
TEXT_IFACE = codec.Interface((TEXT,), (TEXT,), 4, 4096)


@settings(max_examples=200, deadline=None)
@given(
    st.integers(1, 4).flatmap(
        lambda rows: st.lists(st.text(), min_size=2 * rows, max_size=2 * rows)
    )
)
def test_bytes_round_trip_as_text(texts: list[str]) -> None:
    raw = serialize_bytes(np.array(texts, dtype=object))
    item = {
        "name": "text",
        "datatype": "BYTES",
        "shape": [len(texts) // 2, 2],
        "parameters": {"binary_data_size": len(raw)},
    }
    head = json.dumps({"inputs": [item], "parameters": {"binary_data_output": True}}).encode()
    request = codec.decode(head + raw, len(head), TEXT_IFACE, SHM)
    assert request.inputs[0].reshape(-1).tolist() == texts  # str, as onnxruntime takes them
    payload, length = respond("m", request, [request.inputs[0]], (TEXT,))
    assert length is not None and payload[length:] == raw


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 5), st.binary(max_size=80))
def test_any_binary_bytes_tensor_is_decoded_or_refused(rows: int, tail: bytes) -> None:
    item = {
        "name": "text",
        "datatype": "BYTES",
        "shape": [rows, 2],
        "parameters": {"binary_data_size": len(tail)},
    }
    head = json.dumps({"inputs": [item]}).encode()
    try:
        request = codec.decode(head + tail, len(head), TEXT_IFACE, SHM)
    except RequestError as exc:
        assert exc.message and exc.status == 400
    else:
        assert all(isinstance(text, str) for text in request.inputs[0].reshape(-1))
