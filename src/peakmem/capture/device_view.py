"""Device tensors as the job sees them: `cuda:0` tensors.

The capture keeps device tensors on the meta device, but the job and every library it calls see
`t.device == torch.device("cuda", 0)`, `t.is_cuda`, `t.get_device() == 0`, `not t.is_meta`,
`repr(t)` with `device='cuda:0'` (placeholder values, real ones in eager mode). A meta tensor that
stands for host memory (`session.storage_kind(t) == "host"`) reports `cpu`; the job's own meta
tensors (`"meta"`) stay meta.

How: while the capture's torch-function mode is active, tensor property getters reach it first
(`capture.tensor_overrides`); the handlers below answer from the true device and the storage
kind. The capture's own machinery never sees the view: torch-function handlers run with the mode
popped, the recorder's dispatch runs with torch functions off, and the rules and phase hooks read
devices through `cuda_rules.true_device`.
"""

from __future__ import annotations

from typing import Any

import torch

from peakmem.capture.tensor_overrides import register_override

Tensor = torch.Tensor
JOB_DEVICE = torch.device("cuda", 0)
_HOST = torch.device("cpu")
_BY_KIND = {"device": JOB_DEVICE, "host": _HOST}
_PLAIN = (Tensor, torch.nn.Parameter)


def viewed_device(session: Any, tensor: Tensor) -> torch.device:
    """The device the job sees for `tensor` (call with the capture's mode popped)."""
    device = tensor.device
    if device.type != "meta":
        return device
    try:
        if type(tensor) in _PLAIN:
            kind = session.storage_kind(tensor)
        else:  # a subclass may refuse `untyped_storage()` (lazy modules' UninitializedParameter)
            with torch._C.DisableTorchFunctionSubclass():
                kind = session.storage_kind(tensor)
    except (RuntimeError, NotImplementedError):  # no storage (sparse, nested, ...)
        kind = "device"
    devices = session.devices
    if kind == "device" and devices is not None:  # several GPUs (capture.data_parallel)
        index = devices.index_of(tensor)
        if index:
            return torch.device("cuda", index)
    return _BY_KIND.get(kind, device)


@register_override([Tensor.device.__get__])
def _device(mode, func, args: tuple, kwargs: dict) -> Any:
    return viewed_device(mode.session, args[0])


@register_override([Tensor.is_cuda.__get__])
def _is_cuda(mode, func, args: tuple, kwargs: dict) -> Any:
    return viewed_device(mode.session, args[0]).type == "cuda"


@register_override([Tensor.is_meta.__get__])
def _is_meta(mode, func, args: tuple, kwargs: dict) -> Any:
    return viewed_device(mode.session, args[0]).type == "meta"


@register_override([Tensor.is_cpu.__get__])
def _is_cpu(mode, func, args: tuple, kwargs: dict) -> Any:
    return viewed_device(mode.session, args[0]).type == "cpu"


@register_override([Tensor.data_ptr])
def _data_ptr(mode, func, args: tuple, kwargs: dict) -> Any:
    """A fake device tensor's address: distinct per storage (capture.fake_addresses)."""
    tensor = args[0]
    if tensor.device.type != "meta":
        return func(*args, **kwargs)
    from peakmem.capture.fake_addresses import tensor_address

    return tensor_address(tensor)


@register_override([Tensor.get_device])
def _get_device(mode, func, args: tuple, kwargs: dict) -> Any:
    device = viewed_device(mode.session, args[0])
    return device.index if device.type == "cuda" else -1


@register_override([Tensor.__repr__])
def _repr(mode, func, args: tuple, kwargs: dict) -> Any:
    """A device tensor prints its values (placeholder zeros in fake mode, not counted as a host
    read: printing does not steer the job) with `device='cuda:0'`, as a CUDA tensor does."""
    tensor = args[0]
    if (
        type(tensor) not in (Tensor, torch.nn.Parameter)
        or tensor.layout != torch.strided
        or viewed_device(mode.session, tensor).type != "cuda"  # cuda:0 (DataParallel: cuda:k)
    ):
        return func(*args, **kwargs)
    if mode.session.host_value is None:  # fake mode: zeros that take no host memory
        host = torch.zeros((), dtype=tensor.dtype, device="cpu").expand(tensor.shape)
    else:
        host = mode.session.host_value(tensor)
    contents = torch._tensor_str._tensor_str(host.detach(), len("tensor("))
    with mode:  # the job's view of the tensor for the suffixes: device='cuda:0', not meta
        return torch._tensor_str._str(tensor, tensor_contents=contents)


@register_override([Tensor.__format__])
def _format(mode, func, args: tuple, kwargs: dict) -> Any:
    """`f"{t}"` of a device tensor with dimensions prints like `repr` (as on CUDA); a scalar's
    format spec reads its value (a host read, as before)."""
    tensor = args[0]
    if tensor.dim() and viewed_device(mode.session, tensor).type == "cuda":
        return _repr(mode, Tensor.__repr__, (tensor,), {})
    return func(*(mode.host_values(value) for value in args), **kwargs)

