"""The capture's one torch-function mode: the host deferral (capture/host_deferred.py) over the
device map (capture/device_map.py), one entry from torch's C++ dispatch per torch call.

The two were modes of their own, `HostDeferral` pushed on top of `CudaAsMeta`: every torch call
of the job crossed from torch's C++ dispatch into Python twice, and the deferral's hand-on
(`func(*args, **kwargs)`) went through torch's argument parsing and mode dispatch a second time.
`CaptureModes` is pushed instead of both and takes each call the way the pair took it:

- a call the deferral would hand on as it is (no handler of its own, or one that is idle while
  no argument is marked: `IDLE_WHEN_UNMARKED`, the host reads, `.cpu()`, `.cuda()`; no device
  named that it acts on; no host-deferred, job's meta or lazily computed tensor among the
  arguments) goes
  straight to the device map's turn: run at once where the device map has no branch, registry
  entry or device / pinned-memory argument for it (its own fast path), else
  `CudaAsMeta.__torch_function__` called directly. Both modes' handlers run with their mode
  popped: here both are off the stack, as they were when `CudaAsMeta`'s handler ran.
- every other call (`layered`) runs as before: `CudaAsMeta` pushed alone (without its
  `__enter__`), `HostDeferral.__torch_function__` called, whose torch calls reach the device
  map through torch's dispatch, then `CudaAsMeta` popped.

Code that pushes either mode alone (the job's view in backward and in saved-tensor hooks,
`device_view`'s `with mode:`) does so as before; `backward_view` treats either as on the stack
while this mode is (`layers`). The deferral's frame windows (is a module being built, is the
default collate or a Dataset fetch the caller) do not count this mode's frames
(`HANDING_ON_FRAMES`), so they reach as far up the job's stack as before."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from peakmem.capture import device_map as device_map_module
from peakmem.capture.arg_tensors import LEAF_TYPES, tensors_in
from peakmem.capture.device_map import CudaAsMeta
from peakmem.capture.device_specs import is_meta_spec
from peakmem.capture.host_deferred import (
    _NO_MODES,
    _PLAIN_TENSORS,
    HANDING_ON_FRAMES,
    IDLE_WHEN_UNMARKED,
    HostDeferral,
    deferral_patches,
)
from peakmem.capture.phases import PhaseTracker
from peakmem.capture.recorder_guard import recorder_missed, recorder_restored
from peakmem.capture.replaced_methods import canonical
from peakmem.capture.session import CaptureSession
from peakmem.capture.tensor_overrides import TENSOR_OVERRIDES
from peakmem.capture.unsupported import Unsupported
from peakmem.cuda_rules import FUNCTION_RULES

_push = torch._C._push_on_torch_function_stack
_pop = torch._C._pop_torch_function_stack
_stack_length = torch._C._len_torch_function_stack
_stack_at = torch._C._get_function_stack_at
_dispatch_length = torch._C._len_torch_dispatch_stack
_dispatch_at = torch._C._get_dispatch_stack_at
_excluded = torch._C._dispatch_tls_is_dispatch_key_excluded
_PYTHON_KEY = torch._C.DispatchKey.Python


MODES_REMOVED = (
    "jobs that take peakmem's torch function mode off torch's mode stack "
    "(torch._C._pop_torch_function_stack: the device tensors made after that would go unseen)")
"""What the job did, as `Unsupported` says it: `peakmem does not support ... yet` (exit 3)."""


class ModesRemoved(Unsupported):
    """The job removed the capture's mode: what it allocated after that was not recorded."""


