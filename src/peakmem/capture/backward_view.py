"""The job's code that autograd calls back sees what the job sees everywhere else.

Every torch-function handler runs with the capture's mode popped, so Python code that autograd
calls from inside an op or a backward call would see meta tensors, unmapped "cuda" devices and no
CUDA function rules:
- during `backward()` / `autograd.grad()` (handled by the mode): tensor and module hooks, custom
  `autograd.Function.backward`, saved-tensor unpack hooks, and with them the recomputation of
  `torch.utils.checkpoint` (which then ran without the job's `torch.autocast("cuda")`);
- saved-tensor pack hooks, which run inside the op that saves (`torch.utils.checkpoint`'s
  metadata check, `save_on_cpu`).
Both run with the mode pushed again. The C++ engine itself calls no torch function, and the
recorder's dispatch reads true devices, so the capture's own bookkeeping is unchanged.

Every mode of the capture that the backward call passes through is pushed again, each by its own
handler (`job_view_in_backward`; `bare=True` for a mode whose own `__enter__`/`__exit__` set up
and close capture-wide state, as HostDeferral's do): the outer mode's patch runs first, so the
stack in backward is the one the job had (CudaAsMeta below HostDeferral). Without HostDeferral in
backward, a hook that moves a host-deferred tensor to the device (DeepSpeed ZeRO-3's
`offload_param` fetch: `param.ds_tensor.to("cuda")` of a CPU partition) got a host tensor back.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import torch.autograd
from torch.autograd.graph import saved_tensors_hooks
from torch.overrides import _get_current_function_mode_stack, _pop_mode, _push_mode

from peakmem.capture.library_patches import patched


def _on_stack(mode: Any) -> bool:
    """Whether `mode` is on the torch-function mode stack, itself or as a layer of the mode
    standing for both of the capture's (capture/capture_modes.py)."""
    return any(entry is mode or mode in getattr(entry, "layers", ())
               for entry in _get_current_function_mode_stack())


def pushed(mode: Any) -> Any:
    """A context with `mode` active (nothing to do when it already is)."""
    return nullcontext() if _on_stack(mode) else mode


@contextmanager
def pushed_bare(mode: Any) -> Iterator[None]:
    """`mode` pushed on the torch-function mode stack without calling its own `__enter__` /
    `__exit__` (nothing to do when it already is on it)."""
    if _on_stack(mode):
        yield
        return
    _push_mode(mode)
    try:
        yield
    finally:
        _pop_mode()


def _in_job_view(mode: Any, hook: Callable[..., Any]) -> Callable[..., Any]:
    def hook_in_job_view(*args: Any) -> Any:
        with pushed(mode):
            return hook(*args)

    return hook_in_job_view


@contextmanager
def job_view_in_backward(mode: Any, *, bare: bool = False) -> Iterator[None]:
    """While a backward call runs, the autograd engine runs with `mode` pushed (`bare`: without
    its own `__enter__` / `__exit__`)."""
    original = torch.autograd._engine_run_backward
    push = pushed_bare if bare else pushed

    def run_backward(*args: Any, **kwargs: Any) -> Any:
        with push(mode):
            return original(*args, **kwargs)

    with patched(torch.autograd, "_engine_run_backward", run_backward):
        yield


@contextmanager
def job_view_in_saved_tensor_hooks(mode: Any) -> Iterator[None]:
    """For the capture: saved-tensor hooks entered by the job run with `mode` pushed."""

    def enter(self: saved_tensors_hooks) -> None:
        torch._C._autograd._push_saved_tensors_default_hooks(
            _in_job_view(mode, self.pack_hook), _in_job_view(mode, self.unpack_hook)
        )

    with patched(saved_tensors_hooks, "__enter__", enter):
        yield
