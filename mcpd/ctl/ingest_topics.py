"""What `mcpctl ingest` subscribes to, and which board a topic is.

N ingest processes share a fleet's telemetry in one of two ways, decided here from what the broker
says in its CONNACK (pure: no client, no I/O):

- where the broker grants shared subscriptions (MQTT 5 §4.8.2; its CONNACK's "Shared Subscription
  Available" absent or 1), every member of a group subscribes to `$share/<group>/<prefix>/+/…` and
  the broker hands each message to one member;
- where it does not (ejabberd; any MQTT 3.1.1 broker, so RabbitMQ and NATS: docs/ingest.md §3),
  each process takes a part of the fleet by the site level of the topic prefix: one ingest per
  `--prefix mcpd/site-N` (a board's `topic_prefix`), so no message is written by two of them and
  none by none. A `--group` on such a broker is refused rather than turned into N processes that
  each write everything.
"""

from __future__ import annotations

import re

TELEMETRY = "telemetry"
STATUS = "status"
_GROUP = re.compile(r"[^/+#]+")


class NoSharedSubscriptions(Exception):
    """A group was asked for on a broker that has no shared subscriptions."""


def valid_group(group: str) -> bool:
    """A share name is a topic level without wildcards (MQTT 5 §4.8.2)."""
    return _GROUP.fullmatch(group) is not None


def subscriptions(prefix: str, group: str | None, shared_available: bool) -> list[str]:
    """The topic filters to subscribe to: every board's telemetry and status under `prefix`,
    shared by `group` when there is one."""
    plain = [f"{prefix}/+/{TELEMETRY}", f"{prefix}/+/{STATUS}"]
    if group is None:
        return plain
    if not shared_available:
        raise NoSharedSubscriptions(
            f"the broker has no shared subscriptions, so --group {group} cannot split the fleet: "
            "run one mcpctl ingest per site prefix instead (--prefix mcpd/site-1, --prefix "
            "mcpd/site-2, ...), without --group"
        )
    return [f"$share/{group}/{topic}" for topic in plain]


def board(topic: str, prefix: str) -> tuple[str, str] | None:
    """(device id, leaf) of `<prefix>/<id>/<leaf>`, or None for any other topic."""
    head, _, leaf = topic.rpartition("/")
    base, _, device = head.rpartition("/")
    if base != prefix or not device or leaf not in (TELEMETRY, STATUS):
        return None
    return device, leaf
