"""Faults said once per episode: the one rule for a problem that repeats at every sample.

A sensor read, a cap write or a save that fails at 10 Hz must not flood the journal, yet its start
and its end must each be said. An episode of a key starts with its first failure (say it), its
repeats are quiet, and it ends with the first success (say that once). With `say_changes`, a failure
for another reason than the one said is said too (a save failing first for a full disk, then for a
removed folder). Lives in `sensors`, the lowest layer that logs, so that the sensor adapters and the
daemon use the same one.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from typing import Generic, TypeVar

Key = TypeVar("Key", bound=Hashable)


class Episodes(Generic[Key]):
    def __init__(self, *, say_changes: bool = False, limit: int | None = None) -> None:
        self.say_changes = say_changes
        self.limit = limit
        """The most keys kept failing at once; the oldest episode is forgotten beyond it."""
        self._why: dict[Key, str] = {}

    def __contains__(self, key: Key) -> bool:
        return key in self._why

    def __len__(self) -> int:
        return len(self._why)

    def why(self, key: Key) -> str | None:
        """Why `key` is failing, or None when it is not."""
        return self._why.get(key)

    def fail(self, key: Key, why: str = "") -> bool:
        """Record a failure; True when it is to be said (an episode starts, or with `say_changes`
        its reason changed)."""
        before = self._why.pop(key, None)
        if before is None and self.limit is not None and len(self._why) >= self.limit:
            del self._why[next(iter(self._why))]
        self._why[key] = why
        return before is None or (self.say_changes and before != why)

    def succeed(self, key: Key) -> bool:
        """Record a success; True when it ends an episode (say that once)."""
        return self._why.pop(key, None) is not None


class Repeats(Generic[Key]):
    """A problem that can repeat thousands of times a second (a command flood, a failing load
    asked for in a loop, a udev storm): said the first time, then at most `times` times per
    `interval_s` per key (the interval starting at the first said), with how many times it happened
    unsaid in between. Episodes suits a problem that ends with a success; this one, repeats that
    have no end to wait for. At most `limit` keys are kept (the least recently said is forgotten),
    so varying keys cannot grow it without bound. No clock of its own: the caller passes `now`."""

    def __init__(self, interval_s: float, *, times: int = 1, limit: int = 256) -> None:
        self.interval_s = interval_s
        self.times = times
        self.limit = limit
        self._said: OrderedDict[Key, tuple[float, int, int]] = OrderedDict()
        """Per key: when its interval started, how many times it was said in it, and how many
        times it happened since it was last said, unsaid."""

    def say(self, key: Key, now: float) -> int | None:
        """Record one occurrence. None: stay quiet. Otherwise say it now, with the returned number
        of occurrences that were not said since it was last said (0 the first time)."""
        said = self._said.get(key)
        if said is None or now - said[0] >= self.interval_s:
            self._said[key] = (now, 1, 0)
        elif said[1] < self.times:
            self._said[key] = (said[0], said[1] + 1, 0)
        else:
            self._said[key] = (said[0], said[1], said[2] + 1)
            return None
        self._said.move_to_end(key)
        if len(self._said) > self.limit:
            self._said.popitem(last=False)
        return 0 if said is None else said[2]

    def quiet(self, key: Key, now: float) -> bool:
        """Whether `say(key, now)` would stay quiet; records nothing."""
        said = self._said.get(key)
        return said is not None and now - said[0] < self.interval_s and said[1] >= self.times

    def forget(self) -> None:
        """Forget every key: whatever happens next is said as if for the first time."""
        self._said.clear()

    def unsaid(self) -> int:
        """Occurrences not said yet, over every key."""
        return sum(unsaid for _, _, unsaid in self._said.values())
