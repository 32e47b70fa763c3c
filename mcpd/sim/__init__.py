"""A simulated board: a faithful sysfs tree under a folder, kept alive by a small plant model."""

from mcpd.sim.faults import CoolingFault, Fault
from mcpd.sim.profiles import ARM_PROFILES, Profile
from mcpd.sim.runner import STATE_FILE, LoadSchedule, Simulator
from mcpd.sim.tree import MEMORY_DIR
from mcpd.sim.x86_profiles import X86_PROFILES

PROFILES = {profile.name: profile for profile in (*ARM_PROFILES, *X86_PROFILES)}

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
