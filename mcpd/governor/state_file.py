"""One JSON document the governor learns and keeps in its state folder (learned power, the
cooling's baseline): read through safefs's bounded reader (never through a planted link), written
whole and atomically, at most once a minute, a failing disk said once until it works again."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import safefs
from sensors.episodes import Episodes

SAVE_INTERVAL_S = 60.0


class StateFile:
    """`name` in `folder`, at most `limit` bytes; `what` names it in `log`, its owner's."""

    def __init__(
        self, folder: str | Path, name: str, limit: int, what: str, log: logging.Logger
    ) -> None:
        self.folder = Path(folder)
        self.name = name
        self.limit = limit
        self.what = what
        self.log = log
        self._saved_at = float("-inf")
        self._failing: Episodes[Path] = Episodes(say_changes=True)

    @property
    def path(self) -> Path:
        return self.folder / self.name

    def read(self) -> object | None:
        """The document; None where there is none. OSError, or ValueError for a file that is
        not JSON within the bounds (safefs.CorruptFileError), where one is there and unusable."""
        try:
            folder = safefs.open_folder(self.folder)
        except FileNotFoundError:
            return None
        try:
            return safefs.read_json(folder, self.name, self.limit)
        finally:
            os.close(folder)

    def due(self, now: float) -> bool:
        return now - self._saved_at >= SAVE_INTERVAL_S

    def write(self, data: bytes, now: float) -> bool:
        """Replace the file with `data`; False (said once until a write works again) when the
        disk refuses. Either way the next write is due a minute from `now`."""
        self._saved_at = now
        try:
            folder = safefs.open_folder(self.folder, create=True)
            try:
                safefs.write_file(folder, self.name, data)
            finally:
                os.close(folder)
        except OSError as exc:
            problem = f"{self.path}: {exc.strerror or exc}"
            if self._failing.fail(self.path, problem):
                self.log.warning("%s not saved (%s); retried in a minute", self.what, problem)
            return False
        if self._failing.succeed(self.path):
            self.log.info("%s saved again to %s", self.what, self.path)
        return True
