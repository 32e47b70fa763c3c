"""The control loop's settings, taken from the config: one immutable value, swapped whole on reload."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from governors import AdaptivePolicy, GovernorParams, HysteresisGovernor
from mcpd.config import Config, DomainSection


@dataclass(frozen=True)
class LoopSettings:
    temperature_s: float = 0.2
    power_s: float = 0.1
    stale_s: float = 1.0
    params: GovernorParams = field(default_factory=GovernorParams)
    policy: str = "hysteresis"
    """"hysteresis" (the seed rule, `governor`) or "adaptive" (`adaptive`); both run on `params`."""
    raise_hold_s: float = 0.0
    domain_overrides: Mapping[str, DomainSection] = field(default_factory=dict)
    models: Mapping[str, int] = field(default_factory=dict)
    """Model name -> max_batch."""
    governing_temperatures: tuple[str, ...] = ()
    governing_powers: tuple[str, ...] = ()
    rescan_s: float = 10.0
    """Periodic re-discovery where no udev monitor runs (fake trees, containers)."""
    profile: str = "default"
    governor: HysteresisGovernor = field(init=False)
    adaptive: AdaptivePolicy = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "governor", HysteresisGovernor(self.params))
        object.__setattr__(self, "adaptive", AdaptivePolicy(self.params))

    @classmethod
    def from_config(cls, config: Config, profile: str | None = None) -> LoopSettings:
        """Settings from a config, with one of its governor profiles (default: the configured one)."""
        profile = profile or config.governor.profile
        g = config.governor.tuned(profile)
        return cls(
            temperature_s=config.sampling.temperature_ms / 1000,
            power_s=config.sampling.power_ms / 1000,
            stale_s=config.sampling.stale_ms / 1000,
            params=g.params(),
            policy=g.policy,
            raise_hold_s=g.raise_hold_ms / 1000,
            domain_overrides=dict(g.domains),
            models={model.name: model.max_batch for model in config.models},
            governing_temperatures=config.sensors.governing_temperatures,
            governing_powers=config.sensors.governing_powers,
            profile=profile,
        )
