"""MIG slices as data: which profiles each GPU offers, and the memory a job may use in one.

The table is `data/mig_profiles.toml` (NVIDIA's MIG User Guide, cited there)."""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from functools import cache
from importlib import resources

from peakmem.profiles import GpuProfile, load_gpu

_NAME = re.compile(r"^(\d+)g\.(\d+)gb$")


class MigError(ValueError):
    """An unknown MIG profile, or one the GPU does not offer."""


@dataclass(frozen=True)
class MigProfile:
    gpu: str
    """The GPU profile name it is a slice of (e.g. "a100-40gb")."""
    name: str
    """NVIDIA's profile name (e.g. "3g.20gb")."""
    memory_eighths: int
    compute_sevenths: int
    max_instances: int
    capacity_bytes: int
    """Memory a job may use in the slice (see the data file's header)."""


@cache
def _table() -> dict[str, dict]:
    text = resources.files("peakmem.schedule").joinpath("data", "mig_profiles.toml").read_text(
        encoding="utf-8"
    )
    return tomllib.loads(text)


def _capacity(gpu: GpuProfile, name: str, eighths: int) -> int:
    match = _NAME.match(name)
    named = int(match.group(2)) * 10**9 if match else gpu.total_memory_bytes
    return min(named, gpu.total_memory_bytes * eighths // 8)


def mig_profiles(gpu: str | GpuProfile) -> list[MigProfile]:
    """The MIG profiles of `gpu`, smallest memory first ([] for a GPU without MIG)."""
    profile = gpu if isinstance(gpu, GpuProfile) else load_gpu(gpu)
    entry = _table().get(profile.name)
    if entry is None:
        return []
    found = [
        MigProfile(
            gpu=profile.name,
            name=row["name"],
            memory_eighths=int(row["memory_eighths"]),
            compute_sevenths=int(row["compute_sevenths"]),
            max_instances=int(row["max_instances"]),
            capacity_bytes=_capacity(profile, row["name"], int(row["memory_eighths"])),
        )
        for row in entry["profiles"]
    ]
    return sorted(found, key=lambda m: (m.capacity_bytes, m.compute_sevenths))


def mig_gpus() -> list[str]:
    """GPU profile names that offer MIG slices."""
    return sorted(_table())


def load_mig(gpu: str | GpuProfile, name: str) -> MigProfile:
    """The MIG profile `name` of `gpu`; MigError naming the ones it offers otherwise."""
    profile = gpu if isinstance(gpu, GpuProfile) else load_gpu(gpu)
    offered = mig_profiles(profile)
    wanted = name.strip().lower().removeprefix("mig-")
    for mig in offered:
        if mig.name == wanted:
            return mig
    if not offered:
        raise MigError(
            f"{profile.name} has no MIG profiles (peakmem knows MIG on {', '.join(mig_gpus())})"
        )
    raise MigError(
        f"{profile.name} has no MIG profile {name!r}; it offers "
        + ", ".join(m.name for m in offered)
    )


def smallest_fitting(gpu: str | GpuProfile, bytes_needed: int) -> MigProfile | None:
    """The smallest MIG profile of `gpu` whose memory holds `bytes_needed` (None: none does)."""
    for mig in mig_profiles(gpu):
        if mig.capacity_bytes >= bytes_needed:
            return mig
    return None
