"""Config files as the tests write them: the hostile ones every reader of a config must refuse
with one clear error."""

from __future__ import annotations

HOSTILE = {
    "not UTF-8": b'[daemon]\nlog_level = "\xff\xfe"\n',
    "UTF-16 with a BOM": '[daemon]\nlog_level = "info"\n'.encode("utf-16"),
    "5 000-digit integer": b"[sampling]\ntemperature_ms = " + b"9" * 5000 + b"\n",
    "4 000-digit integer": b"[sampling]\ntemperature_ms = " + b"9" * 4000 + b"\n",
    "arrays 10 000 deep": b"x = " + b"[" * 10_000 + b"]" * 10_000 + b"\n",
    "tables 10 000 deep": b"x = " + b"{a = " * 10_000 + b"1" + b"}" * 10_000 + b"\n",
    "valid TOML 500 deep": b"[daemon]\nsocket = " + b"[" * 500 + b"]" * 500 + b"\n",
    "NUL byte": b"[daemon]\x00\n",
    "valid TOML 20 deep": b"[daemon]\nsocket = " + b"[" * 20 + b"]" * 20 + b"\n",
}
