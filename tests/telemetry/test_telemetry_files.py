"""Files the telemetry thread reads (password, machine id) never block it and never kill it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mcpd.telemetry.mqtt_client import ConnectError, _password
from mcpd.telemetry.topics import device_id
from tests.support.waiting import within


def test_a_fifo_or_non_utf8_password_file_is_a_clear_error(tmp_path: Path) -> None:
    fifo = tmp_path / "pass"
    os.mkfifo(fifo)
    with pytest.raises(ConnectError, match=r"password_file .*: not a regular file \(a FIFO\)"):
        within(30, lambda: _password(str(fifo)))
    latin = tmp_path / "latin"
    latin.write_bytes(b"caf\xe9\n")
    with pytest.raises(ConnectError, match="is not UTF-8 text"):
        _password(str(latin))
    utf8 = tmp_path / "utf8"
    utf8.write_text("café\n")
    assert _password(str(utf8)) == "café"


def test_a_fifo_as_the_machine_id_falls_back_to_the_hostname(tmp_path: Path) -> None:
    fifo = tmp_path / "machine-id"
    os.mkfifo(fifo)
    assert within(30, lambda: device_id("", fifo, lambda: "board-7.lan")) == "board-7"
