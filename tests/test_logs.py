"""Log lines carry journald priority prefixes only when stderr is the journal's stream."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from mcpd.demo import MODEL
from mcpd.logs import JournalFormatter, to_journal
from tests.conftest import PROJECT
from tests.support.daemon import RunningDaemon
from tests.support.waiting import wait_until


def stream_id(path: Path) -> str:
    found = os.stat(path)
    return f"{found.st_dev}:{found.st_ino}"


def test_only_the_stream_journal_stream_names_gets_prefixes(tmp_path: Path) -> None:
    journal, other = tmp_path / "journal", tmp_path / "other"
    journal.touch()
    other.touch()
    with open(journal, "w") as stream:
        assert to_journal({"JOURNAL_STREAM": stream_id(journal)}, stream)
        assert not to_journal({"JOURNAL_STREAM": stream_id(other)}, stream)  # inherited, not ours
        assert not to_journal({}, stream)
        assert not to_journal({"JOURNAL_STREAM": "garbage"}, stream)


def test_every_line_of_a_record_carries_its_priority() -> None:
    formatter = JournalFormatter("%(levelname)s %(name)s: %(message)s")

    def line(level: int, message: str) -> str:
        return formatter.format(logging.LogRecord("mcpd", level, "", 0, message, None, None))

    assert line(logging.ERROR, "a\nb") == "<3>ERROR mcpd: a\n<3>b"
    assert line(logging.WARNING, "w") == "<4>WARNING mcpd: w"
    assert line(logging.INFO, "i") == "<6>INFO mcpd: i"
    assert line(logging.DEBUG, "d") == "<7>DEBUG mcpd: d"
    assert line(logging.CRITICAL, "c") == "<2>CRITICAL mcpd: c"


def test_mcpd_writes_prefixes_to_the_journal_stream(tmp_path: Path) -> None:
    log = tmp_path / "stderr"
    log.touch()
    with open(log, "ab") as stderr:
        env = dict(os.environ, JOURNAL_STREAM=stream_id(log))
        command = [
            sys.executable,
            "-m",
            "mcpd",
            "sim",
            "--profile",
            "rk3588",
            "--root",
            str(tmp_path / "b"),
        ]
        process = subprocess.Popen(command, cwd=PROJECT, env=env, stderr=stderr)
    try:
        wait_until(lambda: "simulating" in log.read_text(), 30, "the simulator's first line")
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=10)
    assert log.read_text().startswith("<6>INFO mcpd: simulating rk3588")


def test_the_governor_and_its_serving_process_both_prefix_their_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "daemon.log"
    log.touch()  # RunningDaemon truncates it: the same inode, so the same stream id
    monkeypatch.setenv("JOURNAL_STREAM", stream_id(log))
    config = f'[daemon]\nstate_dir = "{tmp_path / "state"}"\n[[models]]\nname = "demo"\npath = "{MODEL}"\n'
    daemon = RunningDaemon(tmp_path, config)
    try:
        daemon.wait_for(lambda: "model demo loaded" in log.read_text(), 60)
    finally:
        daemon.close()
    lines = log.read_text().splitlines()
    assert any(line.startswith("<6>INFO mcpd.serving: model demo loaded") for line in lines)
    assert any(line.startswith("<6>INFO mcpd: ready: rk3588") for line in lines)
    assert all(line[:3] in {"<2>", "<3>", "<4>", "<6>", "<7>"} for line in lines), lines
