"""The boards of bench/mqtt_cluster.py: mcpd's own telemetry `Publisher` (encoder, spool, link,
liveness: what each daemon runs), one per board, in a process of their own as bench/mqtt_fleet.py
runs them, so that the process that measures does not share their interpreter.

    boards = Boards([(device, mqtt_values), ...], folder)   # started at random phases
    boards.connections()        # {device: (broker, since)}: where each is and since when
    boards.stop()               # each flushes its spool, says offline and disconnects; returns
                                # {device: [seq the broker acknowledged (PUBACK), ...]}
"""

from __future__ import annotations

import json
import multiprocessing
import random
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mcpd.config import MqttSection
from mcpd.schema import build
from mcpd.telemetry.journal import Message
from mcpd.telemetry.publisher import Publisher
from tests.support.mqtt_status import FakeBoard

Plan = list[tuple[str, dict[str, Any]]]
"""(device id, its [mqtt] values)."""


class Boards:
    def __init__(self, plan: Plan, folder: Path) -> None:
        context = multiprocessing.get_context("spawn")
        self._conn, theirs = context.Pipe()
        self.process = context.Process(target=_run, args=(theirs, plan, folder), daemon=True)
        self.process.start()
        if self._conn.recv() != "started":
            raise RuntimeError("the boards did not start")

    @property
    def pid(self) -> int:
        assert self.process.pid is not None
        return self.process.pid

    def connections(self) -> dict[str, tuple[str | None, float | None]]:
        self._conn.send("connections")
        answer: dict[str, tuple[str | None, float | None]] = self._conn.recv()
        return answer

    def stop(self) -> dict[str, list[int]]:
        self._conn.send("stop")
        acked: dict[str, list[int]] = self._conn.recv()
        self.process.join(30)
        return acked


def noting(acked: list[int]) -> Callable[[Message], None]:
    """What a board's Publisher is told of each message the broker acknowledged: the seqs of its
    telemetry go in `acked`, the first stage of the bench's count (what the boards may forget,
    as delivered)."""

    def delivered(message: Message) -> None:
        if message.kind == "telemetry":
            acked.append(json.loads(message.payload)["seq"])

    return delivered


def _run(conn: Connection, plan: Plan, folder: Path) -> None:
    """The boards' process: each board starts at a random phase within its first period, as a
    fleet's boards tick independently."""
    began = time.monotonic()
    phases = {device: random.random() for device, _ in plan}
    boards = []
    acked: dict[str, list[int]] = {}
    for device, values in sorted(plan, key=lambda board: phases[board[0]]):
        mqtt = build(MqttSection, values)
        time.sleep(max(0.0, began + phases[device] * mqtt.telemetry_ms / 1000 - time.monotonic()))
        acked[device] = []
        board = Publisher(
            mqtt, device, folder / f"{device}.spool", FakeBoard(), delivered=noting(acked[device])
        )
        board.start()
        boards.append(board)
    conn.send("started")
    while conn.recv() == "connections":
        conn.send(
            {b.topics.device: (b.connection["broker"], b.connection["since"]) for b in boards}
        )
    # Together: one after the other, each waiting for its last acknowledgements, takes minutes.
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(Publisher.stop, boards))
    conn.send(acked)
