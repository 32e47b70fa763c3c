"""Frequency domains: snapping, writes only on change, knobs that a planted link cannot redirect."""

from __future__ import annotations

import os
import resource
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mcpd.governor import domains
from tests.support.boards import RK_A76_KHZ, RK_GPU_HZ
from tests.support.fakesys import FakeSysfs

POLICY4 = "sys/devices/system/cpu/cpufreq/policy4"
NPU = "sys/devices/platform/fdab0000.npu/devfreq/fdab0000.npu"


def rk3588(fake: FakeSysfs) -> dict[str, domains.FrequencyDomain]:
    fake.file("proc/sys/kernel/random/boot_id", "8c7b5ac6-0000-4000-8000-000000000001\n")
    fake.cpufreq(4, (4, 5), 408000, 2208000, RK_A76_KHZ)
    fake.devfreq("fdab0000.npu", "sys/devices/platform/fdab0000.npu", RK_GPU_HZ, "rknpu_ondemand")
    fake.cpufreq(0, (0,), 400000, 4700000, None, "intel_pstate")
    return {d.name: d for d in domains.discover(fake.root)}


def cap_text(fake: FakeSysfs, rel: str) -> str:
    return (fake.root / rel).read_text()


@given(st.floats(min_value=1.0, max_value=5000.0))
def test_snap_is_the_highest_table_entry_not_above_the_cap(mhz: float) -> None:
    domain = domains.FrequencyDomain("policy4", "cpufreq", Path("/"), 408000, 2208000, RK_A76_KHZ)
    raw = domain.snap(mhz)
    assert raw in RK_A76_KHZ
    below = [f for f in RK_A76_KHZ if f <= mhz * 1000]
    assert raw == (max(below) if below else RK_A76_KHZ[0])


@given(st.floats(min_value=1.0, max_value=5000.0), st.floats(min_value=300.0, max_value=2208.0))
def test_snap_never_goes_below_the_floor_when_the_table_allows(mhz: float, floor: float) -> None:
    """The governed range's floor (800 MHz by default) holds even where the table has no entry
    at it: RK3588's A76 table goes 600 -> 816 MHz."""
    domain = domains.FrequencyDomain("policy4", "cpufreq", Path("/"), 408000, 2208000, RK_A76_KHZ)
    raw = domain.snap(max(mhz, floor), floor)
    assert raw in RK_A76_KHZ and raw >= floor * 1000 - 0.5
    assert domain.snap(800.0, 800.0) == 816000


@given(st.floats(min_value=1.0, max_value=9000.0))
def test_snap_without_table_clamps_to_the_hardware_range(mhz: float) -> None:
    domain = domains.FrequencyDomain("policy0", "cpufreq", Path("/"), 400000, 4700000)
    assert domain.snap(mhz) == min(max(round(mhz * 1000), 400000), 4700000)


def test_units_cpufreq_khz_devfreq_hz(fake: FakeSysfs) -> None:
    found = rk3588(fake)
    assert found["policy4"].change_cap(1700) == (2208.0, 1608.0)
    assert cap_text(fake, f"{POLICY4}/scaling_max_freq") == "1608000"
    assert found["fdab0000.npu"].change_cap(650)[1] == 600.0
    assert cap_text(fake, f"{NPU}/max_freq") == "600000000"
    assert found["policy0"].change_cap(1234.5678)[1] == 1234.568
    assert found["fdab0000.npu"].change_cap(1)[1] == 300.0  # never below the lowest entry


def test_write_only_when_the_cap_changes(fake: FakeSysfs) -> None:
    domain = rk3588(fake)["policy4"]
    path = fake.root / POLICY4 / "scaling_max_freq"
    domain.change_cap(1500)
    before = os.stat(path)
    domain.change_cap(1450)  # snaps to the same 1416000
    after = os.stat(path)
    assert (before.st_mtime_ns, before.st_ino) == (after.st_mtime_ns, after.st_ino)
    # ... but an outside change (nvpmodel, a user) is corrected on the next decision.
    path.write_text("2208000\n")
    domain.change_cap(1450)
    assert path.read_text() == "1416000"


def test_kernel_refusal_is_an_error_not_a_crash(fake: FakeSysfs) -> None:
    domain = rk3588(fake)["policy4"]
    (fake.root / POLICY4 / "scaling_max_freq").unlink()
    (fake.root / POLICY4 / "scaling_max_freq").mkdir()
    with pytest.raises(domains.DomainWriteError, match="policy4: writing 1416000"):
        domain.change_cap(1500)


