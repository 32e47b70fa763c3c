"""Pure policies: readings, their state, `now` and the governed domains in, a decision out
(governors/policy.py)."""

from governors.adaptive import AdaptivePolicy
from governors.adaptive_governor import AdaptiveGovernor, LevelState
from governors.adaptive_state import AdaptiveState
from governors.hysteresis import HysteresisGovernor, RaiseHold
from governors.levels import DomainSteps, Level, allowed_mhz, stepped_levels, uniform_levels
from governors.params import PARAMETER_NAMES, GovernorParams
from governors.policy import Action, Decision, Domain, Policy, Readings, Step, Verdict

__all__ = [
    "PARAMETER_NAMES",
    "Action",
    "AdaptiveGovernor",
    "AdaptivePolicy",
    "AdaptiveState",
    "Decision",
    "Domain",
    "DomainSteps",
    "GovernorParams",
    "HysteresisGovernor",
    "Level",
    "LevelState",
    "Policy",
    "RaiseHold",
    "Readings",
    "Step",
    "Verdict",
    "allowed_mhz",
    "stepped_levels",
    "uniform_levels",
]
