"""What a saved baseline says, and whether a copy found on disk is this board's (pure: no I/O).

A copy belongs to one boot, one sysfs root and one board. The runtime folder (/run/mcpd) is shared
by every daemon that does not set its own, so a copy there may have been written by a daemon on
another tree: issue 26 saw one on a simulated RK3588 read the copy of one on an x86 tree, take its
policy1-3 (4 700 000 kHz) for its own originals and fail at stop to restore domains it never had.
Its policy0 would have been "restored" to the x86 value. So each copy names the resolved sysfs root
and the board (platform, device-tree model and compatible, or DMI model: fixed for a boot; not the
L4T release, which an upgrade rewrites before the reboot), and a copy that names another is set
aside, never restored.

Format 1 (before issue 26) named only the boot. Such a copy of this boot is taken on the real root
`/` only: there its boot id is the running kernel's, which only a daemon on `/` reads (a simulated
tree makes up its own, a fake tree without one has none), and a boot has one board. On any other
root it may be another tree's, and is set aside.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, cast

from mcpd.governor.board import Board

FORMAT = 2
Entries = dict[str, dict[str, str]]
"""Domain name -> {"path": the cap relative to the sysfs root, "value": the original cap}."""


@dataclass(frozen=True)
class Origin:
    """Where the caps were taken from."""

    boot_id: str | None
    sysfs_root: str
    """Resolved (os.path.realpath)."""
    board: dict[str, Any]

    @classmethod
    def of(cls, boot_id: str | None, sysfs_root: str, board: Board) -> Origin:
        identity = {"platform": board.platform, "model": board.model}
        return cls(boot_id, sysfs_root, {**identity, "compatible": list(board.compatible)})

    def describe(self) -> str:
        model = self.board.get("model")
        board = f"{self.board.get('platform')}" + (f" ({model})" if model else "")
        return f"{board} under {self.sysfs_root}"


class Unusable(Exception):
    """A copy that is not restored here; `suffix` names what it is set aside as."""

    def __init__(self, suffix: str, why: str) -> None:
        super().__init__(why)
        self.suffix = suffix
        self.why = why


def render(origin: Origin, entries: Entries) -> bytes:
    data = {
        "format": FORMAT,
        "boot_id": origin.boot_id,
        "sysfs_root": origin.sysfs_root,
        "board": origin.board,
        "domains": entries,
    }
    return json.dumps(data, indent=1, sort_keys=True).encode()


def parse(document: object, here: Origin) -> Entries:
    """The entries of a copy taken `here`. Raises Unusable: "corrupt" (not what mcpd writes),
    "foreign" (another sysfs root or board), "stale" (an earlier boot)."""
    if not isinstance(document, dict) or document.get("format") not in (1, FORMAT):
        raise Unusable("corrupt", "corrupt (not a baseline of format 1 or 2)")
    entries = document.get("domains")
    if not isinstance(entries, dict) or not all(
        isinstance(e, dict) and isinstance(e.get("path"), str) and isinstance(e.get("value"), str)
        for e in entries.values()
    ):
        raise Unusable("corrupt", 'corrupt ("domains" is not a map of paths and values)')
    if document["format"] == 1:
        if here.sysfs_root != "/":
            raise Unusable(
                "foreign",
                "foreign (format 1 names no sysfs root or board: it may be another tree's; this is "
                f"{here.describe()})",
            )
    else:
        root, board = document.get("sysfs_root"), document.get("board")
        if not isinstance(root, str) or not isinstance(board, dict):
            raise Unusable("corrupt", 'corrupt ("sysfs_root" or "board" missing)')
        there = Origin(here.boot_id, root, board)
        if there != here:
            raise Unusable(
                "foreign", f"foreign (taken on {there.describe()}; this is {here.describe()})"
            )
    if document.get("boot_id") != here.boot_id:
        raise Unusable("stale", "stale (an earlier boot's)")
    return dict(cast(Entries, entries))
