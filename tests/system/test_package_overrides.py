"""The package's drop-in for JetPack's onnxruntime-gpu: the .pth that build-deb puts in the bundled
site-packages makes /opt/mcpd/overrides (the venv's `overrides` folder) come before them, in the
isolated mode (-I) the package's wrappers run Python in."""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from tests.conftest import PROJECT


def test_a_package_in_overrides_shadows_the_bundled_one(tmp_path: Path) -> None:
    venv = tmp_path / "opt-mcpd"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    relative = Path(sysconfig.get_path("purelib")).relative_to(sysconfig.get_paths()["data"])
    site = venv / relative
    shutil.copy(PROJECT / "packaging/mcpd-overrides.pth", site)
    for folder, where in ((site, "bundled"), (venv / "overrides", "overrides")):
        (folder / "onnxruntime").mkdir(parents=True)
        (folder / "onnxruntime/__init__.py").write_text(f"WHERE = {where!r}\n")
    run = [
        str(venv / "bin/python"),
        "-I",
        "-B",
        "-c",
        "import onnxruntime; print(onnxruntime.WHERE)",
    ]
    assert subprocess.run(run, capture_output=True, text=True, check=True).stdout == "overrides\n"
    shutil.rmtree(venv / "overrides")  # without a drop-in, the bundled one serves
    assert subprocess.run(run, capture_output=True, text=True, check=True).stdout == "bundled\n"
