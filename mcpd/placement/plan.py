"""The placement plan: which CPUs the governor, the serving process's event loop and each model's
threads run on, from the board's CPU topology and the config alone (pure: no I/O, no clock).

The rules (README, "Placement"):

- CPUs are ranked by what this kernel tells apart: cpu_capacity where it differs between CPUs,
  else the Intel hybrid core type (P over E), else the cpufreq maximum, else nothing. The fast
  CPUs are those within 10 % of the best (RK3588's two A76 clusters, a hybrid part's P-cores,
  intel_pstate's favoured cores among the others); the efficient ones are the slowest.
- The governor runs on the first efficient CPU; serving's event loop on the next efficient CPU
  that no model uses, else beside the governor (a real-time governor is idle but for ~1 % of a
  core, and takes it back at once when it needs it).
- Models get the fast CPUs, one thread per physical core (an SMT sibling shares the core's
  execution units, and onnxruntime's parallel sections wait for their slowest thread), on one
  NUMA node: the one with the most such cores. Where every CPU is alike, the governor's core is
  left out of the models' while that leaves them one.
- A model with `cpus` of its own gets those (one thread per physical core among them). The
  others split the fast cores that no `cpus` names, in config order, as evenly as they go (the
  first ones take the odd core), each on cores of its own so that no model's spinning threads
  take another's core; with more such models than cores they all share them. A model's thread
  count is its runtime's own setting where it is not 0 (`[models.onnxruntime] intra_op_threads`,
  `[models.openvino] threads`): beyond its cores its threads go on their siblings, then around.
- A part of the plan naming a CPU this process may not use (a simulated board's CPU this machine
  lacks, a cpuset) is skipped and says why; the rest is applied.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from mcpd.config import Config, ModelSection
from mcpd.status import CpusDoc, ModelPlacementDoc, PlacementDoc
from sensors import cpulist
from sensors.hybrid import CoreType
from sensors.topology import Cpu, CpuTopology

_CORE_TYPES: dict[str, CoreType] = {"core": "core", "atom": "atom"}

FAST_WITHIN = 0.9
"""A CPU this close to the best is fast: binning (a favoured core's extra 100-200 MHz, a cluster
clocked a step lower) must not split a class of identical cores."""


@dataclass(frozen=True)
class ModelRequest:
    name: str
    cpus: frozenset[int] | None
    """`[[models]] cpus`; None: the plan's share."""
    threads: int
    """The runtime's thread setting; 0: one per physical core of its CPUs."""

    @classmethod
    def of(cls, model: ModelSection) -> ModelRequest:
        served_by = model.served_by()
        threads = (
            model.openvino.threads
            if served_by == "openvino"
            else model.onnxruntime.intra_op_threads
        )
        return cls(model.name, cpulist.parse(model.cpus) if model.cpus else None, threads)


@dataclass(frozen=True)
class Placement:
    cpus: tuple[int, ...] = ()
    skipped: str | None = None

    def doc(self) -> CpusDoc:
        return {"cpus": cpulist.format_list(self.cpus), "skipped": self.skipped}


@dataclass(frozen=True)
class ModelPlacement:
    thread_cpus: tuple[int, ...] = ()
    """Thread i's CPU; () where the runtime places its threads."""
    configured: bool = False
    core_type: CoreType | None = None
    smt: bool = False
    skipped: str | None = None
    allowed: tuple[int, ...] = ()
    """Where its threads may run, in the serving process: its threads' CPUs where it is
    placed, else every CPU mcpd may use (never the event loop's, which the serving process's
    threads would otherwise inherit)."""

    def doc(self) -> ModelPlacementDoc:
        return {
            "cpus": cpulist.format_list(self.thread_cpus),
            "skipped": self.skipped,
            "threads": len(self.thread_cpus),
            "thread_cpus": list(self.thread_cpus),
            "configured": self.configured,
            "core_type": self.core_type,
            "smt": self.smt,
        }

    @classmethod
    def of(cls, doc: ModelPlacementDoc, usable: tuple[int, ...]) -> ModelPlacement:
        """What the serving process applies: the plan's threads, or none where it skipped them
        (the model then runs anywhere mcpd may)."""
        if doc["skipped"] is not None or not doc["thread_cpus"]:
            return cls(allowed=usable)
        cpus = tuple(doc["thread_cpus"])
        core_type = _CORE_TYPES.get(doc["core_type"] or "")
        return cls(cpus, doc["configured"], core_type, doc["smt"], None, tuple(sorted(set(cpus))))


