"""The loop's state as one immutable `Snapshot`, built from its parts when a status reader asks."""

from __future__ import annotations

from collections.abc import Mapping

from mcpd.governor.actuation import DomainControl
from mcpd.governor.board import Board
from mcpd.governor.readback import Readback
from mcpd.governor.thermal_forecast import headroom
from mcpd.snapshot import DomainStatus, LastAction, Snapshot
from mcpd.status import GovernorState
from sensors import PowerSample, SensorSet, TemperatureSample


def build(
    *,
    ts: float,
    board: Board,
    sensors: SensorSet,
    temperature: TemperatureSample,
    power: PowerSample,
    controls: Mapping[str, DomainControl],
    clocks: Readback,
    state: GovernorState,
    profile: str,
    policy: str,
    temp_high_c: float,
    last_action: LastAction | None,
    batch: Mapping[str, int],
    energy_j: float | None = None,
) -> Snapshot:
    return Snapshot(
        ts=ts,
        platform=board.platform,
        model=board.model,
        temperature_c=temperature.celsius,
        power_w=power.watts,
        power_estimated=sensors.power_plan.estimated,
        metered=sensors.power_plan.metered,
        power_source=sensors.power_plan.source,
        energy_j=energy_j,
        temperatures={r.name: r.celsius for r in temperature.readings},
        powers={r.name: r.watts for r in power.readings},
        domains=tuple(
            DomainStatus(
                name,
                c.domain.kind,
                clocks.caps.get(name),
                clocks.curs.get(name),
                c.target,
                c.low,
                c.high,
                c.failure,
            )
            for name, c in controls.items()
        ),
        state=state,
        profile=profile,
        last_action=last_action,
        batch=dict(batch),
        headroom=headroom(temperature.celsius, temp_high_c),
        external_cap_changes=clocks.external_changes,
        policy=policy,
    )
