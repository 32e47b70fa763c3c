"""What a client's values must be before anything uses them: JSON that parses (and is not nested
past the interpreter's recursion limit), the protocol's integers, a header of ASCII digits; and how
an error quotes them.
"""

from __future__ import annotations

import json
import reprlib
from typing import Any

from mcpd.serving.errors import RequestError

INT64_MAX = 2**63 - 1
"""The protocol's integers are int64: binary_data_size, shared_memory_byte_size and _offset, the
timeout (triton-inference-server/server docs/protocol/extension_binary_data.md,
extension_shared_memory.md, extension_schedule_policy.md)."""


def _brief_repr() -> reprlib.Repr:
    short = reprlib.Repr()  # Python 3.11's takes no arguments
    short.maxlevel, short.maxlist, short.maxdict = 3, 4, 4
    short.maxstring = short.maxother = short.maxlong = 40
    return short


_brief = _brief_repr()


def brief(value: object) -> str:
    """A client's value quoted in an error: short whatever its size or depth."""
    return _brief.repr(value)


def parse_json(data: bytes | bytearray, what: str) -> Any:
    try:
        return json.loads(data)
    except RecursionError:
        raise RequestError(f"{what}: JSON nested too deep") from None
    except ValueError as exc:  # also UnicodeDecodeError and over-long integers
        raise RequestError(f"malformed JSON in {what}: {exc}") from None


def header_length(value: str | None) -> int | None:
    """The Inference-Header-Content-Length header: ASCII digits only (str.isdigit also takes
    superscripts and other scripts' digits, which int() refuses)."""
    if value is None:
        return None
    if not (value.isascii() and value.isdigit() and len(value) <= 19):
        raise RequestError(f"Inference-Header-Content-Length {value!r} is not a number")
    return int(value)


def integer(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= INT64_MAX:
        raise RequestError(f"{what} must be an integer from 0 to 2^63-1, got {brief(value)}")
    return value
