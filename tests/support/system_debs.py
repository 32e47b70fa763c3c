"""Building mcpd's Debian packages for the system tests, and reading what lintian says of them."""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path

TOP = Path(__file__).resolve().parent.parent.parent
OUT = TOP / "build" / "system-test" / "deb"


@functools.cache
def build(dist: str, arch: str, *options: str) -> Path:
    """packaging/build-deb for one target (with `options`, e.g. --openvino), once per test run
    (gzip: the same contents, faster)."""
    out = OUT / "-".join((dist, arch, *(option.strip("-") for option in options)))
    command = [str(TOP / "packaging/build-deb"), "--dist", dist, "--arch", arch, "--fast", *options]
    result = subprocess.run(
        [*command, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert result.returncode == 0, f"build-deb failed:\n{result.stdout}{result.stderr}"
    (deb,) = out.glob(f"mcpd_*_{arch}.deb")
    return deb


def lintian(deb: Path) -> list[str]:
    """Errors and warnings that the package's overrides do not explain."""
    result = subprocess.run(
        ["lintian", "--tag-display-limit", "0", str(deb)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    # Exit status 1 means "tags were emitted" (overridden ones included): judge by the lines.
    assert result.returncode in (0, 1), f"lintian failed:\n{result.stderr}"
    return [line for line in result.stdout.splitlines() if line.startswith(("E:", "W:"))]


def host_dist() -> str | None:
    """This machine's distribution as packaging/targets names it, if it is one."""
    release = dict(
        line.split("=", 1)
        for line in Path("/etc/os-release").read_text().splitlines()
        if "=" in line
    )
    name = release.get("ID", "") + release.get("VERSION_ID", "").strip('"')
    targets = (TOP / "packaging/targets").read_text().splitlines()
    known = {line.split()[0] for line in targets if line.strip() and not line.startswith("#")}
    return name if name in known else None
