"""Whether a value parsed from JSON has the shape a TypedDict says: the keys, exactly, and the type
of each value, down to Literal states. mcpd.ipc checks every message the other process sends with
it; the tests check the status document against its contract (mcpd.status) with it."""

from __future__ import annotations

import functools
import types
import typing
from typing import Any, Literal, Union, get_args, get_origin, is_typeddict

_hints = functools.cache(typing.get_type_hints)
"""Per TypedDict (a few classes): looked up for every message, evaluated once."""


def mismatches(value: object, hint: Any, where: str = "document") -> list[str]:
    """Where `value` does not have the shape `hint` says; empty when it has."""
    if hint is bool or hint is int or hint is float or hint is str:
        allowed = (int, float) if hint is float else hint
        ok = isinstance(value, allowed) and (hint is bool or not isinstance(value, bool))
        return [] if ok else [f"{where}: {value!r} is not {hint.__name__}"]
    if hint is object or hint is Any:
        return []
    if hint is type(None):
        return [] if value is None else [f"{where}: {value!r} is not null"]
    if is_typeddict(hint):
        if not isinstance(value, dict):
            return [f"{where}: {value!r} is not an object"]
        hints = _hints(hint)
        found = [f"{where}: extra key {key!r}" for key in value.keys() - hints.keys()]
        found += [f"{where}: no key {key!r}" for key in hints.keys() - value.keys()]
        for key in hints.keys() & value.keys():
            found += mismatches(value[key], hints[key], f"{where}.{key}")
        return found
    origin = get_origin(hint)
    if origin is Literal:
        return [] if value in get_args(hint) else [f"{where}: {value!r} is not one of its states"]
    if origin in (Union, types.UnionType):
        options = [mismatches(value, option, where) for option in get_args(hint)]
        return [] if any(not found for found in options) else min(options, key=len)
    if origin is dict:
        if not isinstance(value, dict):
            return [f"{where}: {value!r} is not an object"]
        _, item = get_args(hint)
        if item is Any:  # a configuration, a model's detail: checked by whoever reads them
            return []
        return [p for key, v in value.items() for p in mismatches(v, item, f"{where}[{key!r}]")]
    if origin is list:
        if not isinstance(value, list):
            return [f"{where}: {value!r} is not a list"]
        (item,) = get_args(hint)
        return [p for i, v in enumerate(value) for p in mismatches(v, item, f"{where}[{i}]")]
    raise TypeError(f"{where}: no check for {hint!r}")
