"""The real tritonclient[http] package, unchanged, against mcpd: it cannot dial a Unix socket, so
socat bridges a loopback TCP port to mcpd's socket (as a user would)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.serving_models import mixed, scale
from tests.serving_server import Served, config

httpclient = pytest.importorskip("tritonclient.http")
shm = pytest.importorskip("tritonclient.utils.shared_memory")
from tritonclient.utils import InferenceServerException  # noqa: E402


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def triton(tmp_path: Path) -> Iterator[httpclient.InferenceServerClient]:
    if shutil.which("socat") is None:
        pytest.fail("socat is missing: tests/run installs it")
    models = [
        {"name": "m", "path": str(scale(tmp_path / "scale.onnx"))},
        {"name": "mixed", "path": str(mixed(tmp_path / "mixed.onnx"))},
    ]
    served = Served(config(tmp_path, models))
    served.wait_settled()
    port = _free_port()
    bridge = subprocess.Popen(
        [
            "socat",
            f"TCP-LISTEN:{port},bind=127.0.0.1,reuseaddr,fork",
            f"UNIX-CONNECT:{served.socket}",
        ]
    )
    deadline = time.monotonic() + 10
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            assert time.monotonic() < deadline, "socat did not start"
            time.sleep(0.02)
    client = httpclient.InferenceServerClient(f"127.0.0.1:{port}")
    yield client
    client.close()
    bridge.terminate()
    bridge.wait(10)
    served.close()


def test_health_and_metadata(triton: httpclient.InferenceServerClient) -> None:
    assert triton.is_server_live()
    assert triton.is_server_ready()
    assert triton.is_model_ready("m")
    assert not triton.is_model_ready("nope")
    meta = triton.get_server_metadata()
    assert "binary_tensor_data" in meta["extensions"]
    model = triton.get_model_metadata("m")
    assert model["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}]
    with pytest.raises(InferenceServerException, match="unknown model 'nope'"):
        triton.get_model_metadata("nope")


def test_infer_binary_in_and_out(triton: httpclient.InferenceServerClient) -> None:
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    inp = httpclient.InferInput("x", [2, 4], "FP32")
    inp.set_data_from_numpy(x)  # binary by default
    result = triton.infer("m", [inp], request_id="r1")
    np.testing.assert_array_equal(result.as_numpy("double"), x * 2)
    np.testing.assert_array_equal(result.as_numpy("total"), x.sum(axis=1))
    assert result.get_response()["id"] == "r1"


def test_infer_json_and_mixed_datatypes(triton: httpclient.InferenceServerClient) -> None:
    a = np.array([[1, 2]], np.int64)
    b = np.array([[3, 4]], np.uint8)
    flag = np.array([[True]])
    inputs = []
    for name, array, datatype in (("a", a, "INT64"), ("b", b, "UINT8"), ("flag", flag, "BOOL")):
        item = httpclient.InferInput(name, list(array.shape), datatype)
        item.set_data_from_numpy(array, binary_data=False)
        inputs.append(item)
    outputs = [
        httpclient.InferRequestedOutput("a3", binary_data=False),
        httpclient.InferRequestedOutput("flag_not", binary_data=True),
    ]
    result = triton.infer("mixed", inputs, outputs=outputs)
    np.testing.assert_array_equal(result.as_numpy("a3"), a * 3)
    np.testing.assert_array_equal(result.as_numpy("flag_not"), ~flag)
    assert result.as_numpy("b_out") is None  # not requested


def test_errors_reach_the_client(triton: httpclient.InferenceServerClient) -> None:
    inp = httpclient.InferInput("x", [1, 3], "FP32")
    inp.set_data_from_numpy(np.zeros((1, 3), np.float32))
    with pytest.raises(InferenceServerException, match=r"shape \[1, 3\], expected \[-1, 4\]"):
        triton.infer("m", [inp])


def test_system_shared_memory_in_and_out(triton: httpclient.InferenceServerClient) -> None:
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    key = f"/mcpd-test-{time.monotonic_ns()}"
    region = shm.create_shared_memory_region("tensors", key, 2 * x.nbytes)
    try:
        shm.set_shared_memory_region(region, [x])
        triton.register_system_shared_memory("tensors", key, 2 * x.nbytes)
        status = triton.get_system_shared_memory_status()
        assert [(r["name"], r["key"], r["byte_size"]) for r in status] == [("tensors", key, 96)]
        inp = httpclient.InferInput("x", [3, 4], "FP32")
        inp.set_shared_memory("tensors", x.nbytes)
        out = httpclient.InferRequestedOutput("double", binary_data=True)
        out.set_shared_memory("tensors", x.nbytes, offset=x.nbytes)
        result = triton.infer("m", [inp], outputs=[out])
        params = result.get_output("double")["parameters"]
        assert params["shared_memory_region"] == "tensors"
        doubled = shm.get_contents_as_numpy(region, np.float32, [3, 4], offset=x.nbytes)
        np.testing.assert_array_equal(doubled, x * 2)
        with pytest.raises(InferenceServerException, match="already registered"):
            triton.register_system_shared_memory("tensors", key, 8)
        triton.unregister_system_shared_memory("tensors")
        assert triton.get_system_shared_memory_status() == []
    finally:
        shm.destroy_shared_memory_region(region)
