"""`peakmem.estimate(fn, *args, gpu=...)`: the peak GPU memory of a job, estimated on the CPU.

The package itself is callable, so `peakmem.estimate(...)` works whether `peakmem.estimate` names
this package or the function."""

from __future__ import annotations

import sys
import types
from typing import Any

from peakmem.estimate.api import (
    DEFAULT_GPU,
    Estimate,
    EstimateError,
    estimate,
    estimate_capture,
    estimate_command,
)

__all__ = [
    "DEFAULT_GPU",
    "Estimate",
    "EstimateError",
    "estimate",
    "estimate_capture",
    "estimate_command",
]


class _CallableModule(types.ModuleType):
    def __call__(self, *args: Any, **kwargs: Any) -> Estimate:
        return estimate(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
