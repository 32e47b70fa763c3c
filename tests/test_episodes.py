"""The one warn-once-per-episode rule (sensors/episodes.py)."""

from __future__ import annotations

from sensors.episodes import Episodes


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
