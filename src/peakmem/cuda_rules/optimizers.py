"""Optimizers pick their implementation by device: on CUDA `Adam`, `AdamW`, `SGD`, ... default to
the `foreach` kernels (whose temporaries differ from the per-tensor loop CPU uses), and
`fused=True` is accepted. The capture runs on meta tensors, so meta is declared a foreach/fused
device for the duration of the capture: the optimizers then choose exactly what they would on
CUDA, including the user's explicit `foreach=False`; the fused updates torch has no meta kernel
for get one here."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch.optim.optimizer as optimizer_module
import torch.optim.swa_utils as swa_module
import torch.utils._foreach_utils as foreach_utils

from peakmem.cuda_rules.registry import register_fused_kernel, register_runtime_patch

CAPTURE_DEVICE = "meta"
_MODULES = (foreach_utils, optimizer_module, swa_module)
_FUNCTIONS = ("_get_foreach_kernels_supported_devices", "_get_fused_kernels_supported_devices")


@register_runtime_patch("optimizers_cuda_defaults")
@contextmanager
def cuda_optimizer_defaults() -> Iterator[None]:
    saved = []
    for module in _MODULES:
        for name in _FUNCTIONS:
            original = getattr(module, name, None)
            if original is None:
                continue
            saved.append((module, name, original))

            def with_capture_device(original=original) -> list[str]:
                devices = list(original())
                if "cuda" in devices and CAPTURE_DEVICE not in devices:
                    devices.append(CAPTURE_DEVICE)
                return devices

            setattr(module, name, with_capture_device)
    try:
        yield
    finally:
        for module, name, original in reversed(saved):
            setattr(module, name, original)


@register_fused_kernel(["_fused_sgd_", "_fused_sgd_.tensor_lr", "_fused_adagrad_",
                        "_fused_adagrad_.tensor_lr"])
def fused_update_in_place(*args: object, **kwargs: object) -> None:
    """`SGD(fused=True)`, `Adagrad(fused=True)`: torch has no meta kernel for these (it has for
    `_fused_adam_` / `_fused_adamw_`). The CUDA kernels (FusedSgdKernel.cu,
    FusedAdagradKernel.cu) update the parameters and their state lists in place through
    multi_tensor_apply, whose tensor lists travel as kernel arguments: nothing is allocated on
    the device. Their state (momentum buffers, state sums, steps) is made beforehand by the
    optimizer's Python, outside the kernel."""
    return None
