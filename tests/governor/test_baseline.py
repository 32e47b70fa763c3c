"""The baseline: recorded before any write, kept in two folders, restored only to domain caps, and
never a way for the unprivileged mcpd user to make root write anywhere else."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from mcpd.governor import domains
from mcpd.governor.baseline import Baseline
from tests.support.boards import NPU, POLICY4, RK_A76_KHZ, RK_GPU_HZ, rk3588_bsp, x86_intel_laptop
from tests.support.fakesys import FakeSysfs

BOOT = "8c7b5ac6-0000-4000-8000-000000000001"
ORIGINALS = {
    "policy4": {"path": POLICY4, "value": "2208000"},
    "fdab0000.npu": {"path": "sys/class/devfreq/fdab0000.npu/max_freq", "value": "1000000000"},
}
BOARD = {"platform": "rk3588", "model": "Radxa ROCK 5B", "compatible": ["rockchip,rk3588"]}


def rk3588(fake: FakeSysfs) -> dict[str, domains.FrequencyDomain]:
    fake.file("proc/sys/kernel/random/boot_id", f"{BOOT}\n")
    fake.device_tree(("rockchip,rk3588",), "Radxa ROCK 5B")
    fake.cpufreq(4, (4, 5), 408000, 2208000, RK_A76_KHZ)
    fake.devfreq("fdab0000.npu", "sys/devices/platform/fdab0000.npu", RK_GPU_HZ, "rknpu_ondemand")
    return {d.name: d for d in domains.discover(fake.root)}


@pytest.fixture
def folders(tmp_path: Path) -> list[Path]:
    return [tmp_path / "run", tmp_path / "state"]


def saved(folder: Path) -> dict[str, object]:
    return json.loads((folder / "baseline.json").read_text())  # type: ignore[no-any-return]


def copy_of(fake: FakeSysfs, entries: object, **changes: object) -> str:
    """A copy as mcpd writes it on `fake`'s RK3588, with `changes` made to it."""
    document = {
        "format": 2,
        "boot_id": BOOT,
        "sysfs_root": str(fake.root.resolve()),
        "board": BOARD,
        "domains": entries,
    }
    return json.dumps({**document, **changes})


def throttle(found: dict[str, domains.FrequencyDomain], baseline: Baseline) -> None:
    """What the daemon does: record the originals when it adopts the domains, then write."""
    baseline.remember(found.values())
    found["policy4"].change_cap(1000)
    found["fdab0000.npu"].change_cap(300)


def test_both_copies_hold_the_originals_before_the_first_write(
    fake: FakeSysfs, folders: list[Path]
) -> None:
    found = rk3588(fake)
    baseline = Baseline.load(folders, fake.root)
    assert not any((f / "baseline.json").exists() for f in folders)
    baseline.remember(found.values())
    for folder in folders:
        assert saved(folder) == json.loads(copy_of(fake, ORIGINALS))


def test_restore_after_a_crash_keeps_the_originals(fake: FakeSysfs, folders: list[Path]) -> None:
    throttle(rk3588(fake), Baseline.load(folders, fake.root))
    # kill -9 here; the daemon restarts and throttles further before anyone restores.
    found = {d.name: d for d in domains.discover(fake.root)}
    baseline = Baseline.load(folders, fake.root)
    baseline.remember(found.values())
    found["policy4"].change_cap(600)
    report = Baseline.load(folders, fake.root).restore(domains.discover(fake.root))
    assert report.restored == ("fdab0000.npu", "policy4") and report.problems == ()
    assert (fake.root / POLICY4).read_text() == "2208000"
    assert (fake.root / NPU).read_text() == "1000000000"
    assert not any((f / "baseline.json").exists() for f in folders)
    again = Baseline.load(folders, fake.root).restore(domains.discover(fake.root))
    assert again.restored == () and again.problems == ()  # idempotent


def test_either_copy_is_enough_to_restore(fake: FakeSysfs, folders: list[Path]) -> None:
    throttle(rk3588(fake), Baseline.load(folders, fake.root))
    (folders[1] / "baseline.json").unlink()
    report = Baseline.load(folders, fake.root).restore(domains.discover(fake.root))
    assert report.restored == ("fdab0000.npu", "policy4")


def test_stale_copies_from_an_earlier_boot_are_set_aside(
    fake: FakeSysfs, folders: list[Path]
) -> None:
    throttle(rk3588(fake), Baseline.load(folders, fake.root))
    fake.file("proc/sys/kernel/random/boot_id", "8c7b5ac6-0000-4000-8000-000000000002\n")
    assert Baseline.load(folders, fake.root).entries == {}
    assert all((f / "baseline.json.stale").exists() for f in folders)


NESTED = "[" * 100_000
"""Issue 26: a copy of 100 000 '[' ended `mcpd run` and root's `mcpd restore` with a RecursionError."""


