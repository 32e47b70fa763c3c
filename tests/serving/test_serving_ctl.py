"""mcpctl status/models/infer/top against a served model, and the client's errors."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from mcpd.client import Client, ServerError
from mcpd.ctl import main
from mcpd.ctl.status import format_status
from mcpd.ctl.top import render
from tests.support.serving_models import scale
from tests.support.serving_server import Served, config, status_document


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    models = [
        {"name": "m", "path": str(scale(tmp_path / "scale.onnx"))},
        {"name": "broken", "path": str(tmp_path / "none.onnx")},
    ]
    server = Served(config(tmp_path, models))
    server.wait_settled()
    yield server
    server.close()


def test_status_table_and_json(served: Served, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status", "--socket", served.socket]) == 0
    table = capsys.readouterr().out
    assert "temperature  61.5 °C" in table and "governor     holding" in table
    assert (
        "cooling      normal: 6.41 °C/W (baseline 6.38, x1.00), time constant 36 s, "
        "confidence 0.97\n" in table
    )
    assert "policy0            cpufreq         1510      1200        115-1510" in table
    assert main(["status", "--socket", served.socket, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == status_document()


def test_the_cooling_line_says_what_is_known() -> None:
    learning = {"state": "learning", "thermal_resistance_c_per_w": 6.5, "time_constant_s": 35.0}
    assert "cooling      learning: 6.50 °C/W, time constant 35 s, confidence -\n" in format_status(
        {"cooling": learning}
    )
    fresh = {"state": "learning", "thermal_resistance_c_per_w": None}
    assert "cooling      learning (no window fitted yet)\n" in format_status({"cooling": fresh})
    assert "cooling      off\n" in format_status({"cooling": {"state": "off"}})
    assert "cooling      -" in format_status({})  # an older daemon's document has none


def test_models_lists_state_reason_and_tensors(
    served: Served, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["models", "--socket", served.socket]) == 0
    out = capsys.readouterr().out
    assert "broken  UNAVAILABLE  model file" in out
    assert "m  READY\n  platform onnxruntime_onnx\n  inputs   x FP32[-1,4]\n" in out


def test_infer_from_npy_files(
    served: Served, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    np.save(tmp_path / "x.npy", np.arange(8, dtype=np.float32).reshape(2, 4))
    argv = ["infer", "m", "--socket", served.socket, "--input", f"x={tmp_path / 'x.npy'}"]
    assert main([*argv, "--output", "total"]) == 0
    assert capsys.readouterr().out == "total  float32 [2]  [ 6., 22.]\n"
    assert main([*argv, "--output-dir", str(tmp_path / "out")]) == 0
    np.testing.assert_array_equal(
        np.load(tmp_path / "out/double.npy"), np.arange(8).reshape(2, 4) * 2
    )
    assert main(["infer", "m", "--socket", served.socket, "--input", "x"]) == 2
    assert "expected NAME=FILE.npy" in capsys.readouterr().err
    assert (
        main(["infer", "broken", "--socket", served.socket, "--input", f"x={tmp_path / 'x.npy'}"])
        == 1
    )
    assert "mcpd says 503: model 'broken' is not ready" in capsys.readouterr().err


def test_top_frames(served: Served, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["top", "--socket", served.socket, "--count", "1", "--plain"]) == 0
    frame = capsys.readouterr().out
    assert "temp 61.5 °C   power 7.25 W   governor holding" in frame
    before = {"inference": {"m": {"requests": 10}}}
    after = {
        **status_document(),
        "inference": {
            "m": {
                "ready": True,
                "requests": 40,
                "p50_ms": 1.25,
                "p99_ms": 3.5,
                "queue_depth": 2,
                "errors": 1,
            }
        },
    }
    line = next(r for r in render(after, before, 2.0).splitlines() if r.startswith("m "))
    assert line.split() == ["m", "4", "15.0", "1.25", "3.50", "2", "1"]
    assert "████████████████████████ cap   1510 /   1510 MHz" in render(after, None, 0)


def test_no_daemon_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status", "--socket", str(tmp_path / "none.sock")]) == 1
    assert capsys.readouterr().err.startswith(
        f"mcpctl: cannot talk to mcpd on {tmp_path}/none.sock"
    )


def test_client_reconnects_and_reports_server_errors(served: Served) -> None:
    with Client(served.socket) as client:
        assert client.ready() is False  # "broken" never loads
        client.close()  # a dropped keep-alive connection is reopened
        out = client.infer("m", {"x": np.ones((1, 4), np.float32)}, outputs=["double"])
        assert list(out) == ["double"]
        with pytest.raises(ServerError) as info:
            client.model_metadata("nope")
        assert (info.value.status, info.value.message) == (404, "unknown model 'nope'")


def test_client_recovers_after_the_socket_appears(tmp_path: Path) -> None:
    """A client made before mcpd binds its socket works once it is there (the demo's load does
    exactly this while the daemon starts)."""
    import socket as sockets

    path = tmp_path / "late.sock"
    client = Client(str(path), timeout=5.0)
    with pytest.raises(FileNotFoundError):
        client.live()
    server = sockets.socket(sockets.AF_UNIX, sockets.SOCK_STREAM)
    server.bind(str(path))
    server.listen(1)

    def answer() -> None:
        connection, _ = server.accept()
        with connection:
            connection.recv(65536)
            connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")

    thread = threading.Thread(target=answer)
    thread.start()
    assert client.live()
    thread.join()
    client.close()
    server.close()
