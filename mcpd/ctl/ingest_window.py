"""Which telemetry messages `mcpctl ingest` has already taken: duplicates by `(device, seq)`.

A message comes twice when the broker sends it again (QoS 1 after a lost acknowledgement, a
session resumed after a reconnection) or when a board sends it again (one in flight at a power
cut: README, "No data lost"). Pure: numbers in, verdicts out.

Per board, a sliding window over its last WINDOW sequence numbers, one bit each, as IPsec's
anti-replay window (RFC 4303 §3.4.3): the highest number seen, and which of the WINDOW below it
were seen. A board's numbers only grow (mcpd/telemetry/seqfile.py), so the window moves with it:
128 bytes a board, whatever its rate. A number older than the window is let through rather than
refused as IPsec does: a message is never dropped for being late, and writing one sample twice is
harmless (it carries the same time and value, docs/ingest.md §2).
"""

from __future__ import annotations

WINDOW = 1024
"""Numbers per board: at 1 message/s, 17 minutes of a board's messages; the broker re-sends
within seconds of a reconnection."""


class SeqWindow:
    def __init__(self, size: int = WINDOW) -> None:
        self.size = size
        self._boards: dict[str, tuple[int, int]] = {}
        """device -> (highest seq, bit i set: highest - i seen)."""

    def first_time(self, device: str, seq: int) -> bool:
        """True the first time `(device, seq)` is offered (and it is remembered), False for a
        duplicate inside the window."""
        known = self._boards.get(device)
        if known is None:
            self._boards[device] = (seq, 1)
            return True
        highest, seen = known
        if seq > highest:
            shift = seq - highest
            seen = ((seen << shift) | 1) & ((1 << self.size) - 1) if shift < self.size else 1
            self._boards[device] = (seq, seen)
            return True
        behind = highest - seq
        if behind >= self.size:
            return True  # older than the window: not known either way
        if seen >> behind & 1:
            return False
        self._boards[device] = (highest, seen | 1 << behind)
        return True

    def __len__(self) -> int:
        return len(self._boards)
