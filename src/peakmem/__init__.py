"""peakmem: predict the peak GPU memory of a PyTorch training job before it runs.

The data flows one way: job -> trace -> allocator simulation -> estimate.
"""

from peakmem import startup_modules  # noqa: F401 - first: what python had loaded before peakmem
from peakmem.allocator.config import AllocatorConfig
from peakmem.allocator.simulate import SimulationResult, simulate
from peakmem.trace.events import EventKind, Trace
from peakmem.trace.vocab import Category, Phase

__version__ = "0.1.0"

_LAZY = {"estimate", "estimate_command", "Estimate", "EstimateError"}  # import torch only when asked for


def __getattr__(name: str) -> object:
    if name in _LAZY:
        from peakmem.estimate import api

        return getattr(api, name)
    raise AttributeError(f"module 'peakmem' has no attribute {name!r}")


__all__ = [
    "AllocatorConfig",
    "Category",
    "Estimate",
    "EstimateError",
    "EventKind",
    "Phase",
    "SimulationResult",
    "Trace",
    "estimate",
    "estimate_command",
    "simulate",
    "__version__",
]
