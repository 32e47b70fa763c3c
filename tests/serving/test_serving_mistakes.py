"""Client mistakes are the client's: every one is a 400 (or 404/413) naming what is wrong, never a
500, whatever the bytes; and nothing a model computes reaches JSON as a bare NaN."""

from __future__ import annotations

import json
import math
import string
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mcpd.client import Client
from tests.support.serving_models import scale
from tests.support.serving_server import Served, config


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp_path = tmp_path_factory.mktemp("mistakes")
    models = [{"name": "m", "path": str(scale(tmp_path / "scale.onnx")), "max_batch": 4}]
    server = Served(config(tmp_path, models, max_request_bytes=2**20))
    server.wait_settled()
    yield server
    server.close()


@pytest.fixture(scope="module")
def client(served: Served) -> Iterator[Client]:
    with served.client() as c:
        yield c


def post(client: Client, path: str, body: bytes, **headers: str) -> tuple[int, str]:
    reply = client.request("POST", path, body, headers)
    return reply.status, reply.body.decode()


def infer_body(**extra: Any) -> bytes:
    item = {"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}
    return json.dumps({"inputs": [item], **extra}).encode()


# http.client sends header values as Latin-1: these are the UTF-8 bytes of "2²" on the wire.
UTF8_DIGIT = "2²".encode().decode("latin-1")
DEEP = b'{"inputs": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"


@pytest.mark.parametrize(
    ("path", "body", "headers", "message"),
    [
        (
            "/v2/models/m/infer",
            infer_body(),
            {"Inference-Header-Content-Length": UTF8_DIGIT},
            "Inference-Header-Content-Length '2²' is not a number",
        ),
        ("/v2/models/m/infer", DEEP, {}, "JSON nested too deep"),
        (
            "/v2/systemsharedmemory/region/r/register",
            b'{"key": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
            {},
            "JSON nested too deep",
        ),
        (
            "/v2/models/m/infer",
            infer_body(parameters={"timeout": 10**400}),
            {},
            "parameter timeout",
        ),
        ("/v2/models/m/infer", infer_body(parameters={"timeout": -5}), {}, "parameter timeout"),
        (
            "/v2/systemsharedmemory/region/r/register",
            b'{"key": "a\\u0000b", "byte_size": 8}',
            {},
            "key 'a\\x00b'",
        ),
        (
            "/v2/systemsharedmemory/region/r/register",
            b'{"key": "a\\ud800", "byte_size": 8}',
            {},
            "key 'a\\ud800'",
        ),
        (
            "/v2/systemsharedmemory/region/r/register",
            b'{"key": "k", "byte_size": 8, "offset": 100000000000000000000}',
            {},
            "offset",
        ),
        (
            "/v2/models/m/infer",
            json.dumps(
                {
                    "inputs": [
                        {
                            "name": "x",
                            "datatype": "FP32",
                            "shape": [1, 4],
                            "parameters": {
                                "shared_memory_region": "r",
                                "shared_memory_byte_size": 16,
                                "shared_memory_offset": 2**70,
                            },
                        }
                    ]
                }
            ).encode(),
            {},
            "shared_memory_offset",
        ),
    ],
)
def test_each_mistake_is_a_400_naming_the_field(
    client: Client, path: str, body: bytes, headers: dict[str, str], message: str
) -> None:
    status, text = post(client, path, body, **headers)
    assert status == 400, text
    assert message in json.loads(text)["error"]


def test_an_error_quotes_a_huge_value_briefly(client: Client) -> None:
    status, text = post(client, "/v2/models/m/infer", infer_body(id=[[[[[[[[1]]]]]]]] * 5000))
    assert status == 400 and "id must be a string" in text
    assert len(text) < 300


def test_nan_and_infinity_reach_json_as_strings(client: Client) -> None:
    x = np.array([[math.nan, math.inf, -math.inf, 1.5]], np.float32)
    body = json.dumps(
        {
            "inputs": [
                {
                    "name": "x",
                    "datatype": "FP32",
                    "shape": [1, 4],
                    "parameters": {"binary_data_size": 16},
                }
            ],
            "outputs": [{"name": "double"}],
        }
    ).encode()
    reply = client.request(
        "POST",
        "/v2/models/m/infer",
        body + x.tobytes(),
        {"Inference-Header-Content-Length": str(len(body))},
    )
    assert reply.status == 200
    text = reply.body.decode()
    assert "NaN," not in text and "Infinity," not in text
    # The strings protobuf's JSON mapping uses for non-finite floats.
    assert json.loads(text)["outputs"][0]["data"] == ["NaN", "Infinity", "-Infinity", 3.0]
    # ...which mcpd.client (and numpy) read back as the floats they stand for.
    np.testing.assert_array_equal(reply.outputs()["double"], 2 * x)


# -- fuzzing: documents shaped like requests, odd values in every field ---------------------------

ODD: list[object] = [
    10**400,
    -(10**400),
    2**63,
    2**64,
    -1,
    0,
    1,
    True,
    None,
    math.nan,
    math.inf,
    -0.0,
    1e308,
    "",
    "\0",
    "\ud800",
    "²",
    "x",
    "r",
    "/",
    "..",
    [],
    {},
    [[[]]],
    [1, 2, 3, 4],
]
scalars = st.sampled_from(ODD) | st.integers() | st.floats() | st.text(max_size=8)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)


