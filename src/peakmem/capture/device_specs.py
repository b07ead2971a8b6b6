"""What a device argument names, as the job wrote it: `"cuda"`, `"cuda:1"`, `torch.device("cuda")`
or a bare ordinal (`0`, `rank`) name a GPU; `"cpu"` / `torch.device("cpu")` the host; `"meta"` the
job's own meta device. One set of predicates for every part of the capture that reads them."""

from __future__ import annotations

from typing import Any

import torch


def _names(value: Any, device_type: str) -> bool:
    if isinstance(value, str):
        return value == device_type or value.startswith(device_type + ":")
    return isinstance(value, torch.device) and value.type == device_type


def is_cuda_spec(value: Any, *, ints: bool = True) -> bool:
    """A GPU: a cuda string or device, or (with `ints`) a bare ordinal."""
    if ints and isinstance(value, int) and not isinstance(value, bool):
        return True
    return _names(value, "cuda")


def is_host_spec(value: Any) -> bool:
    return _names(value, "cpu")


def is_meta_spec(value: Any) -> bool:
    return _names(value, "meta")
