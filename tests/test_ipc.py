"""The protocol between the governor and serving processes (mcpd/ipc.py): the shared block, the
messages, and the socket pair that carries them (mcpd/channel.py), each end as the other process
sees it."""

from __future__ import annotations

import contextlib
import copy
import fcntl
import json
import logging
import os
import socket
import struct
from collections.abc import Iterator
from typing import Any

import pytest

from mcpd import channel, ipc
from mcpd.channel import Channel
from mcpd.snapshot import ModelStats
from tests.support.mqtt_status import FakeBoard, placement

CONFIG: ipc.ConfigMessage = {
    "kind": "config",
    "generation": 1,
    "config": {"a": 1},
    "slots": {"m": 0},
    "placement": placement(),
}
STATS = ipc.stats_message({"m": ModelStats(True, requests=3, p50_ms=1.5, detail={"k": "v"})})


@pytest.fixture
def ends() -> Iterator[tuple[Channel, Channel]]:
    """The governor's end and the serving process's, closed after the test."""
    governor, theirs = Channel.pair()
    serving = Channel(theirs)
    yield governor, serving
    governor.close()
    serving.close()


def test_messages_keep_their_boundaries_and_order_and_a_closed_peer_is_none(
    ends: tuple[Channel, Channel],
) -> None:
    governor, serving = ends
    assert governor.send(CONFIG)
    assert serving.send({"kind": "ready"})
    assert serving.send(STATS)
    assert serving.receive() == [CONFIG]
    assert [m["kind"] for m in governor.receive() or []] == ["ready", "stats"]
    assert governor.receive() == []  # nothing waiting: no block, no None
    serving.close()
    assert governor.receive() is None


def test_what_the_peer_sent_before_it_closed_its_end_is_still_read(
    ends: tuple[Channel, Channel],
) -> None:
    """A serving process that refuses its first configuration says so and exits at once. Read in
    the same call as the close of its end, the refusal was dropped: the governor restarted it
    without a word of why (config_error None): 5 runs in 50 of tests/governor/test_supervisor.py's refused
    configuration, under load."""
    governor, serving = ends
    refusal: ipc.ConfiguredMessage = {"kind": "configured", "generation": 1, "error": "no"}
    serving.send(refusal)
    serving.close()
    assert governor.receive() == [refusal]
    assert governor.receive() is None


def memfds() -> set[str]:
    """This process's open memfds (readlink /proc/self/fd/N is "/memfd:NAME (deleted)"); other
    descriptors come and go with whatever earlier tests left to the garbage collector."""
    found = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # closed meanwhile
            if os.readlink(f"/proc/self/fd/{fd}").startswith("/memfd:"):
                found.add(fd)
    return found


def test_a_message_larger_than_a_datagram_crosses_whole_in_a_sealed_memfd(
    ends: tuple[Channel, Channel],
) -> None:
    """A configuration of a few hundred models is more than one datagram holds: sent as one, it
    was refused (EMSGSIZE above the socket's buffer, 208 KiB by default) and silently lost."""
    governor, serving = ends
    before = memfds()
    config = {"models": [{"name": f"m{i}", "path": "/models/" + "d/" * 500} for i in range(450)]}
    message: ipc.ConfigMessage = {**CONFIG, "config": config, "slots": {}}
    assert len(json.dumps(message)) > 2 * socket.socket.getsockopt(
        governor.sock, socket.SOL_SOCKET, socket.SO_SNDBUF
    )
    assert governor.send(message) and governor.send({"kind": "ready"})
    assert serving.receive() == [message, {"kind": "ready"}]
    assert memfds() == before  # no memfd left open on either side


def test_a_message_too_big_even_for_a_memfd_is_refused_naming_its_kind(
    ends: tuple[Channel, Channel],
) -> None:
    governor, _ = ends
    with pytest.raises(ipc.IpcError, match=r"a config message of \d+ bytes is too big"):
        governor.send({**CONFIG, "config": {"a": "x" * channel.MESSAGE_BYTES}})


def test_sending_never_blocks_the_governor_on_a_serving_process_that_does_not_read(
    ends: tuple[Channel, Channel],
) -> None:
    governor, serving = ends
    # Just under what goes inline: the socket's buffer, not a memfd, is what fills.
    room = channel.INLINE_BYTES - len(ipc.encode({**CONFIG, "config": {"a": ""}}))
    message: ipc.ConfigMessage = {**CONFIG, "config": {"a": "x" * (room - 20)}}
    sent = [governor.send(message) for _ in range(200)]
    assert not all(sent) and governor.dropped == sent.count(False)
    received = serving.receive()
    assert received is not None and len(received) == sent.count(True)


