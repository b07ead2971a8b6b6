"""A faithful simulation of PyTorch's CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp)."""

from peakmem.allocator.caching import CachingAllocator, DeviceLimits, OutOfMemory
from peakmem.allocator.config import AllocatorConfig, AllocatorConfigError
from peakmem.allocator.rules import AllocatorRules
from peakmem.allocator.simulate import SimulationResult, Timeline, TraceError, simulate

__all__ = [
    "AllocatorConfig",
    "AllocatorConfigError",
    "AllocatorRules",
    "CachingAllocator",
    "DeviceLimits",
    "OutOfMemory",
    "SimulationResult",
    "Timeline",
    "TraceError",
    "simulate",
]
