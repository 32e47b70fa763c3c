"""mcpctl's command line: global options before the subcommand, and output fit for a pipe."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from mcpd.ctl import main
from tests.support.serving_models import scale
from tests.support.serving_server import Served, config


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    server = Served(config(tmp_path, [{"name": "m", "path": str(scale(tmp_path / "scale.onnx"))}]))
    server.wait_settled()
    yield server
    server.close()


def test_socket_goes_before_the_subcommand_too(
    served: Served, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--socket", served.socket, "status"]) == 0
    assert "61.5 °C" in capsys.readouterr().out
    assert main(["status", "--socket", served.socket]) == 0  # after it, as before
    assert main(["--socket", "/nowhere.sock", "status"]) == 1
    assert "cannot talk to mcpd on /nowhere.sock" in capsys.readouterr().err


def test_top_into_a_pipe_writes_no_terminal_codes(
    served: Served, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["top", "--socket", served.socket, "--count", "2", "--interval", "0.01"]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out
    assert out.count("governor holding") == 2
