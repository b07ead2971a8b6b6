"""Per-op cost: what one aten op on the device costs a GPU (FLOPs, bytes moved, kernel family).

FLOPs of the matrix ops (mm, addmm, bmm, convolution and its backward, attention) come from
torch's own registry (`torch.utils.flop_counter.flop_registry`). Every other op is a
memory-bound kernel: its FLOPs are one per output element and its bytes the sum of its device
inputs and outputs. Ops that launch no kernel (views, `empty`, `detach`) cost nothing.

The kernel family decides the pipe a kernel keeps busy and its occupancy (utilization.model):
a registry from aten op name to family, with the elementwise family as the default.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._pytree import tree_map

from peakmem.capture.arg_tensors import tensors_in
from peakmem.cuda_rules.true_device import is_meta
from peakmem.utilization.kernel_families import (  # noqa: F401  (re-exported)
    ATTENTION,
    CONV,
    ELEMENTWISE,
    FAMILIES,
    FOREACH,
    GEMM,
    REDUCTION,
)


def _load_flop_registry() -> tuple[dict, Any, Any]:
    """torch's FLOP formulas, the code of its `shape_wrapper`'s wrapper (the formulas that read
    shapes only) and the `get_shape` it maps the arguments with. Imported once, quietly: the module warns on stderr at import when
    triton is missing on a CUDA build (and a capture makes torch look like one)."""
    logger = logging.getLogger("torch.utils.flop_counter")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        from torch.utils.flop_counter import flop_registry, get_shape, shape_wrapper
    finally:
        logger.setLevel(level)
    return flop_registry, shape_wrapper(lambda: None).__code__, get_shape


FLOP_REGISTRY, _SHAPE_WRAPPER_CODE, _get_shape = _load_flop_registry()


_FAMILY_BY_OP: dict[str, str] = {}


def register(family: str, *names: str) -> None:
    """Declare the kernel family of aten ops (by overload packet name)."""
    for name in names:
        _FAMILY_BY_OP[name] = family


register(GEMM, "mm", "addmm", "bmm", "baddbmm", "_scaled_mm", "addmv", "mv", "dot", "_addmm_activation")
register(
    CONV,
    "convolution", "_convolution", "cudnn_convolution", "convolution_overrideable",
    "convolution_backward", "cudnn_convolution_transpose", "_slow_conv2d_forward",
)
register(
    ATTENTION,
    "_scaled_dot_product_efficient_attention", "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_efficient_attention_backward",
    "_scaled_dot_product_flash_attention_backward", "_scaled_dot_product_cudnn_attention_backward",
    "_flash_attention_forward", "_efficient_attention_forward", "_flash_attention_backward",
    "_efficient_attention_backward",
)
register(
    REDUCTION,
    "sum", "mean", "amax", "amin", "max", "min", "argmax", "argmin", "norm", "linalg_vector_norm",
    "var", "var_mean", "std", "prod", "cumsum", "_softmax", "_log_softmax",
    "_softmax_backward_data", "_log_softmax_backward_data", "nll_loss_forward",
    "nll_loss_backward", "native_batch_norm", "native_batch_norm_backward",
    "_native_batch_norm_legit", "_native_batch_norm_legit_functional",
    "_native_batch_norm_legit_no_training", "cudnn_batch_norm", "cudnn_batch_norm_backward",
    "native_layer_norm", "native_layer_norm_backward", "native_group_norm",
    "native_group_norm_backward", "_fused_rms_norm", "_fused_rms_norm_backward",
    "embedding_dense_backward", "adaptive_avg_pool2d", "_adaptive_avg_pool2d",
    "_adaptive_avg_pool2d_backward", "avg_pool2d", "avg_pool2d_backward", "max_pool2d_with_indices",
    "max_pool2d_with_indices_backward", "topk", "sort", "any", "all",
)

NO_KERNEL: frozenset[str] = frozenset({
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "detach", "alias",
    "lift_fresh", "lift_fresh_copy", "_local_scalar_dense", "set_", "resize_", "sym_size",
    "sym_stride", "sym_numel", "is_same_size", "_has_compatible_shallow_copy_type", "_to_copy_meta",
    "record_stream", "_reshape_alias", "view", "_unsafe_view", "t", "expand", "as_strided",
    "slice", "select", "unsqueeze", "squeeze", "permute", "transpose", "unbind", "split",
    "split_with_sizes", "chunk", "narrow", "view_as", "reshape", "flatten", "unflatten",
    "is_nonzero", "equal", "is_pinned",
})


def family_of(name: str) -> str:
    if name in _FAMILY_BY_OP:
        return _FAMILY_BY_OP[name]
    if name.startswith(("_foreach_", "_fused_")):
        return FOREACH
    return ELEMENTWISE


@dataclass(frozen=True)
class OpCost:
    """One op's cost: kernel family, FLOPs, bytes read + written, the elements it produced
    (its parallel work), its dtype ("f32", "f16", "bf16", other), its tensor count (foreach)."""

    name: str
    family: str
    flops: float
    bytes: int
    work: int
    dtype: str
    tensors: int = 1
    reduced: int = 1
    """Reductions: input elements folded into each output (1 otherwise)."""
    inner: bool = True
    """Reductions: the folded elements are the fastest-moving (contiguous) dimension."""

    def to_row(self) -> list[Any]:
        return [self.name, self.family, self.flops, self.bytes, self.work, self.dtype,
                self.tensors, self.reduced, int(self.inner)]


_DTYPES = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16", torch.float64: "f64"}


def _tensors(value: Any) -> list[torch.Tensor]:
    return tensors_in(value)


def _nbytes(tensor: torch.Tensor) -> int:
    try:
        return int(tensor.numel()) * tensor.element_size()
    except (RuntimeError, TypeError):  # a tensor without a plain size (nested, sparse)
        return 0


# -- reduction geometry: (elements folded per output, along the contiguous dimension?) ---------
Geometry = tuple[int, bool]
_GEOMETRY: dict[str, Any] = {}


def register_geometry(rule: Any, *names: str) -> None:
    """Declare how to read the reduction geometry of aten ops from their arguments."""
    for name in names:
        _GEOMETRY[name] = rule


def _dim_size(tensor: torch.Tensor, dim: Any) -> Geometry:
    """Softmax-like: a row along `dim`; contiguous when `dim` is the last dimension."""
    d = int(dim) % max(tensor.dim(), 1)
    return int(tensor.shape[d]) if tensor.dim() else 1, d == tensor.dim() - 1


def _softmax(args: tuple, kwargs: dict, inputs: list, outputs: list) -> Geometry:
    return _dim_size(args[0], args[1])


def _softmax_backward(args: tuple, kwargs: dict, inputs: list, outputs: list) -> Geometry:
    return _dim_size(args[1], args[2])


def _layer_norm(args: tuple, kwargs: dict, inputs: list, outputs: list) -> Geometry:
    shape = args[1] if not isinstance(args[1], torch.Tensor) else args[2]
    return max(int(torch.Size(shape).numel()), 1), True


def _channel_norm(args: tuple, kwargs: dict, inputs: list, outputs: list) -> Geometry:
    """Batch norm: every element of a channel (N x spatial) per channel statistic."""
    x = args[0] if isinstance(args[0], torch.Tensor) else inputs[0]
    channels = int(x.shape[1]) if x.dim() > 1 else 1
    return max(int(x.numel()) // max(channels, 1), 1), x.dim() <= 1


def _folded(args: tuple, kwargs: dict, inputs: list, outputs: list) -> Geometry:
    """Generic TensorIterator reduction: input elements / output elements; contiguous when the
    reduced dimensions include the last one (or all of them)."""
    x = max(inputs, key=lambda t: int(t.numel()), default=None)
    if x is None:
        return 1, True
    smallest = min((int(t.numel()) for t in outputs), default=1)
    folded = max(int(x.numel()) // max(smallest, 1), 1)
    dims = args[1] if len(args) > 1 and isinstance(args[1], (list, tuple, int)) else kwargs.get("dim")
    if dims is None or dims == [] or x.dim() == 0:
        return folded, True
    dims = [dims] if isinstance(dims, int) else list(dims)
    return folded, any(int(d) % x.dim() == x.dim() - 1 for d in dims if isinstance(d, int))


register_geometry(_softmax, "_softmax", "_log_softmax")
register_geometry(_softmax_backward, "_softmax_backward_data", "_log_softmax_backward_data")
register_geometry(_layer_norm, "native_layer_norm", "native_layer_norm_backward")
register_geometry(
    _channel_norm, "native_batch_norm", "native_batch_norm_backward", "_native_batch_norm_legit",
    "_native_batch_norm_legit_functional", "_native_batch_norm_legit_no_training",
    "cudnn_batch_norm", "cudnn_batch_norm_backward",
)


def reduction_geometry(name: str, args: tuple, kwargs: dict, inputs: list, outputs: list) -> Geometry:
    rule = _GEOMETRY.get(name, _folded)
    try:
        folded, inner = rule(args, kwargs, inputs, outputs)
    except Exception:  # noqa: BLE001 - an unusual signature: one output per input element
        return 1, True
    return max(int(folded), 1), bool(inner)


def _flops(func: Any, args: tuple, kwargs: dict, out: Any) -> float | None:
    counter = FLOP_REGISTRY.get(func.overloadpacket)
    if counter is None:
        return None
    try:
        if getattr(counter, "__code__", None) is _SHAPE_WRAPPER_CODE:
            # torch's `shape_wrapper`: the formula of every tensor's shape (a pytree map of
            # the arguments and outputs, done here without the pytree where it is plain)
            formula = counter.__wrapped__
            return float(formula(*_shapes(args), out_shape=_shapes(out), **_shapes(kwargs)))
        return float(counter(*args, **kwargs, out_val=out))
    except Exception:  # noqa: BLE001 - an unusual signature: fall back to the elementwise cost
        return None


def _shapes(value: Any) -> Any:
    """`tree_map(flop_counter.get_shape, value)`: every tensor replaced by its shape, plain
    tuples, lists and dicts walked here, any other container handed to the pytree."""
    kind = type(value)
    if kind in _KEY_TENSORS:
        return value.shape
    if kind in _KEY_VALUES:
        return value  # a pytree leaf that is no tensor: get_shape returns it
    if kind is tuple:
        return tuple([_shapes(item) for item in value])
    if kind is list:
        return [_shapes(item) for item in value]
    if kind is dict:
        return {name: _shapes(item) for name, item in value.items()}
    return tree_map(_get_shape, value)


def op_cost(
    func: Any,
    args: tuple,
    kwargs: dict,
    out: Any,
    *,
    inputs: list[torch.Tensor] | None = None,
    outputs: list[torch.Tensor] | None = None,
) -> OpCost | None:
    """The cost of one device op (None: the op launches no kernel). `inputs` / `outputs`: the
    tensors of (args, kwargs) and of `out`, where the caller has them flattened already."""
    name = func.overloadpacket.__name__
    if not launches_kernel(func):
        return None
    inputs = [t for t in (_tensors((args, kwargs)) if inputs is None else inputs) if is_meta(t)]
    outputs = [t for t in (_tensors(out) if outputs is None else outputs) if is_meta(t)]
    return meta_op_cost(func, name, family_of(name), args, kwargs, out, inputs, outputs)


def launches_kernel(func: Any) -> bool:
    """Whether the op launches a kernel at all (`op_cost` is None otherwise): not a view, not
    one of NO_KERNEL."""
    return func.overloadpacket.__name__ not in NO_KERNEL and not getattr(func, "is_view", False)


def _bytes_of(tensors: list[torch.Tensor]) -> int:
    """sum(map(_nbytes, tensors)), in one pass where every tensor has a plain size."""
    try:
        return sum([int(t.numel()) * t.element_size() for t in tensors])
    except (RuntimeError, TypeError):
        return sum(map(_nbytes, tensors))


def meta_op_cost(
    func: Any,
    name: str,
    family: str,
    args: tuple,
    kwargs: dict,
    out: Any,
    inputs: list[torch.Tensor],
    outputs: list[torch.Tensor],
) -> OpCost:
    """`op_cost` of an op that launches a kernel (`launches_kernel`), its op packet's `name` and
    `family` and its device (meta) `inputs` / `outputs` already known: the observer's hot path
    (utilization.observer), the one computation `op_cost` runs too."""
    moved = _bytes_of(inputs) + _bytes_of(outputs)
    if family == FOREACH and not outputs:  # in-place foreach: it writes what it reads
        written = _tensors(args[0]) if args else []
        moved += sum(_nbytes(t) for t in written if is_meta(t))
    elif not outputs and inputs:  # an in-place op writes its first argument
        moved += _nbytes(inputs[0])
    reference = outputs or inputs
    work = max((int(t.numel()) for t in reference), default=0)
    if family == FOREACH:
        work = sum(int(t.numel()) for t in (_tensors(args[0]) if args else reference))
    flops = _flops(func, args, kwargs, out) if family in (GEMM, CONV, ATTENTION) else None
    if flops is None:
        flops = float(work)
    dtype = _DTYPES.get(reference[0].dtype, "other") if reference else "other"
    tensors = len(_tensors(args[0])) if family == FOREACH and args else 1
    reduced, inner = (
        reduction_geometry(name, args, kwargs, inputs, outputs) if family == REDUCTION else (1, True)
    )
    return OpCost(name, family, flops, moved, work, dtype, max(tensors, 1), reduced, inner)


class _NotKeyable(Exception):
    pass


_KEY_VALUES = frozenset({int, float, bool, str, complex, type(None), torch.dtype, torch.device,
                         torch.layout, torch.memory_format})
_KEY_TENSORS = frozenset({torch.Tensor, torch.nn.Parameter})


def op_cost_key(func: Any, args: tuple, kwargs: dict, out: Any) -> tuple | None:
    """A key that determines `op_cost`'s result for a call whose `inputs` / `outputs` are
    derived from its arguments and outputs the same way every time: the op, and for every
    argument and output its container structure, plain values, and each tensor's type, true
    device (meta or not), dtype, shape and strides (all that the FLOP formulas, byte counts and
    reduction geometry read). None: a value it cannot key (a tensor subclass, a non-strided
    tensor, an object), to be costed afresh."""
    parts: list = [func]
    try:
        _key_of((args, kwargs, out), parts)
    except _NotKeyable:
        return None
    return tuple(parts)


def _key_of(value: Any, parts: list) -> None:
    kind = type(value)
    if kind in _KEY_TENSORS:
        if value.layout is not torch.strided:
            raise _NotKeyable
        parts.append((kind, value.is_meta, value.dtype, tuple(value.shape), value.stride()))
    elif kind is tuple or kind is list:
        parts.append((kind, len(value)))
        for item in value:
            _key_of(item, parts)
    elif kind is dict:
        parts.append((dict, tuple(value)))
        for item in value.values():
            _key_of(item, parts)
    elif kind in _KEY_VALUES:
        parts.append((kind, value))
    else:
        raise _NotKeyable

