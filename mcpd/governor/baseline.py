"""The caps a board had before mcpd touched them, so they can always be put back.

Recorded in memory when mcpd adopts a domain, and in any case before the first write to it (tuned's
save-then-apply pattern); restored on a clean stop from memory, and by `mcpd restore` from systemd's
ExecStopPost after a crash, kill -9 or watchdog kill from the copies on disk: one in the runtime
folder (/run/mcpd, tmpfs: it never fills up with the disk) and one in the state folder
(/var/lib/mcpd). Throttling never waits for either: a copy that cannot be written (a full disk, a
folder removed at run time) is logged, retried every second (`keep`), and meanwhile the board is
throttled all the same, with a warning that restore-after-crash is not guaranteed.

A copy from an earlier boot is stale (sysfs starts from the firmware's caps again) and is set aside
rather than restored; so is one taken on another sysfs root or board (mcpd.governor.baseline_document),
a corrupt one, or anything planted in its place. Restoring only writes to
domains discovered on the board now, at the path recorded: ExecStopPost runs as root, and the file
(in a folder the unprivileged mcpd user owns) must never be a way to write anywhere else. Every file
here is read and written through safefs, which never follows a planted link.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import safefs
from mcpd.config import DaemonSection
from mcpd.governor import board as boards
from mcpd.governor.baseline_document import Entries, Origin, Unusable, parse, render
from mcpd.governor.domains import DomainWriteError, FrequencyDomain
from sensors.episodes import Episodes
from sensors.sysfs import read_line

log = logging.getLogger("mcpd.governor.baseline")

FILENAME = "baseline.json"
_LIMIT = 2**20
"""No baseline is anywhere near this big: a larger file was not written by mcpd."""


@dataclass(frozen=True)
class RestoreReport:
    restored: tuple[str, ...]
    problems: tuple[str, ...]


class Store:
    """One folder a copy of the baseline is kept in."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self.saved = True
        """Whether the copy on disk is the baseline in memory (nothing to save yet counts)."""
        self.unreadable: str | None = None
        """An existing copy that cannot be read: never overwritten, so `mcpd restore`, as root,
        can still put back the originals it holds."""

    @property
    def path(self) -> Path:
        return self.folder / FILENAME

    def load(self, here: Origin) -> Entries:
        try:
            folder = safefs.open_folder(self.folder)
        except FileNotFoundError:
            return {}
        except PermissionError as exc:
            self.unreadable = f"{self.folder}: {exc.strerror}"
            log.error(
                "baseline folder %s; a copy in it is kept for `mcpd restore`", self.unreadable
            )
            return {}
        except OSError as exc:  # a link or not a folder: nothing of ours is there
            log.error("baseline folder %s: %s", self.folder, exc.strerror)
            return {}
        # One descriptor for reading and setting aside: the folder is never looked up twice.
        try:
            _remove_temporaries(folder)
            document = safefs.read_json(folder, FILENAME, _LIMIT)
            if document is None:
                return {}
            return parse(document, here)
        except Unusable as exc:
            return self._set_aside(folder, exc.why, exc.suffix)
        except safefs.CorruptFileError as exc:
            return self._set_aside(folder, f"corrupt ({exc})", "corrupt")
        except safefs.UnsafeFileError as exc:
            return self._set_aside(folder, f"unsafe ({exc.strerror})", "unsafe")
        except PermissionError as exc:
            self.unreadable = f"{self.path}: {exc.strerror}"
            log.error("baseline %s; it is kept for `mcpd restore`", self.unreadable)
            return {}
        except OSError as exc:
            return self._set_aside(folder, f"unreadable ({exc.strerror})", "corrupt")
        finally:
            os.close(folder)

    def _set_aside(self, folder: int, why: str, suffix: str) -> Entries:
        aside = f"{FILENAME}.{suffix}"
        log.warning("%s: %s baseline set aside as %s", self.path, why, aside)
        try:
            safefs.rename(folder, FILENAME, aside)
        except OSError as exc:
            log.error("%s: cannot set aside: %s", self.path, exc.strerror)
        return {}

    def save(self, document: bytes | None) -> None:
        """Write the copy (None: remove it). Raises OSError."""
        if self.unreadable is not None:
            raise OSError(f"an earlier copy cannot be read ({self.unreadable}) and is kept")
        try:
            folder = safefs.open_folder(self.folder, create=document is not None)
        except FileNotFoundError:
            return  # nothing to remove
        try:
            if document is None:
                safefs.remove(folder, FILENAME)
            else:
                safefs.write_file(folder, FILENAME, document)
        finally:
            os.close(folder)

    def vanished(self) -> bool:
        try:
            return not os.path.isfile(self.path) or os.path.islink(self.path)
        except OSError:
            return True


def _remove_temporaries(folder: int) -> None:
    """Temporaries a crash left behind (never followed: unlink removes a link, not its target)."""
    for name in os.listdir(folder):
        if name.startswith(f".{FILENAME}.") and name.endswith(".tmp"):
            safefs.remove(folder, name)


