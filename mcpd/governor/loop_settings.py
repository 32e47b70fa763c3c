"""The control loop's settings, taken from the config: one immutable value, swapped whole on reload."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from governors import AdaptiveGovernor, AdaptivePolicy, GovernorParams, HysteresisGovernor, Policy
from mcpd.config import Config, CoolingSection, DomainSection
from sensors.discovery import PowerOptions

POLICIES: Mapping[str, Callable[[GovernorParams, float], Policy[Any]]] = {
    "hysteresis": HysteresisGovernor,
    "adaptive": lambda params, _raise_hold_s: AdaptiveGovernor(AdaptivePolicy(params)),
}
"""Each `[governor] policy` by name, built from the parameters and the raise hold."""


@dataclass(frozen=True)
class LoopSettings:
    temperature_s: float = 0.2
    power_s: float = 0.1
    stale_s: float = 1.0
    params: GovernorParams = field(default_factory=GovernorParams)
    policy: str = "hysteresis"
    """"hysteresis" (the seed rule) or "adaptive", a name in POLICIES; both run on `params`."""
    raise_hold_s: float = 0.0
    domain_overrides: Mapping[str, DomainSection] = field(default_factory=dict)
    models: Mapping[str, int] = field(default_factory=dict)
    """Model name -> max_batch."""
    governing_temperatures: tuple[str, ...] = ()
    governing_powers: tuple[str, ...] = ()
    power: PowerOptions = field(default_factory=PowerOptions)
    """`[sensors] power`: meter, estimate or either (sensors/estimate.py)."""
    rescan_s: float = 10.0
    """Periodic re-discovery where no udev monitor runs (fake trees, containers)."""
    profile: str = "default"
    cooling: CoolingSection = field(default_factory=CoolingSection)
    governing: Policy[Any] = field(init=False)
    """The policy named by `policy`, with these settings."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "governing", POLICIES[self.policy](self.params, self.raise_hold_s))

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
            power=config.sensors.power_options(),
            profile=profile,
            cooling=config.cooling,
        )
