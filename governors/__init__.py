"""Pure policies: readings (and, where a policy needs one, `now`) in, a decision out."""

from governors.hysteresis import Action, Decision, HysteresisGovernor, RaiseHold, Readings, Verdict

__all__ = ["Action", "Decision", "HysteresisGovernor", "RaiseHold", "Readings", "Verdict"]