def fields(*keys: str) -> st.SearchStrategy[dict[str, object]]:
    """Mostly none or one, so that a request is often valid but for one field."""
    return st.just({}) | st.dictionaries(st.sampled_from(keys), scalars | values, max_size=2)


TENSOR_PARAMETERS = (
    "binary_data_size",
    "binary_data",
    "shared_memory_region",
    "shared_memory_byte_size",
    "shared_memory_offset",
)
VALID = {"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}
# A valid input with some fields replaced, so that decoding gets past the first check.
tensors = st.builds(
    lambda changed, parameters: {**VALID, **changed, "parameters": parameters},
    fields("name", "datatype", "shape", "data", "parameters"),
    fields(*TENSOR_PARAMETERS),
)
outputs = st.just({"name": "double"}) | st.builds(
    lambda changed, parameters: {"name": "double", **changed, "parameters": parameters},
    fields("name", "parameters"),
    fields(*TENSOR_PARAMETERS),
)
requests = st.fixed_dictionaries(
    {"inputs": st.lists(tensors, min_size=1, max_size=1) | st.lists(tensors, max_size=3)},
    optional={
        "outputs": st.lists(outputs, max_size=2),
        "parameters": fields("timeout", "binary_data_output", "priority"),
        "id": st.text(max_size=8) | st.text(max_size=8) | scalars,
    },
)


def strict(constant: str) -> object:
    raise AssertionError(f"{constant} is not JSON")


def no_server_error(status: int, text: str) -> None:
    assert status < 500, text
    if text:
        json.loads(text, parse_constant=strict)


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    document=requests | values,
    binary=st.binary(max_size=40),
    split=st.sampled_from([None, None, "exact"]) | st.integers(-1, 200),
)
def test_fuzzed_infer_requests_never_get_a_5xx(
    client: Client, document: object, binary: bytes, split: int | str | None
) -> None:
    header = json.dumps(document).encode()
    if split is None:
        binary = b""
    length = (
        {}
        if split is None
        else {"Inference-Header-Content-Length": str(len(header) if split == "exact" else split)}
    )
    status, text = post(client, "/v2/models/m/infer", header + binary, **length)
    if status == 503 and _asks_a_timeout(document):
        # The request's own timeout (microseconds) can expire before its batch runs: a 503 by
        # design (README, Limits: "the request timed out"), the client's choice, not a fault.
        assert "timed out" in text, text
        return
    no_server_error(status, text)


def _asks_a_timeout(document: object) -> bool:
    parameters = document.get("parameters") if isinstance(document, dict) else None
    return isinstance(parameters, dict) and "timeout" in parameters


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    document=fields("key", "offset", "byte_size") | values,
    region=st.text(alphabet=string.ascii_letters + "-_.%", min_size=1, max_size=8),
)
def test_fuzzed_registrations_never_get_a_5xx(
    client: Client, served: Served, document: object, region: str
) -> None:
    base = f"/v2/systemsharedmemory/region/{region}"
    no_server_error(*post(client, f"{base}/register", json.dumps(document).encode()))
    no_server_error(*post(client, f"{base}/unregister", b""))