UNPLACED = ModelPlacement()
"""A model its runtime places (no plan, or a plan that skipped it)."""


@dataclass(frozen=True)
class Plan:
    mode: str
    usable: tuple[int, ...]
    ranked_by: str
    governor: Placement
    serving_loop: Placement
    models_cpus: Placement
    models: Mapping[str, ModelPlacement]
    note: str

    def doc(self) -> PlacementDoc:
        return {
            "mode": "off" if self.mode == "off" else "auto",
            "usable": cpulist.format_list(self.usable),
            "ranked_by": self.ranked_by,
            "governor": self.governor.doc(),
            "serving_loop": self.serving_loop.doc(),
            "models_cpus": self.models_cpus.doc(),
            "models": {name: placement.doc() for name, placement in self.models.items()},
            "note": self.note,
        }


@dataclass(frozen=True)
class Planner:
    """The plan for any configuration on this board: its topology and the CPUs mcpd may use,
    both read once at start (a reload places the new models on the same board)."""

    topology: CpuTopology
    available: frozenset[int]

    def __call__(self, config: Config) -> Plan:
        return make(config, self.topology, self.available)


SPARE_FROM = 5
"""Where the governor's core is also a fast one (every CPU alike), the models leave it to the
governor and serving's loop only when this many fast cores are there: leaving it costs the models
1/N of their cores, and sharing it a busy neighbour's toll (15 % of a core taken cost
onnxruntime 21 % of its throughput on two cores, BENCHMARKS "What another process's CPU costs
onnxruntime"); on a quiet 2-core machine leaving it gave 0.66x the requests/s of free placement
("Placement on two cores")."""


def make(config: Config, topology: CpuTopology, available: Iterable[int]) -> Plan:
    """The plan for `config` on `topology`; `available` is where this process may actually run
    (this machine's CPUs), against which each part is applied or skipped."""
    requests = [ModelRequest.of(model) for model in config.models]
    usable = frozenset(available)
    cpus = [cpu for cpu in topology.cpus if cpu.number in topology.usable]
    if config.daemon.placement == "off" or not cpus:
        why = (
            'placement is off ([daemon] placement = "off")'
            if config.daemon.placement == "off"
            else "no CPU topology under the sysfs root"
        )
        unplaced = {request.name: ModelPlacement(skipped=why) for request in requests}
        return Plan(config.daemon.placement, tuple(sorted(usable)), "nothing", Placement(),
                    Placement(), Placement(), unplaced,
                    f"{why}: the scheduler places every thread")  # fmt: skip
    ranked_by, performance = _rank(cpus)
    best, slowest = max(performance.values()), min(performance.values())
    fast = [cpu for cpu in cpus if performance[cpu.number] >= FAST_WITHIN * best]
    efficient = [cpu for cpu in cpus if performance[cpu.number] == slowest]
    governor = efficient[0]
    pool = _models_cores(fast, governor, SPARE_FROM)
    pool_cpus = {member for core in pool for member in _by_number(cpus)[core].siblings}
    loop = next(
        (cpu.number for cpu in efficient[1:] if cpu.number not in pool_cpus), governor.number
    )
    models = _share(requests, pool, _by_number(cpus))
    note = _note(ranked_by, governor.number, loop, pool, performance)
    return Plan(
        "auto",
        tuple(sorted(usable)),
        ranked_by,
        _checked(Placement((governor.number,)), usable),
        _checked(Placement((loop,)), usable),
        _checked(Placement(tuple(pool)), usable),
        {name: _checked_model(model, usable) for name, model in models.items()},
        note,
    )


def _rank(cpus: list[Cpu]) -> tuple[str, dict[int, float]]:
    capacities = {cpu.capacity for cpu in cpus}
    if None not in capacities and len(capacities) > 1:
        return "cpu_capacity", {cpu.number: float(cpu.capacity or 0) for cpu in cpus}
    if any(cpu.core_type is not None for cpu in cpus):
        return "core type", {cpu.number: 2.0 if cpu.core_type == "core" else 1.0 for cpu in cpus}
    clocks = {cpu.max_khz for cpu in cpus}
    if None not in clocks and len(clocks) > 1:
        return "max frequency", {cpu.number: float(cpu.max_khz or 0) for cpu in cpus}
    return "nothing", dict.fromkeys((cpu.number for cpu in cpus), 1.0)


def _by_number(cpus: list[Cpu]) -> dict[int, Cpu]:
    return {cpu.number: cpu for cpu in cpus}


