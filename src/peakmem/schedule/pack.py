"""Place jobs on GPUs (and MIG slices) by their estimated peak memory with its margin.

One placement core (`assign`) serves `peakmem pack` and the bench's collocation simulation
(`peakmem.bench.collocation`), so what the bench reports is what `pack` does.

Policies (`POLICIES`, by `--policy` name):
- first-fit: jobs in the order given; each goes to the first bin (inventory order) with room.
- best-fit-decreasing: largest job first; each goes to the bin already in use that it leaves
  the least room in; when none has room, to the unused bin it leaves the least room in (so a
  small job opens a small GPU, and GPUs in use fill up before new ones are opened).
- utilization-aware: best-fit-decreasing, and the sum of the jobs' predicted SM activity
  (`utilization.smact` of each estimate, 0..1) on a bin stays at or under `max_smact` (1.0:
  no more than one GPU's worth of compute); a MIG slice offers its fraction of the SMs.

A bin holds a set of jobs when the sum of their `peak_bytes_with_margin` is at most its
capacity: every process holds its own CUDA context, which each estimate's peak includes, and
all jobs are assumed to peak at once (the worst case of overlapping peaks).

OOM risk: each estimate's margin is calibrated so that at most `MARGIN_FAILURE_RATE` (1%) of
the calibration split's jobs of its kind peaked above the estimate with margin (stack profiles'
`safety_margin`). Taking that as each job's chance of outgrowing its reservation, independently,
a bin OOMs with probability at most 1 - prod(1 - rate) over its jobs (one job over its share
need not exhaust the GPU, so this is an upper bound). A job whose estimate carries no fitted
margin (`safety_margin` 0) has an unknown rate, and so has its bin.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from peakmem.schedule.inventory import Bin

MARGIN_FAILURE_RATE = 0.01
"""The share of calibration jobs a fitted margin leaves underestimated (StackProfile
`safety_margin`: "<= 1% of a calibration split's jobs are underestimated")."""

DEFAULT_MAX_SMACT = 1.0


class PackError(ValueError):
    """A packing request peakmem cannot serve; `exit_code` follows the contract."""

    def __init__(self, message: str, exit_code: int = 2):
        super().__init__(message)
        self.exit_code = exit_code


@dataclass(frozen=True)
class PackJob:
    name: str
    bytes_with_margin: int
    peak_bytes: int = 0
    safety_margin: float = 0.0
    gpu: str | None = None
    """The GPU profile the estimate was made for."""
    smact: float | None = None
    """Predicted SM activity, 0..1 (`utilization.smact` of the estimate), when known."""
    failure_rate: float | None = None
    """Chance the job's real peak exceeds `bytes_with_margin` (None: unknown)."""
    estimate: dict[str, Any] | None = field(default=None, compare=False, repr=False)
    margin_assumed: bool = False
    """The estimate's margin was carried over from another GPU / stack (its assumptions say so):
    its failure rate is the calibration target, not measured for this GPU."""


@dataclass(frozen=True)
class Policy:
    decreasing: bool
    """Place the largest jobs first."""
    best_fit: bool
    """Pick the bin the job leaves the least room in (else the first with room)."""
    needs_smact: bool = False
    description: str = ""


POLICIES: dict[str, Policy] = {
    "first-fit": Policy(False, False, description="jobs in order, each to the first bin with room"),
    "best-fit-decreasing": Policy(
        True, True, description="largest first, each to the fullest bin it fits"
    ),
    "utilization-aware": Policy(
        True, True, needs_smact=True,
        description="best-fit-decreasing, keeping each bin's summed SM activity under a threshold",
    ),
}


def check_policy(name: str) -> Policy:
    policy = POLICIES.get(name)
    if policy is None:
        raise PackError(f"unknown policy {name!r}; choose one of {', '.join(POLICIES)}")
    return policy


