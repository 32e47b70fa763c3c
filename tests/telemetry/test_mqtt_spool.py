"""The telemetry spool: bounded, ordered, on disk while messages wait, tolerant of damaged files."""

from __future__ import annotations

import logging
import os
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import pytest

from mcpd.telemetry import journal
from mcpd.telemetry import spool as spool_module
from mcpd.telemetry.spool import SEQ_PER_S, SEQ_RESERVE, Spool
from tests.support.clock import FakeClock
from tests.support.waiting import within

EVENTS = {"e": "fault", "g": "governor", "m": "model", "x": "a kind mcpd does not make"}


def fill(spool: Spool, kinds: str) -> list[int]:
    """One message per letter: t = telemetry, else an event of the kind EVENTS names; payloads
    number them."""
    ids = []
    for i, letter in enumerate(kinds):
        payload = f"{letter}{i}".encode()
        if letter == "t":
            ids.append(spool.add("telemetry", payload).id)
        else:
            ids.append(spool.add("event", payload, EVENTS[letter]).id)
    return ids


def drain(spool: Spool) -> list[bytes]:
    """Deliver everything, oldest first, as the publisher does."""
    out, cursor = [], 0
    while (message := spool.first_after(cursor)) is not None:
        out.append(message.payload)
        cursor = message.id
        spool.remove(message.id)
    return out


def test_messages_come_out_in_the_order_they_went_in() -> None:
    spool = Spool(100, None, FakeClock())
    fill(spool, "ttetteet")
    assert drain(spool) == [b"t0", b"t1", b"e2", b"t3", b"t4", b"e5", b"e6", b"t7"]
    assert len(spool) == 0


def test_when_full_the_oldest_telemetry_goes_first_while_it_holds_half_the_spool() -> None:
    spool = Spool(4, None, FakeClock())
    fill(spool, "etttt")
    assert drain(spool) == [b"e0", b"t2", b"t3", b"t4"]
    fill(spool, "ettte")  # telemetry and events hold half each: the oldest telemetry went
    assert drain(spool) == [b"e0", b"t2", b"t3", b"e4"]
    fill(spool, "eeeeee")  # no telemetry to drop: the oldest events go
    assert drain(spool) == [b"e2", b"e3", b"e4", b"e5"]
    assert spool.dropped == 4


def test_a_flood_of_one_kind_of_event_keeps_at_most_half_and_shares_it_with_the_others() -> None:
    spool = Spool(10, None, FakeClock())
    fill(spool, "gttt" + "m" * 20 + "tt")  # model events in a loop, during an outage
    assert drain(spool) == [
        b"g0",
        b"t1",
        b"t2",
        b"t3",
        b"m20",
        b"m21",
        b"m22",
        b"m23",
        b"t24",
        b"t25",
    ]
    assert spool.dropped == 16
    # Events of kinds mcpd does not make (the serving process may send any) share one room.
    fill(spool, "mmmmm" + "x" * 10 + "gt")
    assert drain(spool) == [
        b"m1",
        b"m2",
        b"m3",
        b"m4",
        b"x11",
        b"x12",
        b"x13",
        b"x14",
        b"g15",
        b"t16",
    ]


