"""End to end: `mcpd run` on a simulated board serves the bundled demo model on its socket, with
the governor's batch size and the model's stats in the status document."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import numpy as np

from mcpd.client import Client
from mcpd.demo import MODEL
from tests.support.daemon import DaemonProcess, simulated


def test_daemon_serves_the_demo_model_on_a_simulated_board(tmp_path: Path) -> None:
    sock = tmp_path / "mcpd.sock"
    cfg = tmp_path / "mcpd.toml"
    cfg.write_text(
        f'[daemon]\nsocket = "{sock}"\nstate_dir = "{tmp_path / "state"}"\n'
        f'[[models]]\nname = "demo"\npath = "{MODEL}"\nmax_batch = 4\n'
    )
    daemon = DaemonProcess(
        cfg, *simulated("jetson-orin-nano", tmp_path / "board"), log=tmp_path / "daemon.log"
    )
    try:

        def serving() -> bool:
            if not sock.exists():
                return False
            with Client(str(sock)) as client:
                return bool(client.model_ready("demo") and client.status()["inference"])

        daemon.wait_until(serving, 60, "the demo model served")
        with Client(str(sock)) as client:
            scores = client.infer("demo", {"image": np.zeros((3, 3, 64, 64), np.float32)})
            assert scores["scores"].shape == (3, 10)
            doc = client.status()
        assert doc["platform"] == "jetson-orin"
        assert 1 <= doc["batch"]["demo"] <= 4
        assert doc["inference"]["demo"]["ready"] is True
        assert doc["inference"]["demo"]["requests"] >= 1
        # The board's energy is charged to the inferences run while it was spent (mcpd/governor/energy.py):
        # with requests arriving, the figure appears within a few reports of the serving process.
        with Client(str(sock)) as client:

            def charged() -> dict[str, Any] | None:
                client.infer("demo", {"image": np.zeros((1, 3, 64, 64), np.float32)})
                entry: dict[str, Any] = client.status()["inference"]["demo"]
                return None if entry["joules_per_inference"] is None else entry

            joules = daemon.wait_until(charged, 90, "joules_per_inference", interval=0.05)[
                "joules_per_inference"
            ]
        board_w = doc["power_w"]
        assert 0 < joules < board_w * 2  # at least a few inferences a second
    finally:
        daemon.process.send_signal(signal.SIGTERM)
        assert daemon.process.wait(30) == 0, daemon.log_text()
    assert not sock.exists()  # removed on a clean stop