@pytest.mark.parametrize(
    ("rule", "error"),
    [
        ("write:EBUSY", "writing 1416000 to .*: Device or resource busy"),
        ("write:keep", "wrote 1416000 to .*; the kernel kept 2208000"),  # a store that ignores it
    ],
)
def test_a_cap_counts_only_once_written_and_read_back(
    fake: FakeSysfs,
    errno_overlay: Callable[[Path, dict[str, str] | Path], Path],
    rule: str,
    error: str,
) -> None:
    rk3588(fake)
    root = errno_overlay(fake.root, {f"{POLICY4}/scaling_max_freq": rule})
    domain = {d.name: d for d in domains.discover(root)}["policy4"]
    with pytest.raises(domains.DomainWriteError, match=error):
        domain.change_cap(1500)
    assert domain.read_cap_mhz() == 2208.0


def test_a_cap_the_kernel_holds_lower_is_in_force_as_read_back(
    fake: FakeSysfs, errno_overlay: Callable[[Path, dict[str, str] | Path], Path]
) -> None:
    """cpufreq's scaling_max_freq shows the lowest of every limit on the policy (a cooling
    device's too): what reads back is the cap in force."""
    rk3588(fake)
    root = errno_overlay(fake.root, {f"{POLICY4}/scaling_max_freq": "write:max=1200000"})
    domain = {d.name: d for d in domains.discover(root)}["policy4"]
    assert domain.change_cap(1500) == (2208.0, 1200.0)


def test_a_cap_file_that_is_a_symlink_is_refused(fake: FakeSysfs, tmp_path: Path) -> None:
    """`mcpd restore` writes caps as root: a link planted at a cap must never be followed."""
    domain = rk3588(fake)["policy4"]
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    knob = fake.root / POLICY4 / "scaling_max_freq"
    knob.unlink()
    knob.symlink_to(victim)
    with pytest.raises(domains.DomainWriteError, match="is a symlink; refused, nothing written"):
        domain.write_raw("1416000")
    assert victim.read_text() == "precious\n"
    assert domain.read_cap_mhz() is None


def test_a_domain_that_resolves_outside_the_sysfs_root_is_refused(
    fake: FakeSysfs, tmp_path: Path
) -> None:
    domain = rk3588(fake)["fdab0000.npu"]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "max_freq").write_text("precious\n")
    (fake.root / "sys/class/devfreq/fdab0000.npu").unlink()
    (fake.root / "sys/class/devfreq/fdab0000.npu").symlink_to(elsewhere)
    with pytest.raises(domains.DomainWriteError, match="outside the sysfs root"):
        domain.write_raw("300000000")
    assert (elsewhere / "max_freq").read_text() == "precious\n"


def test_a_folder_swapped_for_a_link_while_opening_is_not_followed(
    fake: FakeSysfs, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The folder is resolved, then walked one component at a time without following links: a
    component replaced by a link between the two (the race a resolve-then-open would lose) makes
    the open fail instead of redirecting the write."""
    domain = rk3588(fake)["policy4"]
    before = {str(p): os.path.realpath(p) for p in (fake.root, fake.root / POLICY4)}
    outside = tmp_path / "outside/policy4"
    outside.mkdir(parents=True)
    (outside / "scaling_max_freq").write_text("precious\n")
    cpufreq = fake.root / "sys/devices/system/cpu/cpufreq"
    cpufreq.rename(tmp_path / "moved")
    cpufreq.symlink_to(outside.parent)
    monkeypatch.setattr(domains.os.path, "realpath", lambda p: before.get(str(p), str(p)))
    with pytest.raises(
        domains.DomainWriteError, match=r"writing 1416000 to .*: (Not a directory|Too many levels)"
    ):
        domain.write_raw("1416000")
    assert (outside / "scaling_max_freq").read_text() == "precious\n"


def test_a_cap_is_written_through_a_kept_descriptor(fake: FakeSysfs) -> None:
    """Cap writes need no free descriptor once a domain is in use: a process out of descriptors
    (a flood of clients) still throttles."""
    domain = rk3588(fake)["policy4"]
    domain.change_cap(1500)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    fillers = []
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 8, hard))
        with pytest.raises(OSError):
            while True:
                fillers.append(os.open("/dev/null", os.O_RDONLY))
        assert domain.change_cap(1000) == (1416.0, 816.0)
    finally:
        for fd in fillers:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert cap_text(fake, f"{POLICY4}/scaling_max_freq") == "816000"