def test_the_byte_bound_shares_the_same_way(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(spool_module, "MAX_BYTES", 12)  # six of fill's 2-byte payloads
    spool = Spool(100, None, FakeClock())
    fill(spool, "tt" + "m" * 6 + "t")
    assert drain(spool) == [b"t0", b"t1", b"m5", b"m6", b"m7", b"t8"]
    assert spool.dropped == 3


def test_each_event_keeps_its_kind_across_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "telemetry.spool"
    spool = Spool.open(path, 100, FakeClock())
    fill(spool, "gmmmx")
    spool.close()
    again = Spool.open(path, 6, FakeClock())
    fill(again, "mt")  # full: the model events are the most, and the oldest of them goes
    assert drain(again) == [b"g0", b"m2", b"m3", b"x4", b"m0", b"t1"]


def test_a_clean_close_keeps_what_is_owed_and_the_exact_next_seq(tmp_path: Path) -> None:
    path = tmp_path / "telemetry.spool"
    spool = Spool.open(path, 100, FakeClock())
    first = spool.next_seq()
    assert [spool.next_seq() for _ in range(2)] == [first + 1, first + 2]
    ids = fill(spool, "tetet")
    spool.remove(ids[0])
    spool.remove(ids[1])
    spool.close()
    again = Spool.open(path, 100, FakeClock())
    assert again.next_seq() == first + 3
    assert drain(again) == [b"t2", b"e3", b"t4"]


def test_a_crash_loses_nothing_that_waited_and_never_reuses_a_seq(tmp_path: Path) -> None:
    path = tmp_path / "telemetry.spool"
    spool = Spool.open(path, 100, FakeClock())
    issued = [spool.next_seq() for _ in range(5)]
    ids = fill(spool, "ttete")
    spool.persist(cursor=0)  # disconnected: all of it waits
    spool.remove(ids[0])  # delivered after the journal had it
    spool.persist(cursor=0)
    # No close(): the process died. The page cache has the journal.
    again = Spool.open(path, 100, FakeClock())
    assert drain(again) == [b"t1", b"e2", b"t3", b"e4"]
    assert again.next_seq() > max(issued)
    assert again.next_seq() <= max(issued) + SEQ_RESERVE + 2


def test_messages_handed_to_the_broker_stay_off_disk_until_the_link_fails(tmp_path: Path) -> None:
    path = tmp_path / "telemetry.spool"
    spool = Spool.open(path, 100, FakeClock())
    ids = fill(spool, "ttt")
    spool.persist(cursor=ids[-1])  # all three in flight: nothing to journal
    assert drain(Spool.open(path.with_name("copy"), 100, FakeClock())) == []
    assert path.stat().st_size == len(journal.MAGIC) + len(journal.seq_frame(0))  # seq only
    spool.persist(cursor=0)  # the link failed before the acks: now they wait
    assert drain(Spool.open(path, 100, FakeClock())) == [b"t0", b"t1", b"t2"]


def test_the_file_shrinks_back_once_everything_is_delivered(tmp_path: Path) -> None:
    path = tmp_path / "telemetry.spool"
    spool = Spool.open(path, 1000, FakeClock())
    fill(spool, "t" * 300)
    spool.persist(cursor=0)
    assert path.stat().st_size > 300 * 10
    drain(spool)
    spool.persist(cursor=0)
    assert path.stat().st_size < 100


def test_fsync_waits_for_its_period(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd)))
    clock = FakeClock()
    spool = Spool.open(tmp_path / "telemetry.spool", 100, clock)
    synced.clear()
    fill(spool, "t")
    spool.persist(cursor=0)
    assert synced == []
    clock.now += 5.0
    fill(spool, "t")
    spool.persist(cursor=0)
    assert len(synced) == 1


def test_shrinking_the_spool_drops_the_oldest_telemetry(tmp_path: Path) -> None:
    spool = Spool(100, None, FakeClock())
    fill(spool, "tettt")
    spool.resize(3)
    assert spool.dropped == 2
    assert drain(spool) == [b"e1", b"t3", b"t4"]


def middle(data: bytes, change: Callable[[bytearray, int], None]) -> bytes:
    """The file with `change` applied at the start of its third ADD frame (of five)."""
    damaged = bytearray(data)
    starts = [i for i in range(len(data)) if data.startswith(journal.MARKER, i)]
    change(damaged, starts[3])  # frame 0 is the SEQ frame
    return bytes(damaged)


def flip(at: int) -> Callable[[bytearray, int], None]:
    def change(data: bytearray, start: int) -> None:
        data[start + at] ^= 0x40

    return change


# Five messages, damage in one frame: that one is lost, the others kept, before and after it.
@pytest.mark.parametrize(
    ("damage", "kept", "problem"),
    [
        (lambda data: data[:-3], 4, "truncated frame"),
        (lambda data: data[:-20] + b"\xff" + data[-19:], 4, "checksum mismatch"),
        (lambda data: middle(data, flip(20)), 4, "checksum mismatch"),
        (lambda data: middle(data, flip(7)), 4, "truncated frame"),  # its length, 16 MiB too long
        (lambda data: middle(data, flip(1)), 4, "no frame marker"),
        (
            lambda data: middle(data, lambda d, i: d.__setitem__(slice(i, i), b"junk" * 99)),
            5,
            "no frame marker",
        ),
        (lambda data: b"garbage" + data, 0, "bad magic"),
    ],
    ids=[
        "torn tail",
        "bit rot",
        "bit rot inside",
        "length flipped",
        "marker flipped",
        "junk inserted",
        "not a spool",
    ],
)
def test_a_damaged_file_costs_only_the_damaged_frames_and_is_set_aside(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: object, kept: int, problem: str
) -> None:
    path = tmp_path / "telemetry.spool"
    spool = Spool.open(path, 100, FakeClock())
    fill(spool, "tetet")
    spool.persist(cursor=0)
    path.write_bytes(damage(path.read_bytes()))  # type: ignore[operator]
    with caplog.at_level(logging.WARNING, "mcpd.telemetry"):
        again = Spool.open(path, 100, FakeClock())
    assert len(drain(again)) == kept
    aside = tmp_path / "telemetry.spool.corrupt"
    assert aside.exists()
    assert problem in caplog.text and aside.name in caplog.text
    fill(again, "t")  # and the fresh file works
    again.close()
    assert drain(Spool.open(path, 100, FakeClock())) == [b"t0"]


def test_an_unusable_state_dir_means_memory_only_with_a_log_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    with caplog.at_level(logging.ERROR, "mcpd.telemetry"):
        spool = Spool.open(blocker / "telemetry.spool", 100, FakeClock())
    assert "in memory only" in caplog.text and str(blocker) in caplog.text
    fill(spool, "te")
    spool.persist(cursor=0)
    spool.close()
    assert drain(spool) == [b"t0", b"e1"]


