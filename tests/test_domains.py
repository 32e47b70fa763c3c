"""Frequency domains: snapping, writes only on change, baseline first, restore only to domains."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mcpd import domains
from mcpd.baseline import Baseline
from tests.boards import RK_A76_KHZ, RK_GPU_HZ
from tests.fakesys import FakeSysfs

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


@given(st.floats(min_value=1.0, max_value=9000.0))
def test_snap_without_table_clamps_to_the_hardware_range(mhz: float) -> None:
    domain = domains.FrequencyDomain("policy0", "cpufreq", Path("/"), 400000, 4700000)
    assert domain.snap(mhz) == min(max(round(mhz * 1000), 400000), 4700000)


def test_units_cpufreq_khz_devfreq_hz(fake: FakeSysfs) -> None:
    found = rk3588(fake)
    assert found["policy4"].write_cap(1700) == 1608.0
    assert cap_text(fake, f"{POLICY4}/scaling_max_freq") == "1608000"
    assert found["fdab0000.npu"].write_cap(650) == 600.0
    assert cap_text(fake, f"{NPU}/max_freq") == "600000000"
    assert found["policy0"].write_cap(1234.5678) == 1234.568
    assert found["fdab0000.npu"].write_cap(1) == 300.0  # never below the lowest entry


def test_write_only_when_the_cap_changes(fake: FakeSysfs) -> None:
    domain = rk3588(fake)["policy4"]
    path = fake.root / POLICY4 / "scaling_max_freq"
    domain.write_cap(1500)
    before = os.stat(path)
    domain.write_cap(1450)  # snaps to the same 1416000
    after = os.stat(path)
    assert (before.st_mtime_ns, before.st_ino) == (after.st_mtime_ns, after.st_ino)
    # ... but an outside change (nvpmodel, a user) is corrected on the next decision.
    path.write_text("2208000\n")
    domain.write_cap(1450)
    assert path.read_text() == "1416000"


def test_baseline_saved_before_the_first_write(fake: FakeSysfs, tmp_path: Path) -> None:
    found = rk3588(fake)
    baseline = Baseline(tmp_path / "state", fake.root)
    for domain in found.values():
        domain.baseline = baseline
    assert not (tmp_path / "state/baseline.json").exists()
    found["fdab0000.npu"].write_cap(500)
    saved = json.loads((tmp_path / "state/baseline.json").read_text())
    assert saved["domains"] == {
        "fdab0000.npu": {"path": "sys/class/devfreq/fdab0000.npu/max_freq", "value": "1000000000"}
    }
    assert saved["boot_id"] == "8c7b5ac6-0000-4000-8000-000000000001"


def test_no_write_without_a_baseline(fake: FakeSysfs, tmp_path: Path) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    domain = rk3588(fake)["policy4"]
    domain.baseline = Baseline(not_a_dir, fake.root)
    with pytest.raises(domains.DomainWriteError, match="cannot save the baseline"):
        domain.write_cap(500)
    assert cap_text(fake, f"{POLICY4}/scaling_max_freq") == "2208000\n"


def test_restore_after_a_crash_keeps_the_original(fake: FakeSysfs, tmp_path: Path) -> None:
    state = tmp_path / "state"
    domain = rk3588(fake)["policy4"]
    domain.baseline = Baseline(state, fake.root)
    domain.write_cap(1000)
    # kill -9 here; the daemon restarts and throttles further before anyone restores.
    restarted = rk3588_again(fake, state)
    restarted.write_cap(600)
    report = Baseline(state, fake.root).restore(domains.discover(fake.root))
    assert report.restored == ("policy4",) and report.problems == ()
    assert cap_text(fake, f"{POLICY4}/scaling_max_freq") == "2208000"
    assert not (state / "baseline.json").exists()
    again = Baseline(state, fake.root).restore(domains.discover(fake.root))
    assert again.restored == () and again.problems == ()  # idempotent


def rk3588_again(fake: FakeSysfs, state: Path) -> domains.FrequencyDomain:
    (domain,) = [
        d for d in domains.discover(fake.root, Baseline(state, fake.root)) if d.name == "policy4"
    ]
    return domain


def test_stale_baseline_from_an_earlier_boot_is_set_aside(fake: FakeSysfs, tmp_path: Path) -> None:
    state = tmp_path / "state"
    domain = rk3588(fake)["policy4"]
    domain.baseline = Baseline(state, fake.root)
    domain.write_cap(1000)
    fake.file("proc/sys/kernel/random/boot_id", "8c7b5ac6-0000-4000-8000-000000000002\n")
    fake.file(f"{POLICY4}/scaling_max_freq", "2208000\n")  # the firmware's cap after the reboot
    baseline = Baseline(state, fake.root)
    assert baseline.entries == {}
    assert (state / "baseline.json.stale").exists()


@pytest.mark.parametrize(
    "content",
    ["{not json", '{"format": 1}', '{"format": 1, "boot_id": null, "domains": {"x": 1}}', "[]"],
)
def test_corrupt_baseline_is_set_aside(tmp_path: Path, content: str) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / "baseline.json").write_text(content)
    assert Baseline(state, tmp_path).entries == {}
    assert (state / "baseline.json.corrupt").read_text() == content


def test_restore_refuses_paths_that_are_not_a_domain_cap(fake: FakeSysfs, tmp_path: Path) -> None:
    """ExecStopPost runs restore privileged: a tampered file must not become a sysfs write."""
    rk3588(fake)
    target = fake.root / "sys/kernel/mm/transparent_hugepage/enabled"
    target.parent.mkdir(parents=True)
    target.write_text("always\n")
    state = tmp_path / "state"
    state.mkdir()
    tampered = {"format": 1, "boot_id": "8c7b5ac6-0000-4000-8000-000000000001",
                "domains": {"policy4": {"path": "sys/kernel/mm/transparent_hugepage/enabled", "value": "never"},
                            "evil": {"path": "sys/kernel/mm/transparent_hugepage/enabled", "value": "never"}}}  # fmt: skip
    (state / "baseline.json").write_text(json.dumps(tampered))
    report = Baseline(state, fake.root).restore(domains.discover(fake.root))
    assert report.restored == ()
    assert any("not the domain's cap; refused" in p for p in report.problems)
    assert any("evil: not present" in p for p in report.problems)
    assert target.read_text() == "always\n"


def test_restore_keeps_entries_of_absent_domains(fake: FakeSysfs, tmp_path: Path) -> None:
    state = tmp_path / "state"
    found = rk3588(fake)
    for domain in found.values():
        domain.baseline = Baseline(state, fake.root)
    found["fdab0000.npu"].write_cap(300)
    report = Baseline(state, fake.root).restore([found["policy4"]])
    assert report.restored == () and "fdab0000.npu: not present" in report.problems[0]
    assert "fdab0000.npu" in Baseline(state, fake.root).entries


def test_kernel_refusal_is_an_error_not_a_crash(fake: FakeSysfs) -> None:
    domain = rk3588(fake)["policy4"]
    (fake.root / POLICY4 / "scaling_max_freq").unlink()
    (fake.root / POLICY4 / "scaling_max_freq").mkdir()
    with pytest.raises(domains.DomainWriteError, match="policy4: writing 1416000"):
        domain.write_cap(1500)


def test_restore_command(fake: FakeSysfs, tmp_path: Path) -> None:
    import subprocess
    import sys

    state = tmp_path / "state"
    domain = rk3588(fake)["policy4"]
    domain.baseline = Baseline(state, fake.root)
    domain.write_cap(800)
    command = [
        sys.executable,
        "-m",
        "mcpd",
        "restore",
        "--sysfs-root",
        str(fake.root),
        "--state-dir",
        str(state),
    ]
    first = subprocess.run(command, capture_output=True, text=True)
    assert first.returncode == 0 and "restored policy4" in first.stdout
    assert cap_text(fake, f"{POLICY4}/scaling_max_freq") == "2208000"
    second = subprocess.run(command, capture_output=True, text=True)
    assert second.returncode == 0 and "nothing to restore" in second.stdout


def test_restore_as_root_leaves_the_file_to_the_state_folders_owner(
    fake: FakeSysfs, tmp_path: Path
) -> None:
    """ExecStopPost's `mcpd restore` runs as root; the daemon reading the file next runs as mcpd."""
    state = tmp_path / "state"
    state.mkdir()
    os.chown(state, 4242, 4343)
    found = rk3588(fake)
    baseline = Baseline(state, fake.root)
    for domain in found.values():
        domain.baseline = baseline
    found["fdab0000.npu"].write_cap(300)
    found["policy4"].write_cap(600)
    Baseline(state, fake.root).restore([found["policy4"]])  # the NPU is absent: its entry stays
    owner = (state / "baseline.json").stat()
    assert (owner.st_uid, owner.st_gid) == (4242, 4343)


def test_an_unreadable_baseline_blocks_writes_instead_of_being_replaced(
    fake: FakeSysfs, tmp_path: Path, errno_overlay: Callable[[Path, dict[str, str]], Path]
) -> None:
    state = tmp_path / "state"
    domain = rk3588(fake)["policy4"]
    domain.baseline = Baseline(state, fake.root)
    domain.write_cap(1000)
    overlay = errno_overlay(state, {"baseline.json": "EACCES"})
    baseline = Baseline(overlay, fake.root)
    assert baseline.unreadable is not None and "Permission denied" in baseline.unreadable
    domain.baseline = baseline
    with pytest.raises(domains.DomainWriteError, match="the baseline is unreadable"):
        domain.write_cap(600)
    assert cap_text(fake, f"{POLICY4}/scaling_max_freq") == "816000"
