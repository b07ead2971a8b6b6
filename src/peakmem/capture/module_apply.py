"""Moving parameters between the host and the fake device in place, as CUDA does.

On CUDA, `nn.Module._apply` (`.to("cuda")`, `.cuda()`, `.cpu()`, `.half()`, ...) keeps each
Parameter object: a CPU and a CUDA tensor have "compatible shallow-copy types", so it sets
`param.data = moved` (and `param.grad.data = moved_grad`). A CPU and a meta tensor do not, so on
the fake device `_apply` would make a NEW Parameter per module: weights tied between two modules
(`lm_head.weight = wte.weight`) would become two copies, and optimizers built before the move
would hold the old host parameters.

Here, while the capture runs:
- `torch._has_compatible_shallow_copy_type(host, device_tensor)` answers True (both ways), as it
  does for CPU and CUDA, when the host tensor can be swapped (no other C++ owner);
- `tensor.data = other` across host and fake device swaps the tensor's implementation with
  `other`'s (`torch._C._swap_tensor_impl`), keeping the Python object, its attributes, its
  `requires_grad` and its `.grad` (moved along, same object).
So a tied weight is moved once and stays one Parameter; buffers are replaced by `_apply` on CUDA
too (`self._buffers[key] = fn(buf)`), so nothing changes for them.

`model.to(0)` / `model.to(rank)`: `nn.Module.to` parses its arguments with `_parse_to`, which on a
CPU-only torch rejects a device ordinal; ordinals are read as `cuda:N` during the capture.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from peakmem.capture.library_patches import patched, register_library_patch
from peakmem.capture.tensor_overrides import register_override
from peakmem.trace.vocab import Category

Tensor = torch.Tensor
_compatible = torch._has_compatible_shallow_copy_type
_PLAIN = (
    Tensor,
    torch.nn.Parameter,
    torch.nn.parameter.UninitializedParameter,  # a lazy module moved before its first call
    torch.nn.parameter.UninitializedBuffer,
)
_NO_SUBCLASS_HOOKS = torch._C.DisableTorchFunctionSubclass


def _crosses(mode, tensor: Any, other: Any) -> bool:
    """Whether `tensor` and `other` are a host and a fake device tensor (either order)."""
    if type(tensor) not in _PLAIN or type(other) not in _PLAIN:
        return False  # other subclasses keep their own rules
    if tensor.layout != torch.strided or other.layout != torch.strided:
        return False
    kinds = {tensor.device.type, other.device.type}
    if kinds != {"cpu", "meta"}:
        return False
    meta = tensor if tensor.device.type == "meta" else other
    return mode.session.storage_kind(meta) == "device"


def _swappable(tensor: Tensor) -> bool:
    """No C++ owner but the Python object (and a leaf's AccumulateGrad node) holds `tensor`."""
    count = tensor._use_count()
    return count == 1 or (count == 2 and tensor.is_leaf)


_REFUSED_GRADS: dict[int, weakref.ref] = {}
"""id -> weak reference of gradients of parameters that could not be swapped (a C++ owner holds them: DDP's reducer):
`_apply` makes a new Parameter for such a parameter, so its gradient must not be moved in place
either (it would look for the new Parameter's `.grad`, which is None)."""


@register_override([torch._has_compatible_shallow_copy_type])
def _shallow_copy_compatible(mode, func, args: tuple, kwargs: dict) -> Any:
    tensor, other = args[0], args[1]
    with _NO_SUBCLASS_HOOKS():
        if _crosses(mode, tensor, other):
            refused = _REFUSED_GRADS.get(id(tensor))
            if _swappable(tensor) and (refused is None or refused() is not tensor):
                return True
            grad = tensor.grad if tensor.is_leaf else None
            if grad is not None:
                key = id(grad)
                _REFUSED_GRADS[key] = weakref.ref(grad, lambda _ref, key=key: _REFUSED_GRADS.pop(key, None))
    return func(*args, **kwargs)


@register_override([Tensor.data.__set__])
def _set_data(mode, func, args: tuple, kwargs: dict) -> Any:
    tensor, new = args[0], args[1]
    with _NO_SUBCLASS_HOOKS():
        if not _crosses(mode, tensor, new) or _compatible(tensor, new):
            copying = _owns_its_storage(new) and _weight_copy(mode, tensor, new)
            result = func(*args, **kwargs)
            if _owns_its_storage(new) and not copying:
                _claim_as_parameter(mode, tensor)
            _claim_frozen_parameter(mode, tensor)
            return result
        _swap_data(mode, tensor, new)
        _claim_frozen_parameter(mode, tensor)
    return None


_MOVED = (Category.INPUT.value,)


def _claim_frozen_parameter(mode, tensor: Any) -> None:
    """A frozen Parameter moved to the device (`vae.requires_grad_(False); vae.to(device,
    dtype)`, `module._apply` setting `param.data`): its block holds the weight from now on. A
    trainable one is claimed when an optimizer steps it (or a forward of its root module runs),
    a frozen one by nothing but its root module's forward, which never runs when the job calls
    only a part of it (diffusers' `vae.encode` runs the VAE's encoder: the decoder's weights,
    on the device all along, stayed the host copy's "input")."""
    if (
        isinstance(tensor, torch.nn.Parameter)
        and not tensor.requires_grad
        and tensor.device.type == "meta"
        and mode.session.storage_kind(tensor) == "device"
    ):
        mode.session.classify(tensor, Category.PARAMETER.value, only_from=_MOVED)


_COMPUTED = (Category.TEMPORARY.value, Category.ACTIVATION.value, Category.OTHER.value,
             Category.MODEL_COPY.value)
"""What a tensor computed by the job may be tagged before it becomes a parameter's data (a
parameter copied from the host stays an input until a module's forward or an optimizer claims
it, as before)."""


def _owns_its_storage(new: Any) -> bool:
    """Whether `new` is a whole storage of its own (a computed tensor), not a view into a larger
    buffer: FSDP points each parameter's `.data` at a view of its unsharded flat parameter, a
    gathered buffer that is freed after use and is not the parameter's block."""
    if not isinstance(new, Tensor) or new.storage_offset() != 0:
        return False
    try:
        return new.untyped_storage().nbytes() == new.numel() * new.element_size()
    except (RuntimeError, NotImplementedError):
        return False


def _weight_copy(mode, tensor: Any, new: Any) -> bool:
    """`param.data = computed` on a frozen parameter, computed from the trained weights (a
    momentum encoder): tagged `ema` (capture.weight_copies)."""
    tracker = mode.session.phase_tracker
    copies = getattr(tracker, "weight_copies", None)
    return (
        copies is not None
        and isinstance(tensor, torch.nn.Parameter)
        and tensor.device.type == "meta"
        and copies.replaced(tensor, new)
    )


def _claim_as_parameter(mode, tensor: Any) -> None:
    """`param.data = computed` on the device (MoCo / BYOL's momentum encoder:
    `param_k.data = param_k.data * m + param_q.data * (1 - m)`, a manual SGD's
    `p.data = p.data - lr * p.grad`): the computed tensor's block now holds the parameter, however
    its op tagged it (made in a forward, it would be an activation once backward starts). A
    parameter that no optimizer steps is never claimed otherwise."""
    if (
        isinstance(tensor, torch.nn.Parameter)
        and tensor.device.type == "meta"
        and not getattr(tensor, "_is_flat_param", False)  # FSDP1 points it at gathered buffers
    ):
        mode.session.classify(tensor, Category.PARAMETER.value, only_from=_COMPUTED)


def _swap_data(mode, tensor: Tensor, new: Tensor) -> None:
    grad = tensor.grad
    requires_grad = tensor.requires_grad
    if grad is not None:
        tensor.grad = None
    displaced = new.detach()
    torch._C._swap_tensor_impl(tensor, displaced)
    _free_if_only_a_graph_holds(mode, displaced)
    if requires_grad:
        tensor.requires_grad_(True)
    if grad is not None:
        moved = _moved_like(mode, grad, tensor)
        torch._C._swap_tensor_impl(grad, moved.detach())
        tensor.grad = grad


def _free_if_only_a_graph_holds(mode, displaced: Tensor) -> None:
    """After a device parameter moved to the host: its old device TensorImpl (now `displaced`'s)
    may still be held by a live graph's AccumulateGrad node (the last iteration's loss or
    outputs, still referenced: pix2pix's `net.cpu(); torch.save(...); net.cuda()` at the end of
    an epoch). On CUDA, `set_data` changes that same TensorImpl's storage, so the device block is
    freed at once; here the swap leaves it alive until the graph dies. When the node is its only
    other owner (no saved tensor: the graph's backward ran) and the storage is the parameter's
    alone, its allocation is given back now, as `resize_(0)` does (capture.storage_resize)."""
    if displaced.device.type != "meta" or mode.session.storage_kind(displaced) != "device":
        return
    if not (displaced.is_leaf and displaced.requires_grad) or displaced._use_count() != 2:
        return
    storage = displaced.untyped_storage()
    if displaced.storage_offset() != 0 or storage.nbytes() != displaced.numel() * displaced.element_size():
        return
    with torch.no_grad():
        storage.resize_(0)


def _moved_like(mode, grad: Tensor, param: Tensor) -> Tensor:
    """`grad` on `param`'s device and dtype (a device copy, or a host read of a device one)."""
    with torch.no_grad():
        if param.device.type == "meta":
            return grad.to(device=param.device, dtype=param.dtype)
        return mode.host_values(grad).to(dtype=param.dtype)


def _ordinal_as_cuda(value: Any) -> Any:
    if isinstance(value, int) and not isinstance(value, bool):
        return torch.device("cuda", value)
    return value


@register_library_patch("module_to_device_ordinal")
@contextmanager
def module_to_device_ordinal() -> Iterator[None]:
    """`model.to(0)`, `model.to(rank)`, `model.to(device=0)`; `model.to(tensor)` with a device
    tensor (byol-pytorch's `MLP(...).to(hidden)`): `_parse_to` reads the tensor's true device,
    meta, which would move the module to the meta device (no memory, its weights gone from the
    estimate); it is the device the tensor reports, as on CUDA."""
    original = torch._C._nn._parse_to

    def parse_to(*args: Any, **kwargs: Any) -> Any:
        if args:
            args = (_ordinal_as_cuda(args[0]), *args[1:])
        if "device" in kwargs:
            kwargs["device"] = _ordinal_as_cuda(kwargs["device"])
        parsed = original(*args, **kwargs)
        like = args[0] if args and isinstance(args[0], Tensor) else kwargs.get("tensor")
        if isinstance(like, Tensor) and parsed[0] is not None and parsed[0].type == "meta":
            reported = like.device  # a fake device tensor reports the job's CUDA device
            if reported.type != "meta":
                parsed = (reported, *parsed[1:])
        return parsed

    with patched(torch._C._nn, "_parse_to", parse_to):
        yield


@register_library_patch("moved_module_buffers")
@contextmanager
def moved_module_buffers() -> Iterator[None]:
    """A module's buffers moved to the device with it (`module.to(device)`, `.cuda()`: `_apply`
    replaces each, `self._buffers[key] = fn(buf)`, in every submodule) are tagged `buffer` from
    then on, as the host copy's blocks were tagged `input`. Before, they became buffers only
    when a forward of their root module ran, so a module whose own forward never runs kept them
    as `input`: ema-pytorch's EMA copy of a denoising-diffusion GaussianDiffusion (sampling runs
    only its Unet's forward; the diffusion schedule's buffers are the wrapper's), and the EMA
    wrapper's own `initted` / `step`. Its parameters are made known as weights to
    capture.model_copies (they keep their `input` tag)."""
    from peakmem.capture.running_session import session_on_mode_stack

    original = torch.nn.Module._apply

    def _apply(self: torch.nn.Module, fn: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, fn, *args, **kwargs)
        session = session_on_mode_stack()
        if session is not None:
            for buffer in self._buffers.values():
                if isinstance(buffer, Tensor):
                    session.classify(buffer, Category.BUFFER.value, only_from=_MOVED)
            # its parameters stay `input` until a forward claims them; a copy of them made
            # before that is a model copy all the same (capture.model_copies)
            copies = getattr(session.phase_tracker, "model_copies", None)
            if copies is not None and self._parameters:
                with torch._C.DisableTorchFunction():  # the true device, not the job's view
                    copies.moved(list(self._parameters.values()))
        return result

    with patched(torch.nn.Module, "_apply", _apply):
        yield
