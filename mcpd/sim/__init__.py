"""A simulated board: a faithful sysfs tree under a folder, kept alive by a small plant model."""

from mcpd.sim.faults import CoolingFault, Fault
from mcpd.sim.profiles import PROFILES, Profile
from mcpd.sim.runner import STATE_FILE, LoadSchedule, Simulator
from mcpd.sim.tree import MEMORY_DIR

__all__ = [
    "MEMORY_DIR",
    "PROFILES",
    "STATE_FILE",
    "CoolingFault",
    "Fault",
    "LoadSchedule",
    "Profile",
    "Simulator",
]
