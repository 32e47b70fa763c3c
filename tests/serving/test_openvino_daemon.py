"""End to end: `mcpd run` on a simulated x86 board serves an OpenVINO IR from its serving process,
and the status document (to its contract), /metrics, `mcpctl status`, `mcpctl models` and
`mcpd probe` say how OpenVINO runs it; without OpenVINO, probe says so."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import openvino
import pytest

from mcpd import ctl
from mcpd.client import Client
from mcpd.shapes import mismatches
from mcpd.status import StatusDocument
from tests.conftest import PROJECT
from tests.support.daemon import DaemonProcess, simulated
from tests.support.openvino_cpu import BLOCKED, DEFAULT_PRECISION
from tests.support.serving_models import ir, scale

CAPABILITIES = [str(c) for c in openvino.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")]


def test_the_daemon_serves_an_ir_and_every_report_names_device_and_precision(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sock = tmp_path / "mcpd.sock"
    cfg = tmp_path / "mcpd.toml"
    model = ir(scale(tmp_path / "scale.onnx"), precision="f32")
    cfg.write_text(
        f'[daemon]\nsocket = "{sock}"\nstate_dir = "{tmp_path / "state"}"\n'
        f'[[models]]\nname = "ov"\npath = "{model}"\n[models.openvino]\nthreads = 1\n'
    )
    daemon = DaemonProcess(
        cfg, *simulated("x86-intel", tmp_path / "board"), log=tmp_path / "daemon.log"
    )
    try:
        daemon.wait_until(lambda: sock.exists() and _ready(str(sock)), 60, "the IR served")
        with Client(str(sock)) as client:
            x = np.ones((3, 4), np.float32)
            np.testing.assert_array_equal(client.infer("ov", {"x": x})["double"], 2 * x)
            document = client.status()
            metrics = client.metrics()
        assert mismatches(document, StatusDocument) == []
        wanted = {"device": "CPU", "precision": "f32", "capabilities": CAPABILITIES}
        assert document["inference"]["ov"]["openvino"] == wanted
        info = [line for line in metrics.splitlines() if line.startswith("mcpd_model_backend_info")]
        assert info == [
            'mcpd_model_backend_info{backend="openvino",capabilities="'
            + ",".join(CAPABILITIES)
            + '",device="CPU",model="ov",precision="f32",provider=""} 1.0'
        ]
        assert ctl.main(["status", "--socket", str(sock)]) == 0
        assert "  OpenVINO CPU f32" in capsys.readouterr().out
        assert ctl.main(["models", "--socket", str(sock)]) == 0
        runs_on = f"  runs on  OpenVINO CPU, f32 (the device runs {', '.join(CAPABILITIES)})"
        assert runs_on in capsys.readouterr().out.splitlines()
        assert ctl.main(["models", "--socket", str(sock), "--json"]) == 0
        assert json.loads(capsys.readouterr().out)[0]["openvino"] == wanted
    finally:
        daemon.process.send_signal(signal.SIGTERM)
        assert daemon.process.wait(30) == 0, daemon.log_text()


def _ready(sock: str) -> bool:
    with Client(sock) as client:
        return client.model_ready("ov") and "ov" in client.status()["inference"]


def probe(*args: str, blocked: bool = False) -> subprocess.CompletedProcess[str]:
    code = (BLOCKED if blocked else "") + "import sys; from mcpd.cli import main; sys.exit(main())"
    return subprocess.run(
        [sys.executable, "-c", code, "probe", "--sysfs-root", "/", *args],
        cwd=PROJECT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )


def test_probe_names_openvinos_devices_and_says_when_it_is_not_installed() -> None:
    report = json.loads(probe("--json").stdout)["openvino"]
    assert report["version"] == openvino.__version__.split("-")[0]
    cpu = {
        "name": "CPU",
        "full_name": openvino.Core().get_property("CPU", "FULL_DEVICE_NAME"),
        "capabilities": CAPABILITIES,
        "default_precision": DEFAULT_PRECISION,
    }
    assert cpu in report["devices"]
    assert "\nopenvino     " + report["version"] + ": CPU (" in probe().stdout
    assert json.loads(probe("--json", blocked=True).stdout)["openvino"] is None
    assert "\nopenvino     not installed\n" in probe(blocked=True).stdout
