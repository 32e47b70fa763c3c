"""A governor snapshot with plausible defaults, each field overridable."""

from __future__ import annotations

from mcpd.snapshot import Snapshot


def snapshot(**fields: object) -> Snapshot:
    base: dict[str, object] = dict(
        ts=1.7e9,
        platform="rk3588",
        model=None,
        temperature_c=79.0,
        power_w=None,
        power_estimated=False,
        metered=False,
        temperatures={},
        powers={},
        domains=(),
        state="holding",
        profile="default",
        last_action=None,
        batch={},
    )
    return Snapshot(**{**base, **fields})  # type: ignore[arg-type]
