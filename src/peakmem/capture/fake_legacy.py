"""The legacy CUDA tensor types of old scripts: `torch.cuda.FloatTensor(3, 4)`,
`torch.cuda.LongTensor([1, 2])`, `x.type(torch.cuda.HalfTensor)` / `x.type("torch.cuda.FloatTensor")`,
`isinstance(x, torch.cuda.FloatTensor)`, `torch.set_default_tensor_type(torch.cuda.FloatTensor)`.
A CPU build of torch refuses them all ("type torch.cuda.FloatTensor not available"); during a
capture they make fake device tensors as CUDA would.

A CUDA default tensor type reaches further than a default device: besides the factory
functions (`torch.zeros`, `torch.linspace`, `torch.rand`: `set_default_device`), torch's legacy
constructor `torch.Tensor(...)` makes tensors of the default *type*, so `torch.Tensor([1e10])`,
`torch.Tensor(ndarray)`, `torch.Tensor(3, 4)` are CUDA tensors after it (nerf-pytorch's
`run_nerf.py` relies on it: `torch.cat([dists, torch.Tensor([1e10]).expand(...)])`). A default
device leaves that constructor on the CPU (torch's own rule), so while the job's default type
is a CUDA one, `torch.Tensor(...)` itself is redirected to the device (`_LegacyConstructor`),
and put back when the job sets a CPU type or the capture ends."""

from __future__ import annotations

from typing import Any

import torch

from peakmem.capture.session import CaptureSession
from peakmem.cuda_rules.true_device import is_meta

NAMES = (
    "FloatTensor",
    "DoubleTensor",
    "HalfTensor",
    "BFloat16Tensor",
    "LongTensor",
    "IntTensor",
    "ShortTensor",
    "CharTensor",
    "ByteTensor",
    "BoolTensor",
)
_DTYPES = {name: getattr(torch.cuda, name).dtype for name in NAMES if hasattr(torch.cuda, name)}


def _new(dtype: torch.dtype, args: tuple, kwargs: dict) -> torch.Tensor:
    kwargs.pop("device", None)
    if not args:
        return torch.empty(0, dtype=dtype, device="cuda")
    if len(args) == 1 and isinstance(args[0], torch.Size) or all(
        isinstance(a, int) and not isinstance(a, bool) for a in args
    ):
        return torch.empty(*args, dtype=dtype, device="cuda")
    if len(args) == 1 and isinstance(args[0], torch.Tensor):
        return args[0].to("cuda", dtype)
    return torch.tensor(args[0], dtype=dtype, device="cuda")


class _LegacyCudaType(type):
    dtype: torch.dtype

    def __call__(cls, *args: Any, **kwargs: Any) -> torch.Tensor:  # type: ignore[override]
        return _new(cls.dtype, args, kwargs)

    def __instancecheck__(cls, obj: object) -> bool:
        return isinstance(obj, torch.Tensor) and is_meta(obj) and obj.dtype == cls.dtype

    def __repr__(cls) -> str:
        return f"<class 'torch.cuda.{cls.__name__}'>"


def _cuda_dtype(target: Any) -> torch.dtype | None:
    """The dtype of a legacy CUDA tensor type (ours, torch's, or its name), else None."""
    if isinstance(target, str):
        if target.startswith("torch.cuda."):
            return _DTYPES.get(target.removeprefix("torch.cuda."))
        return None
    if isinstance(target, _LegacyCudaType):
        return target.dtype
    if getattr(target, "is_cuda", False) is True and getattr(target, "__name__", None) in _DTYPES:
        return _DTYPES[target.__name__]
    return None


class _LegacyConstructor:
    """`torch.Tensor.__new__` while the job's default tensor type is a CUDA one: a call of
    `torch.Tensor` itself without a `device` makes a device tensor of the default dtype (as
    torch's legacy constructor does for `torch.cuda.*Tensor` defaults); subclasses' and other
    calls go to torch's own constructor. Installed only from `set_default_tensor_type`, removed by
    `restore` (a job that never sets a CUDA type runs torch's constructor untouched)."""

    installed = False

    @staticmethod
    def new(cls: type, *args: Any, **kwargs: Any) -> torch.Tensor:
        if cls is torch.Tensor and "device" not in kwargs:
            return _new(torch.get_default_dtype(), args, dict(kwargs))
        return torch._C.TensorBase.__new__(cls, *args, **kwargs)

    @classmethod
    def install(cls) -> None:
        if not cls.installed:
            torch.Tensor.__new__ = staticmethod(cls.new)  # type: ignore[assignment]
            cls.installed = True

    @classmethod
    def restore(cls) -> None:
        if cls.installed:
            del torch.Tensor.__new__  # torch.Tensor inherits TensorBase's again
            cls.installed = False


def restore(session: CaptureSession) -> None:
    """Undo what a CUDA default tensor type changed beyond the default dtype / device (called
    where the capture's patches are put back)."""
    _LegacyConstructor.restore()


def patches(session: CaptureSession) -> dict[tuple[Any, str], Any]:
    original_type = torch.Tensor.type
    original_set_default_tensor_type = torch.set_default_tensor_type

    def tensor_type(self: torch.Tensor, dtype: Any = None, non_blocking: bool = False, **kwargs: Any) -> Any:
        target = _cuda_dtype(dtype)
        if target is not None:
            return self.to("cuda", target, non_blocking=non_blocking)
        if dtype is None:
            name = original_type(self)
            if is_meta(self) and session.storage_kind(self) == "device":
                return name.replace("torch.meta.", "torch.cuda.", 1)
            return name
        return original_type(self, dtype, non_blocking, **kwargs)

    def set_default_tensor_type(t: Any) -> None:
        target = _cuda_dtype(t)
        if target is None:
            if _LegacyConstructor.installed:  # back from a CUDA type to a CPU one
                _LegacyConstructor.restore()
                torch.set_default_device(None)
            return original_set_default_tensor_type(t)
        torch.set_default_dtype(target)
        torch.set_default_device("cuda")  # the capture's (patched) default device
        _LegacyConstructor.install()  # `torch.Tensor(...)` follows the default type too
        return None

    found: dict[tuple[Any, str], Any] = {
        (torch.Tensor, "type"): tensor_type,
        (torch, "set_default_tensor_type"): set_default_tensor_type,
    }
    for name, dtype in _DTYPES.items():
        fake = _LegacyCudaType(name, (), {"dtype": dtype, "is_cuda": True, "is_sparse": False})
        found[(torch.cuda, name)] = fake
    return found
