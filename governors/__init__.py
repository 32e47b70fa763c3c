"""Pure policies: readings (and, where a policy needs one, `now`) in, a decision out."""

from governors.adaptive import AdaptivePolicy, AdaptiveState
from governors.hysteresis import Action, Decision, HysteresisGovernor, RaiseHold, Readings, Verdict
from governors.levels import DomainSteps, Level, allowed_mhz, stepped_levels, uniform_levels
from governors.params import PARAMETER_NAMES, GovernorParams

__all__ = [
    "PARAMETER_NAMES",
    "Action",
    "AdaptivePolicy",
    "AdaptiveState",
    "Decision",
    "DomainSteps",
    "GovernorParams",
    "HysteresisGovernor",
    "Level",
    "RaiseHold",
    "Readings",
    "Verdict",
    "allowed_mhz",
    "stepped_levels",
    "uniform_levels",
]
