"""Triton's model repository extension, the requests' side (docs/serving-protocol.md §2.3): the
fields each request may carry, and the index document. Loading and unloading are the
repository's.

A client never names a file: the load parameters Triton defines, "config" (a model configuration)
and "file:<version>/<name>" (a model file's bytes), would name or carry a model, so a load takes no
parameter at all, and every model it can load is one of the configuration.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mcpd.serving.codec import VERSION, parameters_of
from mcpd.serving.entry import Entry
from mcpd.serving.errors import RequestError
from mcpd.serving.values import brief

STATES = {
    "ready": "READY",
    "loading": "LOADING",
    "failed": "UNAVAILABLE",
    "unloaded": "UNAVAILABLE",
}


def _fields(body: Mapping[str, Any], what: str, keys: tuple[str, ...]) -> None:
    unknown = [key for key in body if key not in keys]
    if unknown:
        raise RequestError(
            f"{what}: field {brief(unknown[0])} is not accepted (only {', '.join(keys)})"
        )


def index(entries: Mapping[str, Entry], body: Mapping[str, Any]) -> list[dict[str, str]]:
    """Every configured model, or with `"ready": true` those ready, with its state and reason."""
    _fields(body, "index", ("ready",))
    only_ready = body.get("ready", False)
    if not isinstance(only_ready, bool):
        raise RequestError("index: ready must be true or false")
    return [
        {
            "name": name,
            "version": VERSION,
            "state": STATES[entry.state],
            # Triton's reason for a model it unloaded (docs/serving-protocol.md §2.3).
            "reason": "unloaded" if entry.state == "unloaded" else entry.error or "",
        }
        for name, entry in sorted(entries.items())
        if not only_ready or entry.state == "ready"
    ]


def check_load(body: Mapping[str, Any]) -> None:
    _fields(body, "load", ("parameters",))
    refused = list(parameters_of(body, "load"))
    if refused:
        raise RequestError(
            f"load: parameter {brief(refused[0])} is not accepted: mcpd loads only the models of "
            "its configuration, from the path there ([[models]] path)"
        )


def check_unload(body: Mapping[str, Any]) -> None:
    _fields(body, "unload", ("parameters",))
    for key, value in parameters_of(body, "unload").items():
        if key != "unload_dependents":
            raise RequestError(
                f"unload: parameter {brief(key)} is not accepted (only unload_dependents)"
            )
        if not isinstance(value, bool):  # accepted, and moot: mcpd has no ensembles
            raise RequestError("unload: unload_dependents must be true or false")
