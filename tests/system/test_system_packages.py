"""The Debian packages as built from this machine: lintian clean on both architectures, an arm64
package whose bundled Python and native code really are for the target board, and OpenVINO in
an amd64 package only when asked for."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.support import system_debs

TOP = system_debs.TOP

pytestmark = pytest.mark.system

EM_X86_64 = 62
EM_AARCH64 = 183
# JetPack 6 (Jetson Orin) and most RK3588 images: Ubuntu 22.04, whose Python (3.10) is not the
# build machine's, so nothing of the build machine's Python can have slipped in.
ARM64 = ("ubuntu22.04", "arm64", "3.10")
# The amd64 package for this machine's distribution (the one the service tests install).
AMD64 = (system_debs.host_dist() or "debian12", "amd64")


def elf_machine(path: Path) -> int | None:
    """e_machine of a little-endian ELF file (both targets are), or None if not ELF."""
    with open(path, "rb") as file:
        header = file.read(20)
    if len(header) < 20 or header[:4] != b"\x7fELF":
        return None
    return int.from_bytes(header[18:20], "little")


@pytest.fixture(scope="module")
def arm64_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    deb = system_debs.build(ARM64[0], ARM64[1])
    tree = tmp_path_factory.mktemp("arm64")
    subprocess.run(["dpkg-deb", "-x", str(deb), str(tree)], check=True)
    return tree


@pytest.mark.parametrize(("dist", "arch"), [AMD64, ARM64[:2]], ids=["amd64", "arm64"])
def test_lintian_reports_no_error_or_unexplained_warning(dist: str, arch: str) -> None:
    assert system_debs.lintian(system_debs.build(dist, arch)) == []


def test_arm64_control_fields_name_the_target() -> None:
    deb = system_debs.build(ARM64[0], ARM64[1])
    fields = subprocess.run(
        ["dpkg-deb", "-f", str(deb), "Architecture", "Depends", "Version"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "Architecture: arm64" in fields
    assert re.search(rf"Depends: python{re.escape(ARM64[2])}\b", fields)
    assert "~ubuntu22.04" in fields


def test_arm64_venv_python_is_the_targets(arm64_tree: Path) -> None:
    python = ARM64[2]
    venv = arm64_tree / "opt/mcpd"
    assert (venv / "bin/python").readlink() == Path(f"/usr/bin/python{python}")
    assert f"version = {python}" in (venv / "pyvenv.cfg").read_text()
    assert [p.name for p in (venv / "lib").iterdir()] == [f"python{python}"]
    tag = "cpython-" + python.replace(".", "")
    extensions = list(venv.glob("lib/*/site-packages/**/*.cpython-*.so"))
    assert extensions
    wrong = [str(p) for p in extensions if tag not in p.name]
    assert wrong == [], f"extension modules for another Python: {wrong[:5]}"
    # Marker-selected dependencies follow the target's Python, not the build machine's.
    site = venv / f"lib/python{python}/site-packages"
    assert (site / "tomli").is_dir()  # python_version < '3.11'
    assert (site / "rknnlite").is_dir()  # platform_machine == 'aarch64'
    wrapper = (arm64_tree / "usr/bin/mcpd").read_text()
    assert "exec /opt/mcpd/bin/python " in wrapper
    # JetPack's onnxruntime-gpu in /opt/mcpd/overrides comes first (tests/system/test_package_overrides.py)
    assert (site / "mcpd-overrides.pth").read_bytes() == (
        TOP / "packaging/mcpd-overrides.pth"
    ).read_bytes()


def test_arm64_native_code_is_aarch64(arm64_tree: Path) -> None:
    site = next((arm64_tree / "opt/mcpd/lib").glob("python*/site-packages"))
    (onnxruntime,) = site.glob("onnxruntime/capi/onnxruntime_pybind11_state.*.so")
    assert elf_machine(onnxruntime) == EM_AARCH64
    machines = {
        str(path.relative_to(site)): elf_machine(path)
        for path in site.rglob("*")
        if path.is_file() and not path.is_symlink() and ".so" in path.name
    }
    elves = {name: machine for name, machine in machines.items() if machine is not None}
    assert len(elves) > 20
    foreign = {name: machine for name, machine in elves.items() if machine != EM_AARCH64}
    assert foreign == {}


def test_amd64_package_has_no_arm_only_dependencies() -> None:
    listing = subprocess.run(
        ["dpkg-deb", "-c", str(system_debs.build(*AMD64))],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "/site-packages/onnxruntime/" in listing
    assert "/site-packages/rknnlite/" not in listing


def test_openvino_is_bundled_in_amd64_packages_when_asked(tmp_path: Path) -> None:
    listing = subprocess.run(
        ["dpkg-deb", "-c", str(system_debs.build(*AMD64))],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "/site-packages/openvino/" not in listing  # optional: not in the default package
    deb = system_debs.build(*AMD64, "--openvino")
    assert system_debs.lintian(deb) == []
    subprocess.run(["dpkg-deb", "-x", str(deb), str(tmp_path)], check=True)
    site = next((tmp_path / "opt/mcpd/lib").glob("python*/site-packages"))
    (plugin,) = site.glob("openvino/libs/libopenvino_intel_cpu_plugin.so")
    assert elf_machine(plugin) == EM_X86_64
    assert "openvino==" in (tmp_path / "opt/mcpd/requirements.txt").read_text()


@pytest.mark.parametrize(
    ("name", "unit"), [("mcpd.service", "mcpd"), ("mcpd-ingest@.service", "mcpd-ingest@i")]
)
def test_service_exposure_is_at_most_2(name: str, unit: str) -> None:
    result = subprocess.run(
        ["systemd-analyze", "security", "--offline=yes", "--no-pager", str(TOP / "systemd" / name)],
        capture_output=True,
        text=True,
        check=False,
    )
    score = re.search(rf"Overall exposure level for {unit}.service: (\d+\.\d+)", result.stdout)
    assert score, result.stdout + result.stderr
    assert float(score.group(1)) <= 2.0


def test_shell_scripts_are_shellcheck_clean() -> None:
    scripts = [TOP / "packaging/build-deb", TOP / "systemd/mcpd-sysfs-access"]
    scripts += [TOP / "packaging/debian" / name for name in ("postinst", "prerm", "postrm")]
    result = subprocess.run(
        ["shellcheck", *map(str, scripts)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout
