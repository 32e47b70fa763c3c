"""BYTES tensors (docs/serving-protocol.md §2.1) on the real socket with a real onnxruntime string
model: JSON strings and the binary form (a 4-byte little-endian length before each element), both
ways; bytes that are not UTF-8, and serializations that do not add up, are refused by name."""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mcpd.client import Client
from mcpd.serving.tensors import deserialize_bytes, serialize_bytes
from tests.support.serving_models import strings
from tests.support.serving_server import Served, config


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    server = Served(config(tmp_path, [{"name": "s", "path": str(strings(tmp_path / "s.onnx"))}]))
    server.wait_settled()
    yield server
    server.close()


def infer(client: Client, header: dict[str, Any], *blobs: bytes) -> tuple[int, Any, bytes]:
    head = json.dumps(header).encode()
    headers = {"Inference-Header-Content-Length": str(len(head))} if blobs else {}
    reply = client.request("POST", "/v2/models/s/infer", b"".join((head, *blobs)), headers)
    split = int(reply.headers.get("Inference-Header-Content-Length", len(reply.body)))
    return reply.status, json.loads(reply.body[:split]), reply.body[split:]


def text_input(shape: list[int], **rest: Any) -> dict[str, Any]:
    return {"inputs": [{"name": "text", "datatype": "BYTES", "shape": shape, **rest}]}


def test_metadata_says_bytes(served: Served) -> None:
    with served.client() as client:
        meta = client.model_metadata("s")
    assert meta["inputs"] == [{"name": "text", "datatype": "BYTES", "shape": [-1, 2]}]
    assert meta["outputs"][0] == {"name": "echo", "datatype": "BYTES", "shape": [-1, 2]}


def test_json_strings_in_and_out(served: Served) -> None:
    with served.client() as client:
        status, body, rest = infer(client, text_input([1, 2], data=[["no", "ünï"]]))
    assert status == 200 and rest == b""
    outputs = {output["name"]: output for output in body["outputs"]}
    assert outputs["echo"] == {
        "name": "echo",
        "datatype": "BYTES",
        "shape": [1, 2],
        "data": ["no", "ünï"],
    }
    assert outputs["code"]["data"] == [0, -1]


def test_binary_in_and_out_with_the_length_prefixes(served: Served) -> None:
    text = np.array([["yes", ""], ["x" * 300, "日本"]], dtype=object)
    raw = serialize_bytes(text)
    assert raw[:7] == struct.pack("<I", 3) + b"yes"
    header = text_input([2, 2], parameters={"binary_data_size": len(raw)})
    header["outputs"] = [{"name": "echo", "parameters": {"binary_data": True}}]
    with served.client() as client:
        status, body, rest = infer(client, header, raw)
        assert status == 200
        assert body["outputs"][0]["parameters"] == {"binary_data_size": len(raw)}
        assert rest == raw  # the same serialization back: UTF-8 text, same lengths
        # mcpd.client sends numpy text as BYTES and gives BYTES back as bytes.
        out = client.infer("s", {"text": np.array([["yes", "no"]])})
    assert out["echo"].tolist() == [[b"yes", b"no"]]
    assert out["code"].tolist() == [[1, 0]]


def test_a_batch_of_string_requests(served: Served) -> None:
    with served.client() as client:
        for word, code in (("yes", 1), ("no", 0), ("maybe", -1)):
            out = client.infer("s", {"text": np.array([[word, word]], dtype=object)})
            assert out["code"].tolist() == [[code, code]]


@pytest.mark.parametrize(
    ("raw", "error"),
    [
        (
            struct.pack("<I", 2) + b"\xff\xfe" + struct.pack("<I", 0),
            "input 'text': element 0 is not UTF-8 (invalid start byte at byte 0); "
            "string tensors hold text",
        ),
        (
            struct.pack("<I", 9) + b"abc",
            "input 'text': BYTES data: element 0 of 9 bytes runs past the end of the data",
        ),
        (
            struct.pack("<I", 1) + b"a" + struct.pack("<I", 1) + b"b" + b"zz",
            "input 'text': BYTES data: 2 bytes follow the last of the 2 elements",
        ),
        (
            struct.pack("<I", 1) + b"a" + b"\x01",
            "input 'text': BYTES data: the data ends before element 1's length (2 elements)",
        ),
    ],
    ids=["not-utf8", "past-the-end", "trailing", "short-length"],
)
def test_bad_binary_bytes_are_refused_by_name(served: Served, raw: bytes, error: str) -> None:
    header = text_input([1, 2], parameters={"binary_data_size": len(raw)})
    with served.client() as client:
        status, body, _ = infer(client, header, raw)
        assert (status, body) == (400, {"error": error})
        client.infer("s", {"text": np.array([["yes", "no"]])})  # the model serves on


@pytest.mark.parametrize(
    ("data", "error"),
    [
        (["a", 1], "input 'text': BYTES data in JSON must be strings"),
        (["a"], "input 'text': 1 values in data, the shape needs 2"),
        ("ab", "input 'text': data must be a (nested or flat) JSON list"),
    ],
)
def test_bad_json_strings_are_refused(served: Served, data: object, error: str) -> None:
    with served.client() as client:
        assert infer(client, text_input([1, 2], data=data))[:2] == (400, {"error": error})


def test_deserialize_reads_what_serialize_wrote() -> None:
    elements = [b"", b"\x00\xff", "é".encode(), b"x" * 70000]
    raw = serialize_bytes(np.array(elements, dtype=object))
    assert deserialize_bytes(raw, 4) == elements


def test_a_fixed_batch_string_model_serves_a_smaller_batch(tmp_path: Path) -> None:
    model = {"name": "s", "path": str(strings(tmp_path / "s4.onnx", batch=4))}
    served = Served(config(tmp_path, [model]))
    try:
        served.wait_settled()
        with served.client() as client:
            out = client.infer("s", {"text": np.array([["no", "yes"]])})
        assert out["echo"].tolist() == [[b"no", b"yes"]]
        assert out["code"].tolist() == [[0, 1]]
    finally:
        served.close()
