"""`mcpd reload` (systemd's ExecReload): signals the real `mcpd run` and waits for its verdict."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from mcpd.governor import reloading
from tests.conftest import PROJECT
from tests.support.boards import POLICY4
from tests.support.configs import HOSTILE
from tests.support.daemon import RunningDaemon


@pytest.fixture
def running(tmp_path: Path) -> Iterator[RunningDaemon]:
    d = RunningDaemon(
        tmp_path, f'[daemon]\nstate_dir = "{tmp_path / "state"}"\nlog_level = "error"\n'
    )
    d.receive(lambda m: m.startswith("READY=1"))
    yield d
    d.close()


def reload(d: RunningDaemon, *args: str) -> subprocess.CompletedProcess[str]:
    command = [
        sys.executable,
        "-m",
        "mcpd",
        "reload",
        "--pid",
        str(d.process.pid),
        "--runtime-dir",
        str(d.root / "run/mcpd"),
        *args,
    ]
    return subprocess.run(command, cwd=PROJECT, capture_output=True, text=True, timeout=60)


def test_reload_waits_for_the_verdict_and_fails_on_a_rejected_config(
    running: RunningDaemon, tmp_path: Path
) -> None:
    d = running
    state = f'[daemon]\nstate_dir = "{tmp_path / "state"}"\n'
    d.config.write_text(state + "[governor]\ntemp_high_c = 110.0\ntemp_low_c = 100.0\n")
    good = reload(d)
    assert (good.returncode, good.stdout) == (0, "configuration reloaded\n"), good.stderr
    # The accepted verdict is still on disk: the next reload must wait for its own.
    d.config.write_bytes(state.encode() + b'log_level = "\xff"\n')
    bad = reload(d)
    assert bad.returncode == 1
    assert bad.stderr == f"{d.config}: not UTF-8 text: byte 0xff at offset {len(state) + 13}\n"
    assert d.process.poll() is None
    d.wait_for(lambda: d.cap(POLICY4) == 2400000)  # the accepted config governs on
    d.drain()
    d.receive(lambda m: m.startswith("STATUS="), timeout=3)
    log = d.log.read_text()
    assert log.count("reload rejected") == 1 and "Traceback" not in log


def test_a_changed_log_level_applies_on_reload(running: RunningDaemon, tmp_path: Path) -> None:
    d = running
    assert "configuration reloaded" not in d.log.read_text()  # started at log_level "error"
    d.config.write_text(f'[daemon]\nstate_dir = "{tmp_path / "state"}"\nlog_level = "info"\n')
    assert reload(d).returncode == 0
    assert "INFO mcpd: configuration reloaded" in d.log.read_text()


def test_a_verdict_older_than_the_request_is_not_the_answer(tmp_path: Path) -> None:
    old = reloading.Verdict(os.getpid(), 0.0, True, "an earlier reload")
    reloading.write(tmp_path, old)
    now = [100.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(reloading.os, "kill", lambda pid, sig: None)
        assert (
            reloading.request(os.getpid(), tmp_path, 1.0, clock=lambda: now[0], sleep=sleep) is None
        )
        fresh = reloading.Verdict(os.getpid(), 100.5, False, "rejected")
        patch.setattr(reloading, "read", lambda folder: fresh)
        now[0] = 100.0
        assert (
            reloading.request(os.getpid(), tmp_path, 1.0, clock=lambda: now[0], sleep=sleep)
            == fresh
        )


def test_a_verdict_file_that_is_not_a_verdict_is_no_answer(tmp_path: Path) -> None:
    # 60 000 '[' is under the verdict's 64 KiB bound: json's RecursionError ended `mcpd reload`.
    for content in (b"[" * 60_000, b"[1, 2]", b'{"pid": "x"}', b"\xff"):
        (tmp_path / reloading.VERDICT_FILE).write_bytes(content)
        assert reloading.read(tmp_path) is None, content[:10]


def test_reload_of_a_process_that_is_gone_says_so(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    command = [
        sys.executable,
        "-m",
        "mcpd",
        "reload",
        "--pid",
        done.stdout.strip(),
        "--runtime-dir",
        str(tmp_path),
    ]
    result = subprocess.run(command, cwd=PROJECT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "cannot signal process" in result.stderr


def test_hostile_files_are_rejected_and_the_daemon_governs_on(
    running: RunningDaemon, tmp_path: Path
) -> None:
    d = running
    for name in ("UTF-16 with a BOM", "5 000-digit integer", "arrays 10 000 deep"):
        d.config.write_bytes(HOSTILE[name])
        result = reload(d)
        assert result.returncode == 1 and result.stderr.startswith(f"{d.config}: "), name
    d.config.unlink()
    os.mkfifo(d.config)
    result = reload(d)
    assert result.stderr == f"{d.config}: not a regular file (a FIFO)\n"
    d.config.unlink()
    d.config.mkdir()
    assert reload(d).stderr == f"{d.config}: not a regular file (a directory)\n"
    d.config.rmdir()
    d.config.write_text(f'[daemon]\nstate_dir = "{tmp_path / "state"}"\n')
    assert reload(d).returncode == 0
    d.drain()
    d.receive(lambda m: m.startswith("STATUS="), timeout=3)
    assert "Traceback" not in d.log.read_text()
