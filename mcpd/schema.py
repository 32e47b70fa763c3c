"""Plain data (parsed TOML, or JSON from the governor) into frozen dataclasses, checked on the way.

Every key is typed (strictly: a boolean is not a number, 100.5 is not an integer, an integer is a
fine float), ranged by the `Check` in its `Annotated` type, and closed: an unknown key is an error
that lists the known ones. Every problem is named by its key path (`governor.hot_c`,
`models[1].name`) and all of them are reported at once. A dataclass's own `__post_init__` checks
the rules between its fields, raising ValueError; it runs only when every field is valid.

Hand-written rather than pydantic (18 MB of the governor's memory, measured in BENCHMARKS.md) or
msgspec (stops at the first problem and does not say what value it got): the config and the MQTT
commands' arguments are all it checks, and this is what they need.
"""

from __future__ import annotations

import dataclasses
import functools
import operator
import re
import reprlib
import types
import typing
from dataclasses import dataclass
from typing import Any, Literal, TypeVar, Union

T = TypeVar("T")
Location = tuple[int | str, ...]


@dataclass(frozen=True)
class Check:
    """Constraints on a value: `Annotated[int, Check(ge=10, le=60_000)]`."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    pattern: str | None = None
    """Matched in full (re.fullmatch)."""
    max_length: int | None = None
    min_items: int | None = None

    def problem(self, value: Any) -> str | None:
        """What is wrong with an already well-typed value, if anything."""
        for bound, holds, words in (
            (self.ge, operator.ge, "greater than or equal to"),
            (self.gt, operator.gt, "greater than"),
            (self.le, operator.le, "less than or equal to"),
            (self.lt, operator.lt, "less than"),
        ):
            if bound is not None and not holds(value, bound):
                return f"expected {words} {bound}"
        if self.max_length is not None and len(value) > self.max_length:
            return f"expected at most {self.max_length} characters"
        if self.pattern is not None and not _compiled(self.pattern).fullmatch(value):
            return f"expected a string matching '{self.pattern}'"
        if self.min_items is not None and len(value) < self.min_items:
            return f"expected at least {self.min_items} item{'s' * (self.min_items != 1)}"
        return None


class Invalid(Exception):
    """The data does not fit; `problems` are "key.path: what is wrong" lines."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("; ".join(problems))


def build(cls: type[T], data: object) -> T:
    """`data` as a `cls`, or Invalid naming every problem."""
    problems: list[str] = []
    value = _Builder(problems).convert(cls, data, ())
    if problems:
        raise Invalid(problems)
    return typing.cast(T, value)


def key_path(loc: Location) -> str:
    path = ""
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path or "(top level)"


@functools.cache
def hints(cls: type) -> dict[str, Any]:
    """A dataclass's field types, `Annotated` kept (resolved once per class)."""
    return typing.get_type_hints(cls, include_extras=True)


@functools.cache
def _compiled(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)


def _short_repr() -> reprlib.Repr:
    """Quotes what a key was given without echoing a 4 000-digit number or a 500-deep list whole
    (attributes, not keywords: Python 3.10 and 3.11 take none)."""
    short = reprlib.Repr()
    short.maxlevel, short.maxstring, short.maxlong, short.maxother = 3, 60, 40, 60
    return short


_SHORT = _short_repr()

_SCALARS: dict[type, tuple[str, Any]] = {
    bool: ("a valid boolean", lambda v: isinstance(v, bool)),
    int: ("a valid integer", lambda v: isinstance(v, int) and not isinstance(v, bool)),
    float: ("a valid number", lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)),
    str: ("a valid string", lambda v: isinstance(v, str)),
}


class _Builder:
    def __init__(self, problems: list[str]) -> None:
        self.problems = problems

    def _wrong(self, loc: Location, what: str, value: Any) -> None:
        self.problems.append(f"{key_path(loc)}: {what}, got {_SHORT.repr(value)}")

    def convert(self, tp: Any, value: Any, loc: Location) -> Any:
        """`value` as type `tp`; on a problem, it is recorded and the result is meaningless."""
        origin = typing.get_origin(tp)
        args = typing.get_args(tp)
        if origin is typing.Annotated:
            before = len(self.problems)
            result = self.convert(args[0], value, loc)
            for check in args[1:]:
                problem = check.problem(result) if len(self.problems) == before else None
                if problem is not None:
                    self._wrong(loc, problem, value)
            return result
        if origin in (Union, types.UnionType):
            if value is None and type(None) in args:
                return None
            (kind,) = [arg for arg in args if arg is not type(None)]
            return self.convert(kind, value, loc)
        if origin is Literal:
            if any(value == arg and type(value) is type(arg) for arg in args):
                return value
            choices = [repr(arg) for arg in args]
            self._wrong(loc, f"expected {', '.join(choices[:-1])} or {choices[-1]}", value)
            return value
        if origin is tuple:
            if not isinstance(value, (list, tuple)):
                self._wrong(loc, "expected a list", value)
                return ()
            return tuple(self.convert(args[0], item, (*loc, i)) for i, item in enumerate(value))
        if origin is dict:
            return self._table(args, value, loc)
        if dataclasses.is_dataclass(tp):
            return self._section(typing.cast(type, tp), value, loc)
        expected, valid = _SCALARS[tp]
        if not valid(value):
            self._wrong(loc, f"expected {expected}", value)
            return value
        return float(value) if tp is float else value

    def _table(self, args: tuple[Any, ...], value: Any, loc: Location) -> dict[Any, Any]:
        """A table whose keys are names (`[governor.domains.NAME]`)."""
        if not isinstance(value, dict):
            self._wrong(loc, "expected a table", value)
            return {}
        result = {}
        for key, item in value.items():
            problem = _name_problem(args[0], key)
            if problem is not None:
                self.problems.append(f"{key_path((*loc, key))}: table name {problem}")
            result[key] = self.convert(args[1], item, (*loc, key))
        return result

    def _section(self, cls: type, value: Any, loc: Location) -> Any:
        if not isinstance(value, dict):
            self._wrong(loc, "expected a table", value)
            return None
        before = len(self.problems)
        fields = {f.name: f for f in dataclasses.fields(cls)}
        kwargs = {}
        for name, f in fields.items():
            if name in value:
                kwargs[name] = self.convert(hints(cls)[name], value[name], (*loc, name))
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                self.problems.append(f"{key_path((*loc, name))}: required key is missing")
        for key in value:
            if key not in fields:
                known = f"expected one of: {', '.join(fields)}" if fields else "none is taken"
                self.problems.append(f"{key_path((*loc, key))}: unknown key; {known}")
        if len(self.problems) > before:
            return None
        try:
            return cls(**kwargs)
        except ValueError as exc:
            self.problems.append(f"{key_path(loc)}: {exc}")
            return None


def _name_problem(tp: Any, name: Any) -> str | None:
    """What is wrong with a table's key (a string type, perhaps with a Check), if anything."""
    base, *checks = typing.get_args(tp) if typing.get_origin(tp) is typing.Annotated else (tp,)
    expected, valid = _SCALARS[base]
    if not valid(name):
        return f"expected {expected}"
    return next((p for check in checks if (p := check.problem(name)) is not None), None)
