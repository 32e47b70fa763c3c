"""The caps a board had before mcpd touched them, kept on disk so they can always be put back.

Saved when mcpd adopts a domain, and in any case before the first write to it (tuned's
save-then-apply pattern); restored on a clean stop and by `mcpd restore` from systemd's
ExecStopPost after a crash, kill -9 or watchdog kill.
A baseline from an earlier boot is stale (sysfs starts from the firmware's caps again) and is set
aside rather than restored; so is a corrupt file. Restoring only writes to domains discovered on
the board now, at the path recorded: ExecStopPost runs privileged, and the file must never be a
way to write anywhere else in sysfs.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from mcpd.domains import DomainWriteError, FrequencyDomain
from sensors.sysfs import read_line

log = logging.getLogger("mcpd.baseline")

FILENAME = "baseline.json"
_FORMAT = 1


@dataclass(frozen=True)
class RestoreReport:
    restored: tuple[str, ...]
    problems: tuple[str, ...]


def _boot_id(root: Path) -> str | None:
    return read_line(root / "proc/sys/kernel/random/boot_id")


class Baseline:
    def __init__(self, state_dir: str | Path, root: str | Path) -> None:
        self.path = Path(state_dir) / FILENAME
        self.root = Path(root)
        self.boot_id = _boot_id(self.root)
        self.unreadable: str | None = None
        """Why an existing baseline could not be read; then no cap may be written (it would be
        replaced by caps that are not the originals)."""
        self.entries: dict[str, dict[str, str]] = self._load()

    def _set_aside(self, why: str) -> dict[str, dict[str, str]]:
        aside = self.path.with_name(f"{FILENAME}.{why}")
        log.warning("%s: %s baseline set aside as %s", self.path, why, aside.name)
        try:
            os.replace(self.path, aside)
        except OSError as exc:
            log.error("%s: cannot set aside: %s", self.path, exc.strerror)
        return {}

    def _load(self) -> dict[str, dict[str, str]]:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except PermissionError as exc:
            self.unreadable = f"{self.path}: {exc.strerror}"
            log.error("%s; no cap will be written until it is readable", self.unreadable)
            return {}
        except (OSError, ValueError):
            return self._set_aside("corrupt")
        if not isinstance(data, dict) or data.get("format") != _FORMAT:
            return self._set_aside("corrupt")
        if data.get("boot_id") != self.boot_id:
            return self._set_aside("stale")
        entries = data.get("domains")
        valid = isinstance(entries, dict) and all(
            isinstance(e, dict)
            and isinstance(e.get("path"), str)
            and isinstance(e.get("value"), str)
            for e in entries.values()
        )
        return (
            dict(cast(dict[str, dict[str, str]], entries)) if valid else self._set_aside("corrupt")
        )

    def _save(self) -> None:
        if not self.entries:
            self.path.unlink(missing_ok=True)
            return
        data = {"format": _FORMAT, "boot_id": self.boot_id, "domains": self.entries}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.path.with_name(f".{FILENAME}.tmp")
        with open(temporary, "w") as file:
            json.dump(data, file, indent=1, sort_keys=True)
            file.flush()
            os.fsync(file.fileno())
            if os.geteuid() == 0:
                # `mcpd restore` runs as root (ExecStopPost=+); the daemon that reads the file
                # next runs as the state folder's owner.
                folder = self.path.parent.stat()
                os.fchown(file.fileno(), folder.st_uid, folder.st_gid)
        os.replace(temporary, self.path)

    def _relative(self, path: Path) -> str:
        return os.path.relpath(path, self.root)

    def remember(self, *domains: FrequencyDomain) -> None:
        """Record the current cap of each domain not recorded yet (the first value wins: after a
        crash the caps in sysfs are mcpd's, the file holds the originals), in one save. Raises
        DomainWriteError, recording nothing, if a cap cannot be read or the file saved."""
        new = [domain for domain in domains if domain.name not in self.entries]
        if not new:
            return
        names = ", ".join(domain.name for domain in new)
        if self.unreadable is not None:
            raise DomainWriteError(
                f"{names}: not written, the baseline is unreadable ({self.unreadable})"
            )
        added = {}
        for domain in new:
            value = domain.read_cap_text()
            if value is None:
                raise DomainWriteError(
                    f"{domain.name}: cannot read the original cap from {domain.cap_path}"
                )
            added[domain.name] = {"path": self._relative(domain.cap_path), "value": value}
        self.entries.update(added)
        try:
            self._save()
        except OSError as exc:
            for name in added:
                del self.entries[name]
            raise DomainWriteError(
                f"{names}: cannot save the baseline to {self.path}: {exc}"
            ) from exc

    def restore(self, domains: list[FrequencyDomain]) -> RestoreReport:
        by_name = {domain.name: domain for domain in domains}
        restored, problems = [], []
        for name, entry in sorted(self.entries.items()):
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
        try:
            self._save()
        except OSError as exc:
            problems.append(f"{self.path}: cannot update: {exc}")
        return RestoreReport(tuple(restored), tuple(problems))
