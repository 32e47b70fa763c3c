"""The one fake clock: the pure parts take `now` as a callable, and a test moves it by hand."""

from __future__ import annotations


class FakeClock:
    """A monotonic clock that stands still until the test sets or advances `now`."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