@pytest.mark.parametrize(
    "content",
    [
        "{not json",
        '{"format": 1}',
        '{"format": 1, "boot_id": null, "domains": {"x": 1}}',
        "[]",
        NESTED,
    ],
)
def test_a_corrupt_copy_is_set_aside(tmp_path: Path, content: str) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / "baseline.json").write_text(content)
    assert Baseline.load([state], tmp_path).entries == {}
    assert (state / "baseline.json.corrupt").read_text() == content


def test_a_deeply_nested_copy_never_hides_the_intact_one_from_restore(
    fake: FakeSysfs, folders: list[Path]
) -> None:
    throttle(rk3588(fake), Baseline.load(folders, fake.root))
    (folders[0] / "baseline.json").write_text(NESTED)
    result = restore_command(fake, folders)
    assert result.returncode == 0, result.stderr
    assert "corrupt (nested deeper than 32 levels) baseline set aside" in result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout == "restored fdab0000.npu\nrestored policy4\n"
    assert (fake.root / POLICY4).read_text() == "2208000"
    assert (fake.root / NPU).read_text() == "1000000000"


def test_restore_tries_every_domain_and_names_the_one_that_failed(
    fake: FakeSysfs, folders: list[Path]
) -> None:
    throttle(rk3588(fake), Baseline.load(folders, fake.root))
    cap = fake.root / POLICY4
    cap.unlink()
    cap.mkdir()  # the kernel refuses the write
    result = restore_command(fake, folders)
    assert result.returncode == 1
    assert result.stdout == "restored fdab0000.npu\n"
    assert result.stderr.count("error: ") == 1
    assert "error: policy4: writing 2208000" in result.stderr
    assert set(saved(folders[1])["domains"]) == {"policy4"}  # type: ignore[arg-type]


# -- a copy belongs to one boot, one sysfs root and one board (issue 26) ----------------------------


