"""`mcpctl ingest` running: startup (connect, serve /metrics) -> run (write until told to stop)
-> shutdown.

Threads: the broker's (mcpd/ctl/ingest_broker.py, with paho's network thread under it) puts
deliveries in a queue; the main thread takes them in batches, writes (mcpd/ctl/ingest_writer.py)
and acknowledges. SIGTERM/SIGINT only set an event: the batch being written is finished or, while
the store is away, left to the broker.
"""

from __future__ import annotations

import argparse
import queue
import random
import socket
import sys
import threading
import time

from mcpd.backoff import Backoff
from mcpd.ctl.ingest_batch import Templates
from mcpd.ctl.ingest_broker import RECEIVE_MAXIMUM, Access, BrokerSide
from mcpd.ctl.ingest_metrics import Counters, serve
from mcpd.ctl.ingest_writer import Delivery, Writer
from mcpd.ctl.remote_write import RemoteWrite

BATCH = 2_000
"""Messages per request at most (about 80 000 samples, 0.5 MB compressed)."""
IDLE_S = 0.5
"""How often an idle writer looks whether it is told to stop."""


def address(text: str, default_port: int) -> tuple[str, int]:
    """HOST[:PORT], IPv6 in brackets."""
    host, colon, port = text.rpartition(":")
    if not colon or host.endswith(":"):  # no port, or a bare IPv6 address
        return text.strip("[]"), default_port
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{text!r}: the port is not a number from 1 to 65535")
    return host.strip("[]"), int(port)


class Ingest:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.stopping = threading.Event()
        self.counters = Counters()
        self.deliveries: queue.Queue[Delivery] = queue.Queue(RECEIVE_MAXIMUM)
        default_port = 8883 if args.ca_file else 1883
        self.metrics = address(args.metrics_listen, 9102) if args.metrics_listen else None
        jitter = random.Random()
        self.store = RemoteWrite(args.remote_write)
        self.broker = BrokerSide(
            Access(
                [address(b, default_port) for b in args.broker],
                args.client_id or f"mcpctl-ingest-{socket.gethostname()}",
                args.username,
                args.password_file,
                args.ca_file,
                args.protocol,
            ),
            args.prefix,
            args.group,
            self.deliveries,
            Backoff(1.0, 30.0, jitter=jitter),
            time.monotonic,
        )
        self.writer = Writer(
            args.prefix,
            self.store.send,
            Templates(args.job),
            self.counters,
            wall=time.time,
            monotonic=time.monotonic,
            wait=self.stopping.wait,
            backoff=Backoff(0.5, 30.0, jitter=jitter),
        )

    def run(self) -> int:
        server = None if self.metrics is None else serve(self.counters, *self.metrics)[0]
        broker = threading.Thread(target=self.broker.run, args=(self.stopping,), name="broker")
        broker.start()
        try:
            while not self.stopping.is_set():
                self._once()
        finally:
            self.stopping.set()
            broker.join()
            self.store.close()
            if server is not None:
                server.shutdown()
        if self.broker.fatal is not None:
            print(f"mcpctl ingest: {self.broker.fatal}", file=sys.stderr)
            return 1
        return 0

    def _once(self) -> None:
        """One batch: what the broker delivered since the last one, up to BATCH messages."""
        try:
            batch = [self.deliveries.get(timeout=IDLE_S)]
        except queue.Empty:
            return
        while len(batch) < BATCH:
            try:
                batch.append(self.deliveries.get_nowait())
            except queue.Empty:
                break
        self.counters.received += len(batch)
        self.counters.queued = len(batch) + self.deliveries.qsize()
        if self.writer.write(self.writer.messages(batch)):
            for delivery in batch:
                self.broker.ack(delivery)
        self.counters.queued = self.deliveries.qsize()