def _models_cores(fast: list[Cpu], governor: Cpu, spare_from: int) -> list[int]:
    """The fast physical cores, each named by its first usable thread, on the NUMA node that has
    the most of them (the lowest on a tie); the governor's left out when at least `spare_from`
    fast cores are there."""
    first: dict[int, Cpu] = {}
    for cpu in fast:  # by number: a core's first usable thread comes first
        first.setdefault(cpu.core, cpu)
    if len(first) >= spare_from:  # where the governor's is not a fast core, nothing to leave
        first.pop(governor.core, None)
    counts: dict[int | None, int] = {}
    for cpu in first.values():
        counts[cpu.node] = counts.get(cpu.node, 0) + 1
    node = min(counts, key=lambda n: (-counts[n], -1 if n is None else n))
    return sorted(cpu.number for cpu in first.values() if cpu.node == node)


def _spread(cpus: Iterable[int], by_number: Mapping[int, Cpu]) -> list[int]:
    """CPUs in thread order: each core's first thread, then each core's second, and so on."""
    rank = {
        cpu: sorted(by_number[cpu].siblings).index(cpu) if cpu in by_number else 0 for cpu in cpus
    }
    return sorted(rank, key=lambda cpu: (rank[cpu], cpu))


def _threads(
    cpus: list[int], wanted: int, by_number: Mapping[int, Cpu], configured: bool = False
) -> ModelPlacement:
    """Thread i's CPU: one per physical core first; more threads than cores go on the cores'
    siblings, then around."""
    core_of = {cpu: by_number[cpu].core if cpu in by_number else cpu for cpu in cpus}
    order = _spread(cpus, by_number)
    threads = tuple(itertools.islice(itertools.cycle(order), wanted or len(set(core_of.values()))))
    kinds = {by_number[cpu].core_type if cpu in by_number else None for cpu in threads}
    used = [core_of[cpu] for cpu in set(threads)]
    core_type = kinds.pop() if len(kinds) == 1 else None
    return ModelPlacement(threads, configured, core_type, len(set(used)) < len(used))


def _share(
    requests: list[ModelRequest], pool: list[int], by_number: Mapping[int, Cpu]
) -> dict[str, ModelPlacement]:
    named = {cpu for request in requests if request.cpus for cpu in request.cpus}
    free = [core for core in pool if not named & by_number[core].siblings] or pool
    shared = [request for request in requests if request.cpus is None]
    slices: list[list[int]] = [free] * len(shared)
    if len(shared) <= len(free):
        size, odd = divmod(len(free), len(shared) or 1)
        bounds = list(itertools.accumulate(size + (i < odd) for i in range(len(shared))))
        slices = [free[end - size - (i < odd) : end] for i, end in enumerate(bounds)]
    placed: dict[str, ModelPlacement] = {}
    for request in requests:
        if request.cpus is not None:
            cpus = sorted(request.cpus)
            placed[request.name] = _threads(cpus, request.threads, by_number, configured=True)
        else:
            cores = slices[shared.index(request)]
            siblings = {m for core in cores for m in by_number[core].siblings}
            members = sorted(m for m in siblings if m in by_number)  # usable ones only
            placed[request.name] = _threads(members, request.threads or len(cores), by_number)
    return placed


def _missing(cpus: Iterable[int], usable: frozenset[int]) -> str | None:
    missing = set(cpus) - usable
    if not missing:
        return None
    return (
        f"CPUs {cpulist.format_list(missing)} are not this machine's to use "
        f"(it may use {cpulist.format_list(usable)})"
    )


def _checked(placement: Placement, usable: frozenset[int]) -> Placement:
    return Placement(placement.cpus, _missing(placement.cpus, usable))


def _checked_model(model: ModelPlacement, usable: frozenset[int]) -> ModelPlacement:
    return dataclasses.replace(model, skipped=_missing(model.thread_cpus, usable))


def _note(
    ranked_by: str, governor: int, loop: int, pool: list[int], performance: Mapping[int, float]
) -> str:
    where = f"the governor on CPU {governor}" + (
        f", serving's loop on CPU {loop}" if loop != governor else " with serving's loop"
    )
    models = f"models on {cpulist.format_list(pool)}, a thread per physical core"
    if len(performance) == 1:
        return f"one CPU: {where} and the models share CPU {governor}"
    if ranked_by == "nothing":
        return f"every CPU alike: {where}, {models}"
    return f"ranked by {ranked_by}: {models} (the fastest), {where} (the most efficient)"
