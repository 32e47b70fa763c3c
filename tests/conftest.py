from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest

from tests.support.fakesys import FakeSysfs
from tests.support.waiting import wait_until

PROJECT = Path(__file__).resolve().parent.parent
FAKE_RKNN = PROJECT / "tests/serving_rknn"
"""A fake rknnlite that keeps the documented contract, in place of Rockchip's runtime."""


@pytest.fixture
def fake(tmp_path: Path) -> FakeSysfs:
    root = tmp_path / "root"
    root.mkdir()
    return FakeSysfs(root)


def _fuse_available() -> str | None:
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse on this machine"
    if shutil.which("fusermount3") is None and os.geteuid() != 0:
        return "fusermount3 missing and not root"
    try:
        import mfusepy  # noqa: F401
    except (ImportError, OSError) as exc:
        return f"mfusepy/libfuse3 unavailable: {exc}"
    return None


@pytest.fixture
def errno_overlay(tmp_path: Path) -> Iterator[Callable[[Path, dict[str, str] | Path], Path]]:
    """Mount a fixture tree through FUSE so that chosen files fail with a chosen errno: the rules
    of tests/support/fusetree.py, or a JSON file of them that is read again at every call."""
    why = _fuse_available()
    if why:
        pytest.skip(f"errno overlay needs FUSE: {why}")
    mounts: list[tuple[subprocess.Popen[bytes], Path]] = []

    def mount(source: Path, errors: dict[str, str] | Path) -> Path:
        mountpoint = tmp_path / f"fuse{len(mounts)}"
        mountpoint.mkdir()
        log = tmp_path / f"fuse{len(mounts)}.log"
        command = [
            sys.executable,
            "-m",
            "tests.support.fusetree",
            str(source),
            str(mountpoint),
            f"@{errors}" if isinstance(errors, Path) else json.dumps(errors),
        ]
        with open(log, "wb") as stderr:
            process = subprocess.Popen(command, cwd=PROJECT, stderr=stderr)
        mounts.append((process, mountpoint))

        def mounted() -> bool:
            if os.path.ismount(mountpoint):
                return True
            assert process.poll() is None, f"FUSE mount failed: {log.read_text()}"
            return False

        wait_until(mounted, 10, "the FUSE mount", interval=0.02, detail=log.read_text)
        return mountpoint

    yield mount
    for process, mountpoint in mounts:
        subprocess.run(["umount", str(mountpoint)], check=False, capture_output=True)
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture
def lite(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    monkeypatch.syspath_prepend(str(FAKE_RKNN))
    import rknnlite.api as api

    monkeypatch.setattr(api, "MACHINE", "aarch64")
    api.calls.clear()
    yield api
    for name in [n for n in sys.modules if n == "rknnlite" or n.startswith("rknnlite.")]:
        del sys.modules[name]
