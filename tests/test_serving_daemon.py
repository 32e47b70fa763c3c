"""End to end: `mcpd run` on a simulated board serves the bundled demo model on its socket, with
the governor's batch size and the model's stats in the status document."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from mcpd.client import Client
from mcpd.demo import MODEL
from tests.conftest import PROJECT


def test_daemon_serves_the_demo_model_on_a_simulated_board(tmp_path: Path) -> None:
    sock = tmp_path / "mcpd.sock"
    cfg = tmp_path / "mcpd.toml"
    cfg.write_text(
        f'[daemon]\nsocket = "{sock}"\nstate_dir = "{tmp_path / "state"}"\n'
        f'[[models]]\nname = "demo"\npath = "{MODEL}"\nmax_batch = 4\n'
    )
    log = tmp_path / "daemon.log"
    command = [
        sys.executable,
        "-m",
        "mcpd",
        "run",
        "--config",
        str(cfg),
        "--simulate",
        "jetson-orin-nano",
        "--sim-root",
        str(tmp_path / "board"),
    ]
    with open(log, "wb") as stderr:
        process = subprocess.Popen(command, cwd=PROJECT, stderr=stderr, env=dict(os.environ))
    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, log.read_text()
            if sock.exists():
                with Client(str(sock)) as client:
                    if client.model_ready("demo") and client.status()["inference"]:
                        break
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        with Client(str(sock)) as client:
            scores = client.infer("demo", {"image": np.zeros((3, 3, 64, 64), np.float32)})
            assert scores["scores"].shape == (3, 10)
            doc = client.status()
        assert doc["platform"] == "jetson-orin"
        assert 1 <= doc["batch"]["demo"] <= 4
        assert doc["inference"]["demo"]["ready"] is True
        assert doc["inference"]["demo"]["requests"] >= 1
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0, log.read_text()
    assert not sock.exists()  # removed on a clean stop
