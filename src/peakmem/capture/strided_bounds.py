"""`as_strided` views of device tensors past their storage fail as torch fails them on a GPU.

`x.as_strided(size, stride, offset)` on a CUDA (or CPU) tensor checks that the view lies inside
x's storage ("setStorage: sizes [...] ... are out of bounds for storage of size N"), where the
meta kernel checks nothing: a job that reads past its storage (a view of 10^6 elements over 10)
ran on in the capture and got an estimate with exit 0, where on the GPU it raises. The in-place
`as_strided_` and `set_` keep torch's own behaviour (meta checks `as_strided_` as CUDA does;
`set_` onto a smaller storage is allowed on every device).
"""

from __future__ import annotations

import torch

AS_STRIDED = torch.ops.aten.as_strided.default


def check_in_bounds(view: torch.Tensor) -> None:
    """Raise torch's RuntimeError where the view `as_strided` made reaches past its storage."""
    sizes, strides = view.shape, view.stride()
    offset, itemsize = view.storage_offset(), view.element_size()
    if 0 in sizes:
        return  # no element: torch asks for no storage at all
    last = offset + sum((size - 1) * stride for size, stride in zip(sizes, strides, strict=True))
    needed = (last + 1) * itemsize
    have = view.untyped_storage().nbytes()
    if needed > have:
        raise RuntimeError(
            f"setStorage: sizes {list(sizes)}, strides {list(strides)}, storage offset {offset}, "
            f"and itemsize {itemsize} requiring a storage size of {needed} are out of bounds for "
            f"storage of size {have}")
