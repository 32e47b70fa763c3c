"""The retry schedules (mcpd/backoff.py): the serving process's restarts and the MQTT broker's
reconnections, walked through with `now` passed in and the jitter's random source handed in, in
microseconds rather than the seconds of real waiting they take."""

from __future__ import annotations

import random
from pathlib import Path

from mcpd.backoff import Backoff
from mcpd.config import parse
from mcpd.governor.serving_child import BACKOFF_MAX_S, STABLE_S, restart_policy
from mcpd.telemetry.link import Link
from mcpd.telemetry.topics import Topics

QUICK_S = 0.1
"""How long a serving process of a crash loop runs."""


class Ends(random.Random):
    """Draws the lower end of the range, then the upper, in turn."""

    def __init__(self) -> None:
        super().__init__()
        self.draws = 0

    def uniform(self, a: float, b: float) -> float:
        self.draws += 1
        return a if self.draws % 2 else b


def test_serving_is_started_again_at_once_then_after_half_a_second_doubling_up_to_30_s() -> None:
    restarts = restart_policy()
    delays = [restarts.exited(QUICK_S, float(now)) for now in range(10)]
    assert delays == [0.0, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]
    assert restarts.backoff.failures == 10 and restarts.backoff.next_at == 9 + 30.0


def test_a_stable_run_ends_the_crash_loop() -> None:
    restarts = restart_policy()
    for _ in range(6):
        restarts.exited(QUICK_S, 0.0)
    assert restarts.exited(STABLE_S, 50.0) == 0.0 and restarts.backoff.next_at == 50.0
    assert restarts.backoff.failures == 0
    assert [restarts.exited(QUICK_S, 51.0) for _ in range(4)] == [0.0, 0.5, 1.0, 2.0]
    assert restarts.exited(STABLE_S - 0.001, 60.0) == 4.0  # not quite stable


def test_a_crash_loop_of_hours_still_waits_the_longest_delay() -> None:
    """At the 1 026th quick exit in a row (eight and a half hours of a crash loop at 30 s), 0.5 s x
    2 ** 1024 was no float: the delay raised OverflowError, the step failed, and serving was
    started again at once after every exit, a traceback each time."""
    restarts = restart_policy()
    delays = [restarts.exited(QUICK_S, 0.0) for _ in range(1100)]
    assert delays[-100:] == [BACKOFF_MAX_S] * 100


def test_each_delay_is_drawn_from_the_upper_half_of_its_nominal_value() -> None:
    backoff = Backoff(1.0, 8.0, jitter=Ends())
    assert [backoff.failed(0.0) for _ in range(6)] == [0.5, 2.0, 2.0, 8.0, 4.0, 8.0]
    backoff.succeeded(10.0)
    assert backoff.failed(10.0) == 0.5 and backoff.next_at == 10.5


def test_a_new_maximum_bounds_the_delay_after_next() -> None:
    """The maximum is read at each failure, as the link reads `reconnect_max_s` (a reload)."""
    backoff = Backoff(1.0, 60.0)
    assert [backoff.failed(0.0) for _ in range(4)] == [1.0, 2.0, 4.0, 8.0]
    backoff.max_s = 5.0
    assert [backoff.failed(0.0) for _ in range(3)] == [16.0, 5.0, 5.0]


def test_the_broker_is_tried_again_after_1_s_doubling_up_to_reconnect_max_s(
    tmp_path: Path,
) -> None:
    """Each attempt fails before it connects (its password file cannot be read), so the link's
    steps alone say when it next tries: 1, 2, 4, 8, 8 s, each from its upper half."""
    mqtt = parse(
        {
            "mqtt": {
                "enabled": True,
                "username": "board",
                "password_file": str(tmp_path / "missing"),
                "reconnect_max_s": 8,
            }
        }
    ).mqtt
    link = Link(mqtt, Topics("mcpd", "b1"), lambda: None, 0.0, jitter=Ends())
    now, delays = 0.0, []
    for _ in range(6):
        due = link.step(now, 0)
        delays.append(due - now)
        now = due
    assert delays == [0.5, 2.0, 2.0, 8.0, 4.0, 8.0]
    assert link.state == "idle" and link.client is None


def test_in_rounds_the_delay_doubles_after_each_round_not_each_failure() -> None:
    backoff = Backoff(1.0, 8.0, round_of=3)
    assert [backoff.failed(0.0) for _ in range(10)] == [1, 1, 1, 2, 2, 2, 4, 4, 4, 8]
    backoff.succeeded(1.0)
    assert backoff.failed(1.0) == 1.0


def test_with_three_brokers_each_is_tried_at_one_delay_before_the_next_round_waits_longer(
    tmp_path: Path,
) -> None:
    """A node refusing a board says nothing of the others (ejabberd refuses boards of surviving
    nodes while its cluster recovers from losing one): the delay doubles per round of the board's
    brokers. Before, it doubled per attempt: 0.5, 2, 2, 8, 4, 8 s for the same draws."""
    mqtt = parse(
        {
            "mqtt": {
                "enabled": True,
                "brokers": ["n1:1883", "n2:1883", "n3:1883"],
                "username": "board",
                "password_file": str(tmp_path / "missing"),
                "reconnect_max_s": 8,
            }
        }
    ).mqtt
    link = Link(mqtt, Topics("mcpd", "b1"), lambda: None, 0.0, jitter=Ends())
    now, delays, tried = 0.0, [], []
    for _ in range(6):
        due = link.step(now, 0)
        delays.append(due - now)
        tried.append(link.address)
        now = due
    assert delays == [0.5, 1.0, 0.5, 2.0, 1.0, 2.0]
    assert len(set(tried[:3])) == 3 and tried[3:] == tried[:3]
