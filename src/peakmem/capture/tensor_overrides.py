"""Tensor attributes and functions whose answer the capture's torch-function mode replaces for the
job: a registry, filled by `device_view` (what device a tensor reports) and `module_apply` (moving
parameters between the host and the fake device in place).

While a torch-function mode is active, every tensor property getter (`.device`, `.is_cuda`, ...),
setter (`.data = ...`) and method reaches the mode's `__torch_function__` first; the capture looks
the called function up here. A handler runs with the mode popped (as every torch-function handler
does): inside it, tensors are what they really are (meta).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

Override = Callable[[Any, Any, tuple, dict], Any]
"""(mode, func, args, kwargs) -> result; `mode` is the capture's CudaAsMeta."""

TENSOR_OVERRIDES: dict[Any, Override] = {}


def register_override(funcs: Iterable[Any]) -> Callable[[Override], Override]:
    def decorator(handler: Override) -> Override:
        for func in funcs:
            if func in TENSOR_OVERRIDES:
                raise ValueError(f"{func} already has a tensor override")
            TENSOR_OVERRIDES[func] = handler
        return handler

    return decorator