@pytest.mark.parametrize("passed", ["a pipe", "an unsealed memfd", "two memfds", "a huge memfd"])
def test_a_descriptor_that_is_not_one_sealed_memfd_is_refused_and_closed(
    ends: tuple[Channel, Channel], passed: str
) -> None:
    """What a serving process taken over by a client could pass the governor: a pipe (or a file
    on a hung FUSE mount) would block its read, a memfd left writable could change under it, and
    one of 64 MB would be more than the governor's whole memory budget."""
    governor, serving = ends
    before = len(os.listdir("/proc/self/fd"))
    if passed == "a pipe":
        read, write = os.pipe()
        os.write(write, b'{"kind": "ready"}')
        fds = [read, write]
    else:
        fds = [os.memfd_create("m", os.MFD_ALLOW_SEALING) for _ in range(2)]
        for fd in fds:
            os.write(fd, b'{"kind": "ready"}')
            if passed == "a huge memfd":  # over what the governor reads
                os.write(fd, b" " * channel.FROM_SERVING_BYTES)
            if passed in ("two memfds", "a huge memfd"):
                fcntl.fcntl(
                    fd,
                    fcntl.F_ADD_SEALS,
                    fcntl.F_SEAL_WRITE | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SHRINK,
                )
    socket.send_fds(serving.sock, [b"\0"], fds if passed == "two memfds" else fds[:1])
    for fd in fds:
        os.close(fd)
    serving.sock.send(b'{"kind": "stats", "models": {}}')
    assert governor.receive() == [{"kind": "stats", "models": {}}]
    assert len(os.listdir("/proc/self/fd")) == before  # nothing passed is kept open


def test_a_datagram_that_is_not_a_message_is_skipped(
    ends: tuple[Channel, Channel],
) -> None:
    governor, serving = ends
    serving.sock.send(b"\xff not json")
    serving.sock.send(b"[1, 2]")
    serving.sock.send(b'{"kind": "ready"}')
    assert governor.receive() == [{"kind": "ready"}]


def test_the_statistics_cross_whole() -> None:
    """Every field of ModelStats but the serving process's own `statistics`."""
    stats = ModelStats(False, 7, 2, 1.5, 9.25, 3, {"provider": "CPUExecutionProvider"})
    message = ipc.decode(ipc.encode(ipc.stats_message({"m": stats})))
    assert message["kind"] == "stats" and ipc.model_stats(message) == {"m": stats}


def test_the_request_and_compute_latency_histograms_cross_the_queue_one_stays() -> None:
    """Those the status document and so telemetry carry (mcpd.latency_doc); the queue histogram
    is only on the board's /metrics, from the serving process's live ones."""
    board = FakeBoard()
    board()
    latency = board.recorder.snapshot().latency
    stats = ModelStats(True, 25, latency=latency)
    crossed = ipc.model_stats(ipc.decode(ipc.encode(ipc.stats_message({"m": stats}))))
    assert crossed["m"].latency == {"request": latency["request"], "compute": latency["compute"]}
    assert latency["request"].count == 25 and latency["request"].sum_s > 0


DELETE = object()
EVENT = {"kind": "event", "event": {"kind": "model", "message": "m ready", "data": {}, "ts": 1.0}}


def _with(message: Any, path: str, value: Any) -> bytes:
    """`message` as JSON with the value at the dotted `path` replaced (or removed: DELETE)."""
    changed = copy.deepcopy(message)
    *parents, key = path.split(".")
    target = changed
    for name in parents:
        target = target[name]
    if value is DELETE:
        del target[key]
    else:
        target[key] = value
    return json.dumps(changed).encode()


@pytest.mark.parametrize(
    ("data", "error"),
    [
        (b"\xff not json", r"not JSON"),
        (b"[1, 2]", r"not a JSON object but list"),
        (b'{"kind": "shout"}', r"no such kind of message: 'shout'"),
        (b'{"generation": 1}', r"no such kind of message: None"),
        (_with(CONFIG, "generation", "1"), r"config\.generation: '1' is not int"),
        (_with(CONFIG, "slots.m", True), r"config\.slots\['m'\]: True is not int"),
        (_with(CONFIG, "slots", None), r"config\.slots: None is not an object"),
        (_with(EVENT, "event.message", DELETE), r"event\.event: no key 'message'"),
        (_with(EVENT, "event.data", []), r"\.event\.data: \[\] is not an object"),
        (
            _with(STATS, "models.m.p50_ms", "fast"),
            r"stats\.models\['m'\]\.p50_ms: 'fast' is not",
        ),
        (_with(STATS, "models.m.extra", 1), r"models\['m'\]: extra key 'extra'"),
        (_with(STATS, "models.m.latency", []), r"models\['m'\]\.latency: \[\] is not an object"),
        (b'{"kind": "ready", "a": 1, "b": 2}', r"extra key '.' \(and 1 more\)"),
        (b'{"kind": "configured", "generation": 1}', r"configured: no key 'error'"),
    ],
)
def test_what_is_not_a_message_is_refused_naming_what_is_wrong(data: bytes, error: str) -> None:
    with pytest.raises(ipc.MessageError, match=error):
        ipc.decode(data)