class CaptureModes(TorchFunctionMode):
    """`HostDeferral` over `CudaAsMeta` as one mode on torch's stack."""

    def __init__(self, device_map: CudaAsMeta, deferral: HostDeferral) -> None:
        super().__init__()
        self.device_map = device_map
        self.deferral = deferral
        self.session = device_map.session
        self.layers = (device_map, deferral)
        """The modes this one stands for, inner first (as they were stacked)."""
        self._deferral_handlers = deferral.handled_functions()
        self._idle_when_unmarked = IDLE_WHEN_UNMARKED
        self._kinds = deferral.kinds
        self._device_map_branches = device_map_module._OWN_BRANCHES
        self.recorder: Any = None
        """The capture's allocation recorder once it is pushed (capture.recorder_guard)."""

    def __enter__(self) -> CaptureModes:
        self.device_map.open()
        self.deferral.open()
        return super().__enter__()

    def __exit__(self, *exc: Any) -> None:
        if not any(_stack_at(i) is self for i in range(_stack_length())):
            # the job popped it (`torch._C._pop_torch_function_stack()`): torch's own exit
            # would raise `trying to pop from empty mode stack` in place of the job's outcome
            self.deferral.close()
            self.device_map.close()
            raise ModesRemoved(MODES_REMOVED) from exc[1]
        super().__exit__(*exc)
        self.deferral.close()
        self.device_map.close()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        recorder = self.recorder
        if recorder is not None and (
            not (length := _dispatch_length()) or _dispatch_at(length - 1) is not recorder
            or _excluded(_PYTHON_KEY)
        ) and recorder_missed(recorder, self.session):
            # the job turned the dispatch modes off: its device work is recorded regardless
            with recorder_restored(recorder, self.session):
                return self.__torch_function__(func, types, args, kwargs)
        func = canonical(func)  # a Tensor method the job replaced: the original's call
        if func in self._deferral_handlers and func not in self._idle_when_unmarked:
            return self.layered(func, types, args, kwargs)
        if kwargs:
            device = kwargs.get("device")
            if device is not None and (self._kinds or is_meta_spec(device)):
                return self.layered(func, types, args, kwargs)  # the deferral's device branch
        if self._kinds and self._any_marked(args, kwargs):
            return self.layered(func, types, args, kwargs)
        # the deferral hands the call on as it is: the device map's turn
        if (func not in self._device_map_branches and func not in TENSOR_OVERRIDES
                and func not in FUNCTION_RULES):
            if not kwargs:
                return func(*args)
            if "device" not in kwargs and not kwargs.get("pin_memory"):
                return func(*args, **kwargs)
        return self.device_map.__torch_function__(func, types, args, kwargs or {})

    def _any_marked(self, args: tuple, kwargs: dict | None) -> bool:
        """`HostDeferral._any_marked` of the call's tensors (whether the deferral acts on
        it), one plain tensor argument (an attribute read, a unary method) answered inline."""
        if not kwargs and len(args) == 1 and type(args[0]) in _PLAIN_TENSORS:
            tensor = args[0]
            with _NO_MODES():
                if not tensor.is_meta or tensor.layout != torch.strided:
                    return False
                key = id(tensor.untyped_storage())
            return key in self._kinds or key in self.deferral.collated
        if not kwargs:  # positional arguments only (most calls): one flat pass, no list made
            kinds, collated = self._kinds, self.deferral.collated
            with _NO_MODES():
                for value in args:
                    kind = type(value)
                    if kind in _PLAIN_TENSORS:
                        if value.is_meta and value.layout == torch.strided:
                            key = id(value.untyped_storage())
                            if key in kinds or key in collated:
                                return True
                    elif kind not in LEAF_TYPES:  # a container, a subclass, another node
                        break
                else:
                    return False
            # (whether any tensor is marked does not depend on the order: the full walk again)
        tensors = tensors_in(args) if not kwargs else tensors_in((args, kwargs))
        return bool(tensors) and self.deferral._any_marked(tensors)

    def layered(self, func, types, args=(), kwargs=None):
        """The call as the two stacked modes took it: the deferral's handler with the device
        map the mode below it."""
        device_map = self.device_map
        _push(device_map)
        try:
            return self.deferral.__torch_function__(func, types, args, kwargs)
        finally:
            _remove(device_map)


HANDING_ON_FRAMES.update({CaptureModes.__torch_function__.__code__, CaptureModes.layered.__code__})


def _remove(mode: Any) -> None:
    """Pop `mode`, the top of the stack unless the call left a mode above it (a job's
    `torch.set_default_device` inside a handler: it stays)."""
    top = _stack_length() - 1
    if _stack_at(top) is mode:
        _pop()
        return
    above = []
    while _stack_length():
        popped = _pop()
        if popped is mode:
            break
        above.append(popped)
    for other in reversed(above):
        _push(other)


@contextmanager
def capture_modes(session: CaptureSession, phases: PhaseTracker) -> Iterator[CaptureModes]:
    """The capture's torch-function mode and the deferral's patches (weight loading, meta device
    contexts), for the job's run."""
    device_map = CudaAsMeta(session, phases)
    deferral = HostDeferral(session)
    with CaptureModes(device_map, deferral) as modes, deferral_patches(session, deferral):
        yield modes
