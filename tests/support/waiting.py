"""Waiting on real processes and threads without timed assertions: a condition polled up to a
bound that only ends a hung test, and a call that must not block."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(
    predicate: Callable[[], T],
    timeout: float,
    what: str,
    *,
    interval: float = 0.05,
    detail: Callable[[], str] | None = None,
) -> T:
    """Call `predicate` every `interval` s until it returns something true, and return that; fail
    naming `what` (and `detail()`, e.g. a daemon's log) if `timeout` s pass first."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            message = f"{what}: not within {timeout:g} s"
            raise AssertionError(f"{message}\n{detail()}" if detail else message)
        time.sleep(interval)


def within(seconds: float, call: Callable[[], T]) -> T:
    """`call()` (its result or its exception), failing the test instead of hanging it if it
    blocks."""
    result: list[T] = []
    raised: list[BaseException] = []

    def run() -> None:
        try:
            result.append(call())
        except BaseException as exc:
            raised.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"blocked for {seconds} s"
    if raised:
        raise raised[0]
    return result[0]