def test_malformed_messages_are_left_out_and_said_once_a_minute(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """What a serving process taken over by a client could send: the governor takes the messages
    among them and says what is wrong with the others, without a line for each."""
    now = [100.0]
    governor, theirs = Channel.pair()
    governor.clock = lambda: now[0]
    serving = Channel(theirs)
    try:
        with caplog.at_level(logging.WARNING, "mcpd.ipc"):
            for _ in range(50):
                serving.sock.send(_with(STATS, "models.m.p50_ms", "fast"))
            serving.send({"kind": "ready"})
            assert governor.receive() == [{"kind": "ready"}]
            now[0] += channel.REFUSED_LOG_S
            serving.sock.send(b"{}")
            assert governor.receive() == []
    finally:
        governor.close()
        serving.close()
    assert [r.getMessage() for r in caplog.records] == [
        "refused a message from the serving process: stats.models['m'].p50_ms: 'fast' is not float",
        "refused a message from the serving process: no such kind of message: None (49 more since)",
    ]


@pytest.fixture
def blocks() -> Iterator[tuple[ipc.SharedBlock, ipc.SharedBlock]]:
    """The governor's block and the serving process's view of it (the child maps its copy of
    the same memfd)."""
    governor = ipc.SharedBlock.create()
    serving = ipc.SharedBlock(os.dup(governor.fd), create=False)
    yield governor, serving
    serving.close()
    governor.close()


def test_batch_sizes_and_the_status_document_cross_the_block(
    blocks: tuple[ipc.SharedBlock, ipc.SharedBlock],
) -> None:
    governor, serving = blocks
    assert serving.status() is None  # before the governor's first document
    assert serving.batch(3) == 0  # unset
    governor.set_batch(3, 16)
    document = FakeBoard()()
    governor.set_status(document)
    assert serving.batch(3) == 16
    assert serving.status() == document


def test_a_block_of_another_version_is_refused() -> None:
    governor = ipc.SharedBlock.create()
    struct.pack_into("=8s", governor._map, 0, b"MCPDIPC0")
    copy = os.dup(governor.fd)
    try:
        with pytest.raises(ipc.IpcError, match="not this version's"):
            ipc.SharedBlock(copy, create=False)
    finally:
        os.close(copy)
        governor.close()


def _sequence(block: ipc.SharedBlock, value: int, length: int) -> None:
    struct.pack_into("=QI", block._map, ipc._STATUS_AT, value, length)


def test_a_half_written_document_is_never_returned_and_never_spun_on(
    blocks: tuple[ipc.SharedBlock, ipc.SharedBlock],
) -> None:
    """A sequence left odd (a governor that died half-way) or a copy whose bytes do not parse (the
    arm64 store order) is read again, a bounded number of times: serving answers "no document"
    rather than a traceback or a busy loop, and the next whole document is read as usual."""
    governor, serving = blocks
    first = FakeBoard()()
    governor.set_status(first)
    _, length = struct.unpack_from("=QI", governor._map, ipc._STATUS_AT)
    _sequence(governor, 3, length)  # odd: being written
    assert serving.status() is None
    _sequence(governor, 4, length)
    assert serving.status() == first
    start = ipc._STATUS_AT + struct.calcsize("=QI")
    governor._map[start : start + 10] = b'{"state":\x00'
    assert serving.status() is None
    _sequence(governor, 4, ipc.STATUS_BYTES + 1)  # a length no writer gives
    assert serving.status() is None
    second = {**first, "state": "lower"}
    governor.set_status(second)  # type: ignore[arg-type]
    assert serving.status() == second


def test_the_pair_is_seqpacket(ends: tuple[Channel, Channel]) -> None:
    """SOCK_SEQPACKET, as the protocol says: one recv, one message."""
    assert all(end.sock.type == socket.SOCK_SEQPACKET for end in ends)
