"""GPU and software-stack facts, kept as data files with a source for every number."""

from peakmem.profiles.loader import (
    GpuProfile,
    ProfileError,
    Sourced,
    StackProfile,
    known_gpus,
    load_gpu,
    load_stack,
)

__all__ = [
    "GpuProfile",
    "ProfileError",
    "Sourced",
    "StackProfile",
    "known_gpus",
    "load_gpu",
    "load_stack",
]