def baseline_folders(daemon: DaemonSection) -> tuple[str, str]:
    """Where the copies are kept, the one on tmpfs first."""
    return daemon.runtime_dir, daemon.state_dir


class Baseline:
    """The original caps, in memory first, with a copy in each of `folders` (the first listed wins
    when copies disagree)."""

    def __init__(self, folders: Sequence[str | Path], root: str | Path, origin: Origin) -> None:
        self.root = Path(root)
        self.origin = origin
        self.stores = [Store(folder) for folder in folders]
        self._unsaved: Episodes[Path] = Episodes(say_changes=True)
        """Why a store's last save failed; logged once until a save works again."""
        self.entries: Entries = {}
        self.adopted: set[str] = set()
        """The domains this process adopted: the only ones its daemon writes to at stop."""

    @classmethod
    def load(
        cls, folders: Sequence[str | Path], root: str | Path, board: boards.Board | None = None
    ) -> Baseline:
        """The copies in `folders` taken on this boot, sysfs root and board (`board` as detected,
        or detected here)."""
        origin = Origin.of(
            read_line(Path(root) / "proc/sys/kernel/random/boot_id"),
            os.path.realpath(root),
            board or boards.detect(root),
        )
        baseline = cls(folders, root, origin)
        for store in baseline.stores:
            for name, entry in store.load(baseline.origin).items():
                baseline.entries.setdefault(name, entry)
        # A copy that lacks what another holds is written again at the first save.
        for store in baseline.stores:
            store.saved = not baseline.entries
        return baseline

    @property
    def at_risk(self) -> str | None:
        """Why restore-after-crash is not guaranteed now, or None."""
        if not self.entries or any(store.saved for store in self.stores):
            return None
        return "; ".join(self._unsaved.why(store.path) or "not saved yet" for store in self.stores)

    def _relative(self, path: Path) -> str:
        return os.path.relpath(path, self.root)

    def remember(self, domains: Iterable[FrequencyDomain]) -> None:
        """Record the current cap of each domain not recorded yet (the first value wins: after a
        crash the caps in sysfs are mcpd's, the copies hold the originals), then save the copies.
        Never raises: throttling must not wait for a disk."""
        added = {}
        for domain in domains:
            self.adopted.add(domain.name)
            if domain.name in self.entries:
                continue
            value = domain.read_cap_text()
            if value is None:
                # Unreadable now; the hardware maximum is what the firmware starts from.
                value = str(domain.hw_max)
                log.warning(
                    "%s: cannot read the original cap from %s; %s is kept as the one to restore",
                    domain.name,
                    domain.cap_path,
                    value,
                )
            added[domain.name] = {"path": self._relative(domain.cap_path), "value": value}
        if added:
            self.entries.update(added)
            for store in self.stores:
                store.saved = False
            self.keep()

    def keep(self) -> None:
        """Save every copy that is not saved or has vanished (a folder removed at run time is made
        again). Called after each change and once a second by the control loop."""
        if not self.entries:
            return
        document = None
        for store in self.stores:
            if store.saved and not store.vanished():
                continue
            if document is None:
                document = self._document()
            try:
                store.save(document)
            except OSError as exc:
                store.saved = False
                problem = f"cannot save the baseline to {store.path}: {exc.strerror or exc}"
                if self._unsaved.fail(store.path, problem):
                    others = [s.path for s in self.stores if s is not store and s.saved]
                    log.warning(
                        "%s; throttling goes on, %s",
                        problem,
                        f"restore after a crash uses {others[0]}"
                        if others
                        else "but restore after a crash is not guaranteed",
                    )
                continue
            store.saved = True
            if self._unsaved.succeed(store.path):
                log.info("baseline saved to %s again", store.path)

    def _document(self) -> bytes:
        return render(self.origin, self.entries)

    def restore(
        self, domains: list[FrequencyDomain], only: Collection[str] | None = None
    ) -> RestoreReport:
        """Write the originals back to `domains`, or to those of them named in `only` (a daemon
        passes what it adopted: the entries of domains it never governed stay in the copies, for
        `mcpd restore`), and save the copies with what is left."""
        by_name = {domain.name: domain for domain in domains}
        restored, problems = [], []
        for name, entry in sorted(self.entries.items()):
            if only is not None and name not in only:
                continue
            domain = by_name.get(name)
            if domain is None:
                problems.append(f"{name}: not present on this board now; kept for a later restore")
                continue
            if self._relative(domain.cap_path) != entry["path"]:
                problems.append(
                    f"{name}: baseline path {entry['path']!r} is not the domain's cap; refused"
                )
                continue
            try:
                domain.write_raw(entry["value"])
            except DomainWriteError as exc:
                problems.append(str(exc))
                continue
            log.info("%s: cap restored to %s", name, entry["value"])
            restored.append(name)
            del self.entries[name]
        document = self._document() if self.entries else None
        for store in self.stores:
            if store.unreadable is not None:
                continue
            try:
                store.save(document)
            except OSError as exc:
                problems.append(f"{store.path}: cannot update: {exc.strerror or exc}")
        return RestoreReport(tuple(restored), tuple(problems))