def assign(
    sizes: Sequence[int],
    capacities: Sequence[int],
    policy: str | Policy = "first-fit",
    *,
    loads: Sequence[float] | None = None,
    load_capacities: Sequence[float] | None = None,
) -> list[int | None]:
    """For each job (its size), the index of the bin it goes to, or None where no bin has room.

    `loads` / `load_capacities`: a second dimension (SM activity) that must also fit."""
    rule = check_policy(policy) if isinstance(policy, str) else policy
    order = sorted(range(len(sizes)), key=lambda j: -sizes[j]) if rule.decreasing else range(len(sizes))
    free = [int(c) for c in capacities]
    load_free = list(load_capacities) if load_capacities is not None else None
    used: list[int] = []  # bins in use, in index order
    unused_by_index = list(range(len(capacities)))  # unused bins in index order
    unused_by_room = sorted((free[b], b) for b in range(len(capacities)))  # (room, bin)
    placed: list[int | None] = [None] * len(sizes)
    used_set: set[int] = set()

    def fits(b: int, j: int) -> bool:
        if free[b] < sizes[j]:
            return False
        return load_free is None or loads is None or load_free[b] + 1e-9 >= loads[j]

    # memory alone decides (no second dimension): the bin is found in O(log bins), not by
    # looking at every bin in use (100k jobs on --what-if's as many bins: hours)
    by_memory_only = load_free is None or loads is None
    first_with_room = _FirstWithRoom(free) if by_memory_only and not rule.best_fit else None
    used_by_room: list[tuple[int, int]] = []  # (free, bin) of the bins in use, sorted

    for j in order:
        size = sizes[j]
        choice: int | None = None
        if first_with_room is not None:
            choice = first_with_room.find(size)
        elif rule.best_fit and by_memory_only:
            k = bisect.bisect_left(used_by_room, (size, -1))
            if k < len(used_by_room):
                choice = used_by_room[k][1]
        elif rule.best_fit:
            fitting_used = [b for b in used if fits(b, j)]
            if fitting_used:
                choice = min(fitting_used, key=lambda b: (free[b] - size, b))
        else:
            choice = next((b for b in used if fits(b, j)), None)
        if first_with_room is not None:
            pass
        elif rule.best_fit and choice is None:
            start = bisect.bisect_left(unused_by_room, (size, -1))
            for k in range(start, len(unused_by_room)):
                if fits(unused_by_room[k][1], j):
                    choice = unused_by_room[k][1]
                    break
        elif not rule.best_fit:
            first_unused = next((b for b in unused_by_index if fits(b, j)), None)
            if first_unused is not None and (choice is None or first_unused < choice):
                choice = first_unused
        if choice is None:
            continue
        if first_with_room is not None:
            pass
        elif choice not in used_set:
            used_set.add(choice)
            bisect.insort(used, choice)
            del unused_by_index[bisect.bisect_left(unused_by_index, choice)]
            del unused_by_room[bisect.bisect_left(unused_by_room, (free[choice], choice))]
        elif rule.best_fit and by_memory_only:
            used_by_room.pop(bisect.bisect_left(used_by_room, (free[choice], choice)))
        free[choice] -= size
        if first_with_room is not None:
            first_with_room.update(choice, free[choice])
        elif rule.best_fit and by_memory_only:
            bisect.insort(used_by_room, (free[choice], choice))
        if load_free is not None and loads is not None:
            load_free[choice] -= loads[j]
        placed[j] = choice
    return placed


class _FirstWithRoom:
    """The first bin (lowest index) with at least some room, in O(log bins): a tree of the
    largest room over ranges of bins."""

    def __init__(self, rooms: Sequence[int]) -> None:
        self.size = 1
        while self.size < max(len(rooms), 1):
            self.size *= 2
        self.tree = [-1] * (2 * self.size)
        self.tree[self.size:self.size + len(rooms)] = rooms
        for node in range(self.size - 1, 0, -1):
            self.tree[node] = max(self.tree[2 * node], self.tree[2 * node + 1])

    def find(self, room: int) -> int | None:
        if self.tree[1] < room:
            return None
        node = 1
        while node < self.size:
            node = 2 * node if self.tree[2 * node] >= room else 2 * node + 1
        return node - self.size

    def update(self, index: int, room: int) -> None:
        node = index + self.size
        self.tree[node] = room
        while node > 1:
            node //= 2
            self.tree[node] = max(self.tree[2 * node], self.tree[2 * node + 1])


