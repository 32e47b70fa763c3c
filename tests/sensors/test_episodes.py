"""The one warn-once-per-episode rule (sensors/episodes.py)."""

from __future__ import annotations

from sensors.episodes import Episodes, Repeats


def test_an_episode_is_said_when_it_starts_and_when_it_ends() -> None:
    episodes: Episodes[str] = Episodes()
    assert episodes.fail("zone", "EIO")
    assert not episodes.fail("zone", "EIO")
    assert not episodes.fail("zone", "ENODATA")  # another reason, same episode
    assert episodes.why("zone") == "ENODATA" and "zone" in episodes
    assert episodes.succeed("zone")
    assert not episodes.succeed("zone")
    assert episodes.why("zone") is None and episodes.fail("zone", "EIO")


def test_with_say_changes_a_new_reason_is_said_too() -> None:
    episodes: Episodes[str] = Episodes(say_changes=True)
    assert episodes.fail("state", "disk full")
    assert not episodes.fail("state", "disk full")
    assert episodes.fail("state", "folder removed")


def test_beyond_the_limit_the_oldest_episode_is_forgotten() -> None:
    episodes: Episodes[int] = Episodes(limit=2)
    for key in (1, 2, 1, 3):
        episodes.fail(key)
    assert len(episodes) == 2 and 2 not in episodes and 1 in episodes and 3 in episodes


def test_a_repeat_is_said_once_per_interval_with_the_count_left_unsaid() -> None:
    repeats: Repeats[str] = Repeats(60.0)
    assert repeats.say("demo: EIO", 0.0) == 0
    assert [repeats.say("demo: EIO", t) for t in (1.0, 2.0, 59.9)] == [None, None, None]
    assert repeats.say("other", 30.0) == 0  # each key has its own interval
    assert repeats.unsaid() == 3
    assert repeats.say("demo: EIO", 60.0) == 3
    assert repeats.unsaid() == 0 and repeats.say("demo: EIO", 61.0) is None


def test_repeats_keep_at_most_limit_keys_forgetting_the_least_recently_said() -> None:
    repeats: Repeats[int] = Repeats(60.0, limit=2)
    for key in (1, 2, 3):
        assert repeats.say(key, 0.0) == 0
    assert repeats.say(2, 1.0) is None and repeats.say(3, 1.0) is None
    assert repeats.say(1, 1.0) == 0  # forgotten, so said again as new


def test_repeats_say_a_key_up_to_times_per_interval_from_the_first_said() -> None:
    repeats: Repeats[str] = Repeats(10.0, times=2)
    assert repeats.say("asyncio", 5.0) == 0
    assert not repeats.quiet("asyncio", 6.0)
    assert repeats.say("asyncio", 6.0) == 0
    assert repeats.quiet("asyncio", 14.9) and repeats.say("asyncio", 14.9) is None
    assert repeats.unsaid() == 1  # quiet() recorded nothing
    assert repeats.say("asyncio", 15.0) == 1


def test_forgotten_repeats_are_said_as_if_for_the_first_time() -> None:
    repeats: Repeats[str] = Repeats(60.0)
    assert repeats.say("broker refused", 0.0) == 0
    assert repeats.say("broker refused", 1.0) is None
    repeats.forget()
    assert repeats.say("broker refused", 2.0) == 0 and repeats.unsaid() == 0
