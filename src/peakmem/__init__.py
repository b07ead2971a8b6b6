"""peakmem: predict the peak GPU memory of a PyTorch training job before it runs.

The data flows one way: job -> trace -> allocator simulation -> estimate.
"""

from peakmem.allocator.config import AllocatorConfig
from peakmem.allocator.simulate import SimulationResult, simulate
from peakmem.trace.events import EventKind, Trace
from peakmem.trace.vocab import Category, Phase

__version__ = "0.1.0"

__all__ = [
    "AllocatorConfig",
    "Category",
    "EventKind",
    "Phase",
    "SimulationResult",
    "Trace",
    "simulate",
    "__version__",
]
