"""`pickle.dumps` of fake device tensors, as `pickle` and `copy.copyreg` users call it.

A device tensor reports `cuda:0` to the job (device_view), so `Tensor._reduce_ex_internal`
takes the CUDA path: it pickles the tensor's storage, whose `__reduce__` writes it with the
legacy `torch.save` (torch/storage.py). The storage is meta: `_write_file` cannot copy its bytes,
and the `NotImplementedError` ("Cannot copy out of meta tensor") reaches the job. On a GPU the
pickle succeeds. Lightning, for one, pickles every hyperparameter to drop the unpicklable ones
(`clean_namespace` -> `is_picklable`, which catches RuntimeError): a module passed to a
LightningModule's `__init__` and kept by `save_hyperparameters()` (lightning-hydra-template's
`net`) was dropped from the hyperparameters, and the failed copy made auto mode rerun the whole
job in eager mode.

During a capture a meta tensor pickles as torch pickles a meta tensor (dtype, size, stride,
requires_grad; `_rebuild_meta_tensor_no_storage`), with what it stands for: unpickled inside
the capture it is a new tensor of that geometry on the fake device for device memory (an
allocation, as `torch.load` of the bytes makes on a GPU), on the host for host memory, on meta
for the job's own meta tensors. `torch.save` is left as it was (meta tensors in the file, which
`torch.load(weights_only=True)` reads back). Views do not share a storage after the round trip (torch's own
meta pickling does the same).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from peakmem.capture.library_patches import patched, register_library_patch

_DEVICE_OF_KIND = {"device": "cuda", "host": "cpu", "meta": "meta"}


def _kind(tensor: torch.Tensor) -> str | None:
    """What a meta tensor stands for, from the session of the capture's torch-function mode
    (None for a tensor that is not meta, or outside a capture)."""
    from torch.overrides import _get_current_function_mode_stack

    from peakmem.capture.session import CaptureSession

    with torch._C.DisableTorchFunction():
        if type(tensor) not in (torch.Tensor, torch.nn.Parameter) or not tensor.is_meta:
            return None
    for mode in reversed(_get_current_function_mode_stack()):
        session = getattr(mode, "session", None)
        if isinstance(session, CaptureSession):
            with torch._C.DisableTorchFunction():
                return session.storage_kind(tensor)
    return None


def rebuild_fake_tensor(kind: str, dtype: torch.dtype, size: tuple, stride: tuple,
                        requires_grad: bool) -> torch.Tensor:
    """The unpickled tensor: new memory of this geometry where the original's stood."""
    return torch.empty_strided(size, stride, dtype=dtype, device=_DEVICE_OF_KIND.get(kind, "meta"),
                               requires_grad=requires_grad)


@register_library_patch("meta_tensors_pickle")
@contextmanager
def meta_tensors_pickle() -> Iterator[None]:
    """`Tensor._reduce_ex_internal` for the capture's meta tensors: geometry and kind instead
    of the storage's bytes."""
    original = torch.Tensor._reduce_ex_internal

    def reduce_ex_internal(self: Any, proto: int) -> Any:
        # torch.save runs with torch functions off (library_patches' torch_save_device_tensors)
        # and writes meta tensors as torch does; only the job's own pickling is answered here
        kind = _kind(self) if torch._C._is_torch_function_enabled() else None
        if kind is None:
            return original(self, proto)
        with torch._C.DisableTorchFunction():
            geometry = (self.dtype, tuple(self.size()), self.stride(), self.requires_grad)
        return rebuild_fake_tensor, (kind, *geometry)

    with patched(torch.Tensor, "_reduce_ex_internal", reduce_ex_internal):
        yield
