"""The byte size of a new device storage as CUDA's allocator would be asked for it.

A capture makes device tensors on the meta device, and some of the ways it makes them
(`torch.empty_strided` on meta, the fast layouts built on it) do not check the storage size
for overflow as CUDA's `empty` / `empty_strided` do (`computeStorageNbytes`): the storage of
`torch.empty(2**62, device="cuda")` (2^64 bytes of float32) came out as 0 bytes, 2^61 floats as
-2^63, and the job went on with nothing recorded: a silently wrong estimate. On CUDA the call
raises `RuntimeError: Storage size calculation overflowed ...` (any size over 2^63 - 1 bytes);
:func:`check_storage_size` raises the same in the job. A size that fits but exceeds the GPU
(`torch.empty(2**62, dtype=torch.uint8, device="cuda")`) is recorded as it is: an OOM answer.
"""

from __future__ import annotations

import torch

STORAGE_MAX = (1 << 63) - 1
"""The largest storage in bytes `computeStorageNbytes` accepts (int64's maximum)."""


def span_bytes(tensor: torch.Tensor) -> int:
    """The bytes from the storage's start to the tensor's last element (exact, in Python ints)."""
    shape = tensor.shape
    if 0 in shape:
        return 0
    last = tensor.storage_offset()
    for size, stride in zip(shape, tensor.stride(), strict=True):
        last += (size - 1) * stride
    return (last + 1) * tensor.element_size()


def check_storage_size(tensor: torch.Tensor, nbytes: int) -> None:
    """Raise CUDA's overflow error where `tensor` (a strided device tensor whose storage holds
    `nbytes`) spans more than a storage can hold. Cheap in the common case: only a tensor whose
    elements outnumber its storage's bytes (an overflowed size, or an expanded view) is
    measured exactly."""
    numel = tensor.numel()
    if numel == 0 or numel * tensor.element_size() <= nbytes:
        return
    if span_bytes(tensor) > STORAGE_MAX:
        raise RuntimeError(
            f"Storage size calculation overflowed with sizes={list(tensor.shape)} and "
            f"strides={list(tensor.stride())}")
