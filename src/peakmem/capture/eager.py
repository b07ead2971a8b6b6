"""Eager mode: the job runs for real on the CPU, and the trace is still the fake capture's.

Device tensors stay meta tensors: the recorder, the phases and every CUDA rule see exactly what
they see in fake mode. Beside each meta storage lives a real CPU storage of the same size, its
*shadow*, holding the values the GPU would hold. `ShadowExecutor` is a dispatch mode inside the
recorder: every aten (or custom) op that touches a device tensor runs twice, on meta (what the
recorder tracks) and on the shadows (real values). Views and in-place ops need no bookkeeping:
a shadow tensor is rebuilt for each call from its meta tensor's storage offset, sizes and strides
over the shadow storage, so aliasing is the meta storage's aliasing.

Where the meta run cannot go, the real one decides:
- an op without a meta kernel (or a custom op without a fake implementation) runs only on the
  shadows; its device outputs are meta tensors of the real outputs' geometry;
- an op whose output size depends on values (`nonzero`, boolean masks, `unique`) gets meta
  outputs of the real (exact) size instead of the fake upper bound;
- a host read of a device tensor (`.item()`, `.tolist()`, `.cpu()`, ...) gets the real values.
CUDA-only kernels the CUDA rules emit (fused attention) have no CPU kernel; their shadows are
computed with the math they stand for (`_SUBSTITUTES`).
"""

from __future__ import annotations

import math
import os
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

from peakmem.capture.device_specs import is_meta_spec
from peakmem.capture.recorder_guard import peakmem_modes_off
from peakmem.capture.session import CaptureSession
from peakmem.capture.unsupported import Unsupported
from peakmem.cuda_rules.true_device import is_meta

aten = torch.ops.aten
GIB = 2**30
RAM_HEADROOM = 0.9
"""Eager mode may hold shadows up to this share of the host RAM available when it starts."""


class EagerMemoryError(BaseException):  # noqa: N818  (a stop signal the job must not catch)
    """The shadows of the device tensors would not fit in host RAM."""