def test_a_copy_taken_on_another_tree_is_set_aside_and_never_restored(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 26: the runtime folder is shared by every daemon that does not set its own. A daemon
    on an RK3588 tree took an x86 tree's copy (neither tree has a boot id) for its own: it would
    have written the x86 policy0's 4 700 000 kHz to its policy0 and failed on policy1-3."""
    shared, state = tmp_path / "run", tmp_path / "state"
    x86, rk = FakeSysfs(tmp_path / "x86"), FakeSysfs(tmp_path / "rk")
    x86_intel_laptop(x86)
    rk3588_bsp(rk)
    Baseline.load([shared], x86.root).remember(domains.discover(x86.root))  # then kill -9
    a55 = rk.root / "sys/devices/system/cpu/cpufreq/policy0/scaling_max_freq"
    a55.write_text("1008000")  # throttled by an earlier run whose copies are gone
    with caplog.at_level(logging.WARNING):
        assert Baseline.load([shared, state], rk.root).entries == {}
    assert caplog.text.count("baseline set aside") == 1
    assert (
        f"{shared / 'baseline.json'}: foreign (taken on x86-intel (LENOVO 20XW0055GE) under "
        f"{x86.root}; this is rk3588 (Radxa ROCK 5 Model B) under {rk.root}) baseline set aside "
        "as baseline.json.foreign"
    ) in caplog.text
    (shared / "baseline.json.foreign").rename(shared / "baseline.json")
    result = restore_command(rk, [shared, state])
    assert (result.returncode, result.stdout) == (0, "nothing to restore\n"), result.stderr
    assert a55.read_text() == "1008000"
    assert "policy1" not in result.stderr


@pytest.mark.parametrize(
    ("changes", "why"),
    [
        ({"sysfs_root": "/elsewhere"}, "foreign (taken on rk3588 (Radxa ROCK 5B) under /elsewhere"),
        (
            {"board": {"platform": "rk3588", "model": "Orange Pi 5", "compatible": []}},
            "foreign (taken on rk3588 (Orange Pi 5) under",
        ),
        ({"format": 1, "sysfs_root": None, "board": None}, "foreign (format 1 names no sysfs root"),
        ({"board": None}, 'corrupt ("sysfs_root" or "board" missing)'),
        ({"format": 3}, "corrupt (not a baseline of format 1 or 2)"),
    ],
    ids=["root", "board", "format-1", "no-board", "format-3"],
)
def test_a_copy_restores_only_on_the_root_and_board_it_names(
    fake: FakeSysfs,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    changes: dict[str, object],
    why: str,
) -> None:
    rk3588(fake)
    state = tmp_path / "state"
    state.mkdir()
    (state / "baseline.json").write_text(copy_of(fake, ORIGINALS, **changes))
    assert Baseline.load([state], fake.root).entries == {}
    assert why in caplog.text
    assert (state / f"baseline.json.{why.split()[0]}").exists()


def test_a_format_1_copy_of_this_boot_is_restored_on_the_real_root(tmp_path: Path) -> None:
    """Only a daemon on / reads the running kernel's boot id (README, "Frequency domains"), so a
    copy an older mcpd left on this boot is this board's: a crash before an upgrade still gets its
    caps back. Loaded only: nothing is written to the real sysfs."""
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    (tmp_path / "baseline.json").write_text(
        json.dumps({"format": 1, "boot_id": boot, "domains": ORIGINALS})
    )
    assert Baseline.load([tmp_path], "/").entries == ORIGINALS


def test_restore_refuses_paths_that_are_not_a_domain_cap(fake: FakeSysfs, tmp_path: Path) -> None:
    """ExecStopPost runs restore privileged: a tampered file must not become a sysfs write."""
    rk3588(fake)
    target = fake.root / "sys/kernel/mm/transparent_hugepage/enabled"
    target.parent.mkdir(parents=True)
    target.write_text("always\n")
    state = tmp_path / "state"
    state.mkdir()
    evil = {"path": "sys/kernel/mm/transparent_hugepage/enabled", "value": "never"}
    (state / "baseline.json").write_text(copy_of(fake, {"policy4": evil, "evil": evil}))
    report = Baseline.load([state], fake.root).restore(domains.discover(fake.root))
    assert report.restored == ()
    assert any("not the domain's cap; refused" in p for p in report.problems)
    assert any("evil: not present" in p for p in report.problems)
    assert target.read_text() == "always\n"


def test_restore_keeps_entries_of_absent_domains(fake: FakeSysfs, folders: list[Path]) -> None:
    found = rk3588(fake)
    throttle(found, Baseline.load(folders, fake.root))
    report = Baseline.load(folders, fake.root).restore([found["policy4"]])
    assert report.restored == ("policy4",) and "fdab0000.npu: not present" in report.problems[0]
    assert set(Baseline.load(folders, fake.root).entries) == {"fdab0000.npu"}


def restore_command(fake: FakeSysfs, folders: list[Path]) -> subprocess.CompletedProcess[str]:
    command = [
        sys.executable,
        "-m",
        "mcpd",
        "restore",
        "--sysfs-root",
        str(fake.root),
        "--runtime-dir",
        str(folders[0]),
        "--state-dir",
        str(folders[1]),
    ]
    return subprocess.run(command, capture_output=True, text=True, timeout=60)


def test_restore_command(fake: FakeSysfs, folders: list[Path]) -> None:
    throttle(rk3588(fake), Baseline.load(folders, fake.root))
    first = restore_command(fake, folders)
    assert first.returncode == 0 and "restored policy4" in first.stdout, first.stderr
    assert (fake.root / POLICY4).read_text() == "2208000"
    second = restore_command(fake, folders)
    assert second.returncode == 0 and "nothing to restore" in second.stdout


# -- the state folder belongs to the unprivileged mcpd user; `mcpd restore` runs as root ----------


@pytest.fixture
def victim(tmp_path: Path) -> Iterator[Path]:
    """A file only root may change (think /etc/shadow), which a planted link points at."""
    path = tmp_path / "victim"
    path.write_text("root's secrets\n")
    os.chmod(path, 0o600)
    yield path
    info = path.stat()
    assert path.read_text() == "root's secrets\n", "root wrote through a planted link"
    assert (info.st_uid, info.st_mode & 0o7777) == (0, 0o600), "the victim was chowned or chmodded"


def plant(folder: Path, name: str, target: Path) -> None:
    link = folder / name
    link.symlink_to(target)
    os.lchown(link, 4242, 4242)  # made by the unprivileged user


def test_restore_as_root_never_writes_through_links_planted_in_the_folders(
    fake: FakeSysfs, folders: list[Path], victim: Path
) -> None:
    found = rk3588(fake)
    throttle(found, Baseline.load(folders, fake.root))
    for folder in folders:
        os.chown(folder, 4242, 4242)
        # Every name an earlier version wrote through, and some a guess might try.
        for name in (".baseline.json.tmp", "baseline.json.tmp", ".baseline.json.0.tmp"):
            plant(folder, name, victim)
    # The NPU stays absent, so restore has to write the remaining entry back.
    report = Baseline.load(folders, fake.root).restore([found["policy4"]])
    assert report.restored == ("policy4",)
    for folder in folders:
        info = (folder / "baseline.json").lstat()
        # root's file, readable by the daemon that owns the folder; nothing chowned by path.
        assert (info.st_uid, info.st_mode & 0o777) == (0, 0o644)
        assert set(saved(folder)["domains"]) == {"fdab0000.npu"}  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", ["symlink", "fifo", "huge", "folder"])
def test_anything_but_a_file_at_the_baseline_is_set_aside_without_following_or_blocking(
    fake: FakeSysfs, tmp_path: Path, victim: Path, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    rk3588(fake)
    state = tmp_path / "state"
    state.mkdir()
    planted = state / "baseline.json"
    if kind == "symlink":
        plant(state, "baseline.json", victim)
    elif kind == "fifo":
        os.mkfifo(planted)  # an open() without O_NONBLOCK would hang restore for ever
    elif kind == "huge":
        with open(planted, "wb") as file:
            file.truncate(64 * 2**20)
    else:
        planted.mkdir()
    baseline = Baseline.load([state], fake.root)
    assert baseline.entries == {}
    assert os.path.lexists(state / "baseline.json.unsafe")
    assert "baseline set aside as baseline.json.unsafe" in caplog.text
    baseline.remember(domains.discover(fake.root))
    assert saved(state)["domains"] == ORIGINALS


def test_a_state_folder_that_is_a_link_is_refused(
    fake: FakeSysfs, tmp_path: Path, victim: Path
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "state").symlink_to(elsewhere)
    baseline = Baseline.load([tmp_path / "state"], fake.root)
    baseline.remember(rk3588(fake).values())
    assert list(elsewhere.iterdir()) == []
    assert baseline.at_risk is not None and "a symlink" in baseline.at_risk


# -- a full disk, a folder removed at run time, an unreadable copy ---------------------------------


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A real 64 KiB tmpfs: the file system fills up as a disk does (ENOSPC from write(2))."""
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        pytest.skip(f"mounting a tmpfs needs root: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(folder: Path) -> None:
    with (
        open(folder / "filler", "wb", buffering=0) as file,
        pytest.raises(OSError, match="No space"),
    ):
        while True:
            file.write(b"\0" * 4096)
            file.flush()


def test_a_full_disk_never_stops_throttling(
    fake: FakeSysfs, tmp_path: Path, small_tmpfs: Path, caplog: pytest.LogCaptureFixture
) -> None:
    state = small_tmpfs / "state"
    state.mkdir()
    fill(small_tmpfs)
    found = rk3588(fake)
    baseline = Baseline.load([state], fake.root)
    with caplog.at_level(logging.WARNING):
        throttle(found, baseline)
    assert (fake.root / POLICY4).read_text() == "816000"  # throttled all the same
    assert "No space left on device; throttling goes on" in caplog.text
    assert "restore after a crash is not guaranteed" in caplog.text
    assert baseline.at_risk is not None
    assert list(state.iterdir()) == []  # no temporary left behind
    (small_tmpfs / "filler").unlink()
    baseline.keep()
    assert saved(state)["domains"] == ORIGINALS and baseline.at_risk is None


def test_with_one_copy_on_a_full_disk_the_other_one_restores(
    fake: FakeSysfs, tmp_path: Path, small_tmpfs: Path, caplog: pytest.LogCaptureFixture
) -> None:
    run, state = tmp_path / "run", small_tmpfs / "state"
    state.mkdir()
    fill(small_tmpfs)
    throttle(rk3588(fake), Baseline.load([run, state], fake.root))
    assert f"restore after a crash uses {run / 'baseline.json'}" in caplog.text
    report = Baseline.load([run, state], fake.root).restore(domains.discover(fake.root))
    assert report.restored == ("fdab0000.npu", "policy4")


def test_a_removed_state_folder_is_made_again(fake: FakeSysfs, folders: list[Path]) -> None:
    baseline = Baseline.load(folders, fake.root)
    throttle(rk3588(fake), baseline)
    for folder in folders:
        (folder / "baseline.json").unlink()
        folder.rmdir()
    baseline.keep()
    assert all(saved(f)["domains"] == ORIGINALS for f in folders)


def test_an_unreadable_copy_is_kept_and_throttling_goes_on(
    fake: FakeSysfs,
    folders: list[Path],
    errno_overlay: Callable[[Path, dict[str, str] | Path], Path],
) -> None:
    """The daemon cannot read it, but root's restore can: it holds the originals, so it must not be
    replaced by caps that are the daemon's own."""
    found = rk3588(fake)
    throttle(found, Baseline.load(folders, fake.root))
    state = errno_overlay(folders[1], {"baseline.json": "EACCES"})
    (folders[0] / "baseline.json").unlink()
    baseline = Baseline.load([folders[0], state], fake.root)
    assert baseline.stores[1].unreadable is not None
    baseline.remember(found.values())  # what the loop does at adoption
    found["policy4"].change_cap(600)
    assert saved(folders[1])["domains"] == ORIGINALS  # untouched
    assert saved(folders[0])["domains"]["policy4"]["value"] == "816000"  # type: ignore[index]