@dataclass
class BinLoad:
    index: int
    bin: Bin
    jobs: list[PackJob]

    @property
    def bytes_with_margin(self) -> int:
        return sum(job.bytes_with_margin for job in self.jobs)

    @property
    def smact(self) -> float | None:
        values = [job.smact for job in self.jobs]
        return None if any(v is None for v in values) else float(sum(values))  # type: ignore[arg-type]

    @property
    def oom_risk(self) -> float | None:
        return combined_risk(job.failure_rate for job in self.jobs)

    def to_json(self) -> dict[str, Any]:
        risk = self.oom_risk
        return {
            "gpu": self.bin.gpu,
            "index": self.index,
            "jobs": [job.name for job in self.jobs],
            "bytes_with_margin": self.bytes_with_margin,
            "capacity_bytes": self.bin.capacity_bytes,
            "mig": self.bin.mig,
            "device": self.bin.device,
            "free_bytes": self.bin.capacity_bytes - self.bytes_with_margin,
            "smact": None if self.smact is None else round(self.smact, 4),
            "oom_risk": None if risk is None else round(risk, 6),
        }


def combined_risk(rates: Any) -> float | None:
    """1 - prod(1 - rate); None where any rate is unknown."""
    survive = 1.0
    for rate in rates:
        if rate is None:
            return None
        survive *= 1.0 - float(rate)
    return 1.0 - survive


@dataclass
class Placement:
    policy: str
    bins: list[BinLoad]
    """The bins that got jobs, in inventory order."""
    rejected: list[tuple[PackJob, str]]
    inventory: int
    """How many bins (GPUs and slices) the inventory had."""
    notes: list[str] = field(default_factory=list)

    @property
    def expected_oom_bins(self) -> float | None:
        risks = [b.oom_risk for b in self.bins]
        return None if any(r is None for r in risks) else float(sum(risks))  # type: ignore[arg-type]

    @property
    def oom_risk_any(self) -> float | None:
        return combined_risk(b.oom_risk for b in self.bins)

    def to_json(self) -> dict[str, Any]:
        expected, any_risk = self.expected_oom_bins, self.oom_risk_any
        return {
            "gpus": [b.to_json() for b in self.bins],
            "rejected": [{"job": job.name, "why": why} for job, why in self.rejected],
            "policy": self.policy,
            "gpus_used": len(self.bins),
            "inventory": self.inventory,
            "expected_oom_gpus": None if expected is None else round(expected, 6),
            "oom_risk_any": None if any_risk is None else round(any_risk, 6),
            "notes": list(self.notes),
        }


def _slice_load(bin_: Bin, max_smact: float) -> float:
    """The SM activity a bin can take: a MIG slice has its share of the SMs."""
    if bin_.mig is None:
        return max_smact
    from peakmem.schedule.mig import load_mig

    return max_smact * load_mig(bin_.gpu, bin_.mig).compute_sevenths / 7


def pack(
    jobs: Sequence[PackJob],
    bins: Sequence[Bin],
    policy: str = "first-fit",
    *,
    max_smact: float = DEFAULT_MAX_SMACT,
) -> Placement:
    """Place `jobs` on `bins` by `policy`; see the module docstring."""
    rule = check_policy(policy)
    if rule.needs_smact:
        lacking = [job.name for job in jobs if job.smact is None]
        if lacking:
            shown = ", ".join(lacking[:5]) + (f" and {len(lacking) - 5} more" if len(lacking) > 5 else "")
            raise PackError(
                "peakmem does not support the utilization-aware policy for estimates without a "
                f"predicted SM activity (`utilization.smact`) yet: {shown} lack(s) it; use "
                "first-fit or best-fit-decreasing",
                exit_code=3,
            )
    if not (max_smact > 0):
        raise PackError(f"--max-smact must be positive, got {max_smact}")
    sizes = [job.bytes_with_margin for job in jobs]
    capacities = [b.capacity_bytes for b in bins]
    loads = load_caps = None
    if rule.needs_smact:
        loads = [float(job.smact or 0.0) for job in jobs]
        load_caps = [_slice_load(b, max_smact) for b in bins]
    where = assign(sizes, capacities, rule, loads=loads, load_capacities=load_caps)
    members: dict[int, list[PackJob]] = {}
    rejected: list[tuple[PackJob, str]] = []
    largest = max(capacities, default=0)
    for job, b in zip(jobs, where, strict=True):
        if b is not None:
            members.setdefault(b, []).append(job)
        else:
            rejected.append((job, _why(job, bins, largest, loads is not None, max_smact)))
    placed = [BinLoad(i, bins[i], members[i]) for i in sorted(members)]
    notes = _notes(jobs, placed)
    return Placement(policy, placed, rejected, len(bins), notes)