def available_ram_bytes() -> int:
    """Host RAM available to new allocations (MemAvailable; total physical memory elsewhere)."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 1 << 62


def eager_ram_limit() -> int:
    """Bytes of shadows eager mode may hold (PEAKMEM_EAGER_RAM_BYTES overrides it: a number of
    bytes such as 8589934592 or 8e9, or a size such as 8GiB). A value that is not a finite size
    >= 0 raises InputError (a ValueError) naming the variable."""
    from peakmem.inputs import InputError, one_line, parse_size

    override = os.environ.get("PEAKMEM_EAGER_RAM_BYTES")
    if override is not None and override.strip():
        value = parse_size(override)
        if value is None:
            try:
                number = float(override) if len(override) <= 64 else math.nan
            except ValueError:
                number = math.nan
            if math.isfinite(number) and 0 <= number < 2**63:
                value = int(number)
        if value is None or value >= 2**63:
            raise InputError(
                f"PEAKMEM_EAGER_RAM_BYTES={one_line(repr(override), 60)} is not a size in bytes "
                "(use e.g. 8589934592 or 8GiB)"
            )
        return value
    return int(available_ram_bytes() * RAM_HEADROOM)


def _is_meta_device(value: Any) -> bool:
    return isinstance(value, (str, torch.device)) and is_meta_spec(value)


def op_name(func: Any) -> str:
    """`aten::nonzero`, `mylib::foo` for an OpOverload."""
    schema = getattr(func, "_schema", None)
    if schema is not None:
        return schema.name
    return str(func)


class ShadowExecutor(TorchDispatchMode):
    def __init__(self, session: CaptureSession, ram_limit: int | None = None) -> None:
        super().__init__()
        self.session = session
        self.ram_limit = eager_ram_limit() if ram_limit is None else ram_limit
        self.storages: dict[int, torch.UntypedStorage] = {}  # id(meta storage) -> CPU storage
        self.shadow_bytes = 0
        self.max_shadow_bytes = 0
        self.meta_only_ops: set[str] = set()  # ops whose real values were not computed
        self.no_shadow = 0  # device tensors met without real values (zeros were used)

    # -- shadows -----------------------------------------------------------------------------
    def shadow(self, tensor: torch.Tensor) -> torch.Tensor:
        """A CPU tensor viewing `tensor`'s shadow storage with `tensor`'s geometry."""
        meta_storage = tensor.untyped_storage()
        storage = self.storages.get(id(meta_storage))
        if storage is None:  # made outside the executor's sight (rare): zeros stand in
            self.no_shadow += 1
            storage = self._register(meta_storage, None)
        view = torch.empty(0, dtype=tensor.dtype, device="cpu")  # not the job's default
        view.set_(storage, tensor.storage_offset(), tensor.size(), tensor.stride())
        if tensor.is_conj():
            view = view.conj()
        if tensor.is_neg():
            view = view._neg_view()
        return view

    def host_value(self, tensor: Any) -> Any:
        """The real values of a device tensor, as a host tensor of its own (a copy)."""
        if is_meta(tensor):
            with peakmem_modes_off(), torch.utils._python_dispatch._disable_current_modes():
                return self.shadow(tensor).clone()
        return tensor

    def _register(self, meta_storage: Any, source: torch.Tensor | None, meta=None):
        """Give `meta_storage` a shadow: `source`'s storage when its layout matches `meta`'s,
        else a fresh storage (zeros, then `source` copied in with `meta`'s geometry)."""
        key = id(meta_storage)
        nbytes = meta_storage.nbytes()
        if (
            source is not None
            and meta is not None
            and source.storage_offset() == meta.storage_offset()
            and source.stride() == meta.stride()
            and source.untyped_storage().nbytes() == nbytes
        ):
            storage = source.untyped_storage()
        else:
            self._reserve(nbytes)
            storage = torch.zeros(nbytes, dtype=torch.uint8, device="cpu").untyped_storage()
            if source is not None and meta is not None:
                view = torch.empty(0, dtype=meta.dtype, device="cpu")
                view.set_(storage, meta.storage_offset(), meta.size(), meta.stride())
                view.copy_(source)
        self.storages[key] = storage
        self._count(nbytes)
        weakref.finalize(meta_storage, self._storage_died, key, nbytes)
        return storage

    def _storage_died(self, key: int, nbytes: int) -> None:
        if self.storages.pop(key, None) is not None:
            self.shadow_bytes -= nbytes

    def _count(self, nbytes: int) -> None:
        self.shadow_bytes += nbytes
        self.max_shadow_bytes = max(self.max_shadow_bytes, self.shadow_bytes)

    def _reserve(self, nbytes: int) -> None:
        if self.shadow_bytes + nbytes > self.ram_limit:
            raise EagerMemoryError(
                f"eager mode needs more than {(self.shadow_bytes + nbytes) / GIB:.1f} GiB of "
                f"host RAM for the device tensors' real values; {self.ram_limit / GIB:.1f} GiB "
                "may be used"
            )

    # -- dispatch ----------------------------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        flat_in, _ = tree_flatten((args, kwargs))
        if not any(is_meta(v) or _is_meta_device(v) for v in flat_in):
            return func(*args, **kwargs)  # a host op
        if func is aten._local_scalar_dense.default:  # `.item()` from C++
            return self.shadow(args[0]).item()
        if any(is_meta(v) and v.layout != torch.strided for v in flat_in) or (
            kwargs.get("layout") not in (None, torch.strided)
        ):
            raise Unsupported("sparse CUDA tensors in eager mode")

        meta_out, meta_error = None, None
        try:
            meta_out = func(*args, **kwargs)
        except Exception as exc:  # no meta kernel, a custom op without a fake impl, ...
            meta_error = exc

        substitute = _SUBSTITUTES.get(func)
        if substitute is not None and meta_out is not None:
            shadow_args, shadow_kwargs = self._shadow_args(args, kwargs)
            real = substitute(meta_out, *shadow_args, **shadow_kwargs)
            return self._adopt_all(meta_out, real, _storage_ptrs(shadow_args, shadow_kwargs))

        self._reserve_outputs(meta_out)
        shadow_args, shadow_kwargs = self._shadow_args(args, kwargs)
        try:
            real = func(*shadow_args, **shadow_kwargs)
        except Exception:
            if meta_error is not None:
                raise meta_error from None  # fails for real too: the job's own error
            self.meta_only_ops.add(op_name(func))  # a CUDA-only kernel: values unknown
            self._adopt_all(meta_out, None)
            return meta_out
        if meta_error is not None:
            return self._meta_from_real(func, args, kwargs, shadow_args, shadow_kwargs, real)
        return self._adopt_all(meta_out, real, _storage_ptrs(shadow_args, shadow_kwargs))

    def _shadow_args(self, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        def convert(value: Any) -> Any:
            if is_meta(value):
                return self.shadow(value)
            if _is_meta_device(value):
                return torch.device("cpu")
            return value

        return tree_map(convert, args), tree_map(convert, kwargs)

    def _reserve_outputs(self, meta_out: Any) -> None:
        if meta_out is None:
            return
        flat, _ = tree_flatten(meta_out)
        fresh = {
            id(t.untyped_storage()): t.untyped_storage().nbytes()
            for t in flat
            if is_meta(t) and id(t.untyped_storage()) not in self.storages
        }
        self._reserve(sum(fresh.values()))

    def _adopt_all(self, meta_out: Any, real: Any, inputs: frozenset[int] = frozenset()) -> Any:
        """Give every new meta output storage its shadow; a meta output whose size differs from
        the real one (a data-dependent size) is replaced by one of the real size."""
        flat_meta, spec = tree_flatten(meta_out)
        flat_real = tree_flatten(real)[0] if real is not None else [None] * len(flat_meta)
        if len(flat_real) != len(flat_meta):
            flat_real = [None] * len(flat_meta)
        changed = False
        for index, (meta, value) in enumerate(zip(flat_meta, flat_real, strict=True)):
            if not is_meta(meta):
                continue
            source = value if isinstance(value, torch.Tensor) else None
            if id(meta.untyped_storage()) in self.storages:
                continue  # a view or an in-place result: the shadow already holds it
            if source is not None and source.shape != meta.shape:
                meta = torch.empty_strided(
                    source.size(), source.stride(), dtype=meta.dtype, device="meta"
                )
                flat_meta[index] = meta
                changed = True
            if source is not None and source.untyped_storage().data_ptr() in inputs:
                source = source.clone()  # the CPU kernel aliased an input where CUDA copies
            self._register(meta.untyped_storage(), source, meta)
        return tree_unflatten(flat_meta, spec) if changed else meta_out

    def _meta_from_real(self, func, args, kwargs, shadow_args, shadow_kwargs, real) -> Any:
        """Meta outputs for an op that ran only for real: an output that is one of the inputs
        (in-place, out=) is that input; a new CPU tensor becomes a new device tensor."""
        originals = {
            id(s): m
            for s, m in zip(
                tree_flatten((shadow_args, shadow_kwargs))[0],
                tree_flatten((args, kwargs))[0],
                strict=True,
            )
            if isinstance(s, torch.Tensor)
        }
        host_target = any(
            isinstance(v, (str, torch.device)) and torch.device(v).type == "cpu"
            for v in (kwargs.get("device"),)
            if v is not None
        )

        def to_meta(value: Any) -> Any:
            if not isinstance(value, torch.Tensor):
                return value
            if id(value) in originals:
                return originals[id(value)]
            if host_target:
                return value
            meta = torch.empty_strided(
                value.size(), value.stride(), dtype=value.dtype, device="meta"
            )
            self._reserve(meta.untyped_storage().nbytes())
            self._register(meta.untyped_storage(), value, meta)
            return meta

        return tree_map(to_meta, real)


def _storage_ptrs(args: tuple, kwargs: dict) -> frozenset[int]:
    return frozenset(
        t.untyped_storage().data_ptr()
        for t in tree_flatten((args, kwargs))[0]
        if isinstance(t, torch.Tensor) and t.untyped_storage().nbytes()
    )


# -- CUDA-only kernels: their values computed with the math they implement ---------------------


def _attention(q, k, v, bias, is_causal: bool, scale: float | None):
    """Scores softmax and output (fp32 math), as the fused kernels compute them."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    qf, kf, vf = q.float(), k.float(), v.float()
    if kf.shape[-3] != qf.shape[-3]:  # grouped-query attention
        repeat = qf.shape[-3] // kf.shape[-3]
        kf, vf = kf.repeat_interleave(repeat, -3), vf.repeat_interleave(repeat, -3)
    scores = qf @ kf.transpose(-2, -1) * scale
    if bias is not None:
        scores = scores + bias.float()
    if is_causal:
        length_q, length_k = scores.shape[-2:]
        keep = torch.ones(length_q, length_k, dtype=torch.bool).tril(length_k - length_q)
        scores = scores.masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(scores, -1)
    probs = torch.exp(scores - lse.unsqueeze(-1)).nan_to_num(0.0)
    return probs, probs @ vf, lse, kf, vf, scale


def _attention_backward(grad_out, q, k, v, bias, is_causal, scale):
    probs, _, _, kf, vf, scale = _attention(q, k, v, bias, is_causal, scale)
    grad = grad_out.float()
    grad_v = probs.transpose(-2, -1) @ grad
    grad_probs = grad @ vf.transpose(-2, -1)
    grad_scores = probs * (grad_probs - (grad_probs * probs).sum(-1, keepdim=True))
    grad_q = grad_scores @ kf * scale
    grad_k = grad_scores.transpose(-2, -1) @ q.float() * scale
    if k.shape[-3] != q.shape[-3]:
        groups = q.shape[-3] // k.shape[-3]
        shape = (*k.shape[:-3], k.shape[-3], groups, *k.shape[-2:])
        grad_k, grad_v = grad_k.reshape(shape).sum(-3), grad_v.reshape(shape).sum(-3)
    return grad_q.to(q.dtype), grad_k.to(k.dtype), grad_v.to(v.dtype), grad_scores


def _zeros_like_meta(meta_out: Any) -> list:
    return [
        torch.zeros(t.shape, dtype=t.dtype) if isinstance(t, torch.Tensor) else None
        for t in tree_flatten(meta_out)[0]
    ]


def _flash_forward(meta_out, q, k, v, dropout_p=0.0, is_causal=False, return_debug_mask=False,
                   *, scale=None):
    _, out, lse, *_ = _attention(q, k, v, None, is_causal, scale)
    real = _zeros_like_meta(meta_out)
    real[0], real[1] = out.to(q.dtype), lse
    return real


def _flash_backward(meta_out, grad_out, q, k, v, out, lse, cum_q, cum_k, max_q, max_k,
                    dropout_p, is_causal, philox_seed, philox_offset, *, scale=None):
    return list(_attention_backward(grad_out, q, k, v, None, is_causal, scale)[:3])


def _efficient_forward(meta_out, q, k, v, bias, compute_lse, dropout_p=0.0, is_causal=False,
                       *, scale=None):
    _, out, lse, *_ = _attention(q, k, v, bias, is_causal, scale)
    real = _zeros_like_meta(meta_out)
    real[0] = out.to(q.dtype)
    if real[1] is not None and real[1].numel():  # logsumexp, padded to a multiple of 32
        real[1][..., : lse.shape[-1]] = lse
    return real


def _efficient_backward(meta_out, grad_out, q, k, v, bias, out, lse, seed, offset, dropout_p,
                        grad_input_mask, is_causal=False, *, scale=None):
    grad_q, grad_k, grad_v, grad_scores = _attention_backward(
        grad_out, q, k, v, bias, is_causal, scale
    )
    real = _zeros_like_meta(meta_out)
    real[:3] = [grad_q, grad_k, grad_v]
    if len(real) > 3 and real[3] is not None and bias is not None:
        real[3] = grad_scores.sum_to_size(bias.shape).to(bias.dtype)
    return real


def _cudnn_forward(meta_out, q, k, v, bias, compute_lse, dropout_p=0.0, is_causal=False,
                   return_debug_mask=False, *, scale=None):
    _, out, lse, *_ = _attention(q, k, v, bias, is_causal, scale)
    real = _zeros_like_meta(meta_out)
    real[0], real[1] = out.to(q.dtype), lse.unsqueeze(-1)  # logsumexp (B, H, L, 1)
    return real


def _cudnn_backward(meta_out, grad_out, q, k, v, out, lse, seed, offset, bias, cum_q, cum_k,
                    max_q, max_k, dropout_p, is_causal, *, scale=None):
    return list(_attention_backward(grad_out, q, k, v, bias, is_causal, scale)[:3])


_SUBSTITUTES: dict[Any, Callable[..., Any]] = {}
for _name, _fn in (
    ("_scaled_dot_product_flash_attention", _flash_forward),
    ("_scaled_dot_product_flash_attention_backward", _flash_backward),
    ("_scaled_dot_product_efficient_attention", _efficient_forward),
    ("_scaled_dot_product_efficient_attention_backward", _efficient_backward),
    ("_scaled_dot_product_cudnn_attention", _cudnn_forward),
    ("_scaled_dot_product_cudnn_attention_backward", _cudnn_backward),
):
    if hasattr(aten, _name):
        _SUBSTITUTES[getattr(aten, _name).default] = _fn