def test_a_large_spool_is_streamed_and_replayed_within_the_bound(tmp_path: Path) -> None:
    path = tmp_path / "telemetry.spool"
    payload = b"x" * 4000
    with open(path, "wb") as file:  # 32 MiB: 8 000 messages, all but the last 50 delivered
        file.write(journal.MAGIC)
        for ident in range(1, 8001):
            file.write(journal.add_frame(journal.Message(ident, "telemetry", payload)))
        file.write(journal.done_frame(range(1, 7951)))
    tracemalloc.start()
    try:
        spool = Spool.open(path, 20, FakeClock())
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 * 2**20, f"{peak / 2**20:.1f} MiB held to replay a 32 MiB spool"
    assert len(spool) == 20 and spool.dropped == 30  # the bound applies while replaying
    assert len(drain(spool)) == 20


def test_a_fifo_or_a_symlink_as_the_spool_is_refused_without_blocking(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "telemetry.spool"
    os.mkfifo(path)
    with caplog.at_level(logging.WARNING, "mcpd.telemetry"):
        spool = within(30, lambda: Spool.open(path, 100, FakeClock()))
    assert "not a regular file (a FIFO)" in caplog.text
    fill(spool, "t")
    spool.close()
    assert drain(Spool.open(path, 100, FakeClock())) == [b"t0"]
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    path.unlink()
    path.symlink_to(victim)
    (tmp_path / "telemetry.spool.tmp").symlink_to(victim)  # the name temporaries once had
    spool = Spool.open(path, 100, FakeClock())
    fill(spool, "t")
    spool.persist(cursor=0)
    spool.close()
    assert victim.read_text() == "precious\n"
    assert not path.is_symlink() and drain(Spool.open(path, 100, FakeClock())) == [b"t0"]


def wall(seconds: float) -> Callable[[], float]:
    return lambda: seconds


def test_seq_starts_from_the_clock_floor_without_a_record(tmp_path: Path) -> None:
    spool = Spool.open(tmp_path / "telemetry.spool", 100, FakeClock(), wall=wall(1000.0))
    assert spool.next_seq() == 1000 * SEQ_PER_S


@pytest.mark.parametrize(
    "harm",
    [
        lambda seq: seq.unlink(),
        lambda seq: seq.write_text(seq.read_text().replace("1", "7")),
        lambda seq: (seq.unlink(), seq.mkdir()),
        lambda seq: (seq.unlink(), os.mkfifo(seq)),
    ],
    ids=["missing", "bit rot", "a directory", "a FIFO"],
)
def test_any_doubt_about_the_seq_record_jumps_forward(
    tmp_path: Path, harm: Callable[[Path], object], caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "telemetry.spool"
    spool = Spool.open(path, 100, FakeClock(), wall=wall(100.0))
    issued = [spool.next_seq() for _ in range(1500)]  # past the first reservation
    fill(spool, "t")
    spool.persist(cursor=0)  # then a crash
    harm(tmp_path / "telemetry.seq")
    with caplog.at_level(logging.WARNING, "mcpd.telemetry"):
        again = within(30, lambda: Spool.open(path, 100, FakeClock(), wall=wall(100.0)))
    assert again.next_seq() > max(issued)
    assert "so that no number is used twice" in caplog.text
    assert drain(again) == [b"t0"]


def test_a_reservation_that_cannot_be_saved_leaves_no_stale_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "telemetry.spool"
    spool = Spool.open(path, 100, FakeClock(), wall=wall(100.0))
    assert (tmp_path / "telemetry.seq").exists()

    def full_disk(target: Path, data: bytes) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(journal, "replace_atomically", full_disk)
    issued = [spool.next_seq() for _ in range(1500)]  # the second reservation fails
    assert not (tmp_path / "telemetry.seq").exists()
    monkeypatch.undo()
    again = Spool.open(path, 100, FakeClock(), wall=wall(100.0))  # after a crash
    assert again.next_seq() > max(issued)


def test_a_fifo_put_in_place_of_the_spool_at_run_time_never_blocks(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "telemetry.spool"
    spool = Spool.open(path, 100, FakeClock())
    path.unlink()
    os.mkfifo(path)
    fill(spool, "tt")
    with caplog.at_level(logging.ERROR, "mcpd.telemetry"):
        within(30, lambda: spool.persist(cursor=0))
    assert "spooling in memory only" in caplog.text
    assert drain(spool) == [b"t0", b"t1"]


def test_a_message_too_large_for_a_frame_waits_in_memory_and_the_rest_on_disk(
    tmp_path: Path,
) -> None:
    path = tmp_path / "telemetry.spool"
    spool = Spool.open(path, 100, FakeClock())
    spool.add("event", b"e" * journal.MAX_BODY)
    fill(spool, "t")
    spool.persist(cursor=0)
    assert [len(p) for p in drain(Spool.open(path, 100, FakeClock()))] == [2]  # "t0" was journaled
    assert [len(p) for p in drain(spool)] == [journal.MAX_BODY, 2]
