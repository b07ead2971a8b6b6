"""bitsandbytes under the capture: what its CUDA library would do, modelled.

Its CUDA kernels cannot run here (no libcudart; capture/finetune_libs.py lets it import), but
every op it runs on device tensors is a registered torch custom op (`torch.ops.bitsandbytes.*`)
whose fake (meta) kernel gives the real output shapes and dtypes: quantize/dequantize 4-bit
(NF4/FP4: packed uint8 data, fp32 absmax per 64-value block), int8 matmuls, the 8-bit blockwise
optimizer updates (which write the state in place). So 8-bit Adam/AdamW/Lion/... states (uint8
state1/state2 + fp32 absmax per 256 values + two 256-entry fp32 code tables, as
`Optimizer8bit.init_state` makes them), `Params4bit` / `Linear4bit` (QLoRA) and `Linear8bitLt`
weights are counted at their real sizes by the recorder.

Paged optimizers (`PagedAdamW`, `PagedAdamW8bit`, `PagedLion8bit`, ...) put each state tensor
of more than 1e5 values in CUDA managed memory (`cudaMallocManaged`, `functional.get_paged`):
outside the caching allocator, resident on the GPU until the device runs out of memory (then
paged to the host). Here `get_paged` returns an ordinary device tensor of that shape: the state
is counted as device memory (an upper bound: under memory pressure the driver would page it
out instead of failing), and the notes say so. `fill` / `_mul` on such tensors run as the
torch ops they are; prefetches are no-ops (one device, no host copy).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from math import prod
from typing import Any

import torch

from peakmem.capture.library_patches import register_library_patch
from peakmem.capture.on_import import patch_on_import
from peakmem.capture.running_session import session_on_mode_stack
from peakmem.capture.unsupported import Unsupported

PAGED_NOTE = (
    "bitsandbytes paged optimizer state (CUDA managed memory, outside the caching allocator) "
    "counted as device memory: it stays on the GPU unless the device runs out of memory, when "
    "the driver pages it to the host instead of failing"
)


def current_session() -> Any:
    """The running capture's session: the one the device-mapping torch-function mode holds."""
    return session_on_mode_stack()


def _note_paged() -> None:
    session = current_session()
    if session is not None and PAGED_NOTE not in session.notes:
        session.notes.append(PAGED_NOTE)


def _apply(functional: Any) -> Any:
    originals = {name: getattr(functional, name, None) for name in ("get_paged", "prefetch_tensor", "fill", "_mul")}

    def get_paged(*shape: int, dtype: torch.dtype = torch.float32, device: Any = None) -> torch.Tensor:
        _note_paged()
        out = torch.empty(prod(shape), dtype=dtype, device="cuda").view(shape)
        out.is_paged = False  # an ordinary device tensor here: nothing to prefetch or sync
        out.page_deviceid = 0
        return out

    def prefetch_tensor(tensor: torch.Tensor, to_cpu: bool = False) -> None:
        return None

    def fill(tensor: torch.Tensor, value: Any, device: Any = None, prefetch: bool = True) -> None:
        tensor.fill_(value)

    def mul(a: torch.Tensor, b: torch.Tensor, device: Any = None) -> None:
        a.mul_(b)

    replacements = {"get_paged": get_paged, "prefetch_tensor": prefetch_tensor, "fill": fill, "_mul": mul}
    for name, value in replacements.items():
        if originals[name] is not None:
            setattr(functional, name, value)

    def undo() -> None:
        for name, original in originals.items():
            if original is not None:
                setattr(functional, name, original)

    return undo


class NativeKernelUnsupported(Unsupported, RuntimeError):
    """Unsupported, and a RuntimeError as bitsandbytes' own stand-in raises: its probes that
    catch that (`has_avx512bf16`) still answer no."""


def _native_unsupported(cextension: Any) -> Any:
    """bitsandbytes' stand-in for its native library (it cannot load without libcudart) raises
    its CUDA-setup error when a kernel is called; a kernel called directly (not through a torch
    op with a fake kernel: `percentile_clipping`, ...) is not modelled: `Unsupported` instead."""
    mock = getattr(cextension, "ErrorHandlerMockBNBNativeLibrary", None)
    if mock is None:
        return lambda: None
    original = mock.__dict__.get("__getattr__")

    def getattr_(self: Any, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)

        def unsupported(*args: Any, **kwargs: Any) -> Any:
            raise NativeKernelUnsupported(f"bitsandbytes' native CUDA function {name} (called directly)")

        return unsupported

    mock.__getattr__ = getattr_

    def undo() -> None:
        if original is not None:
            mock.__getattr__ = original

    return undo


@register_library_patch("bitsandbytes_paged_memory")
@contextmanager
def bitsandbytes_paged_memory() -> Iterator[None]:
    with (
        patch_on_import("bitsandbytes.cextension", _native_unsupported),
        patch_on_import("bitsandbytes.functional", _apply),
    ):
        yield
