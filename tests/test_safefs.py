"""Bounded reading of mcpd's JSON state files (safefs)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import safefs


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"[" * 100_000, "nested deeper than"),
        (b'{"a": ' * 40 + b"1" + b"}" * 40, "nested deeper than 32 levels"),
        (b"\xff\xfe", "not UTF-8"),
        (b'{"format": 1', "not JSON"),
    ],
    ids=["100k-brackets", "40-objects", "not-utf8", "truncated"],
)
def test_a_file_that_is_not_bounded_json_is_corrupt_never_a_crash(
    tmp_path: Path, data: bytes, why: str
) -> None:
    (tmp_path / "state.json").write_bytes(data)
    folder = safefs.open_folder(tmp_path)
    try:
        with pytest.raises(safefs.CorruptFileError, match=why):
            safefs.read_json(folder, "state.json", 2**20)
    finally:
        os.close(folder)


def test_a_document_as_deep_as_the_limit_is_read(tmp_path: Path) -> None:
    (tmp_path / "state.json").write_bytes(b"[" * 32 + b"]" * 32)
    folder = safefs.open_folder(tmp_path)
    try:
        document = safefs.read_json(folder, "state.json", 2**20)
        assert safefs.read_json(folder, "absent.json", 2**20) is None
    finally:
        os.close(folder)
    for _ in range(31):
        assert isinstance(document, list)
        document = document[0]
    assert document == []