def _why(job: PackJob, bins: Sequence[Bin], largest: int, smact: bool, max_smact: float) -> str:
    need = _gib(job.bytes_with_margin)
    if not bins:
        return "the inventory is empty"
    if job.bytes_with_margin > largest:
        return (
            f"needs {need} with its margin; the largest GPU or slice of the inventory holds "
            f"{_gib(largest)}"
        )
    if smact and job.smact is not None and job.smact > max_smact:
        return f"its predicted SM activity {job.smact:.2f} is over the limit {max_smact:.2f}"
    extra = f" and SM activity {job.smact:.2f} under {max_smact:.2f}" if smact else ""
    return f"no GPU or slice left with {need} free{extra} (the inventory is full)"


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


def _notes(jobs: Sequence[PackJob], placed: list[BinLoad]) -> list[str]:
    notes = [
        "every job on a GPU is assumed to reach its peak at the same time (the worst case); "
        "each job's own CUDA context is counted in its estimate"
    ]
    unknown = [job.name for job in jobs if job.failure_rate is None]
    if unknown:
        notes.append(
            f"{len(unknown)} job(s) carry no calibrated safety margin ({', '.join(unknown[:3])}"
            f"{', ...' if len(unknown) > 3 else ''}): the OOM risk of their GPUs is unknown"
        )
    carried = [job.name for job in jobs if job.margin_assumed]
    if carried:
        notes.append(
            f"{len(carried)} job(s) use a safety margin carried over from another GPU or stack "
            f"({', '.join(carried[:3])}{', ...' if len(carried) > 3 else ''}): their 1% failure "
            "rate is the calibration's target, not measured for their GPU"
        )
    moved = sorted(
        {
            (job.gpu, b.bin.gpu)
            for b in placed
            for job in b.jobs
            if job.gpu is not None and job.gpu != b.bin.gpu
        }
    )
    if moved:
        pairs = ", ".join(f"{a} -> {b}" for a, b in moved[:4])
        notes.append(
            f"some jobs were estimated for another GPU than the one they were placed on ({pairs}): "
            "their peaks are taken as they are (the CUDA context and library sizes differ a little "
            "between GPUs; estimate on the target GPU for exact figures)"
        )
    return notes


@dataclass
class WhatIf:
    gpu: str
    capacity_bytes: int
    count: int | None
    """GPUs of this type needed for all jobs (None: some job fits on none)."""
    rejected: list[tuple[PackJob, str]]

    def to_json(self) -> dict[str, Any]:
        return {
            "gpu": self.gpu,
            "capacity_bytes": self.capacity_bytes,
            "count": self.count,
            "fits_all": self.count is not None,
            "rejected": [{"job": job.name, "why": why} for job, why in self.rejected],
        }


def what_if(
    jobs: Sequence[PackJob],
    gpu_names: Sequence[str],
    policy: str = "best-fit-decreasing",
    *,
    max_smact: float = DEFAULT_MAX_SMACT,
) -> list[WhatIf]:
    """For each single GPU type: how many of it hold all of `jobs` (as many as needed), best
    first (every job placed, fewest GPUs, then least memory in all)."""
    from peakmem.profiles import load_gpu

    answers = []
    for name in dict.fromkeys(gpu_names):
        gpu = load_gpu(name)
        bins = [Bin(gpu.name, d, gpu.total_memory_bytes) for d in range(max(len(jobs), 1))]
        placement = pack(jobs, bins, policy, max_smact=max_smact)
        count = None if placement.rejected else len(placement.bins)
        answers.append(WhatIf(gpu.name, gpu.total_memory_bytes, count, placement.rejected))
    return sorted(
        answers,
        key=lambda w: (
            w.count is None,
            len(w.rejected),
            (w.count or 0) * w.capacity_bytes,
            w.count or 0,
            w.gpu,
        ),
    )

