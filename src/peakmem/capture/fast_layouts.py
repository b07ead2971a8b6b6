"""Output layouts of common ops computed directly, without the op's meta kernel (issue 14).

Many aten meta kernels are Python (torch._refs, torch._decomp, torch._meta_registrations) and
cost 0.1 to 18 ms per call; the meta cache (capture/meta_cache.py) runs each once per distinct
call, but every differently-shaped parameter or activation of a new model is a new call. For
the ops below the output layout is a pure function of the input layouts in a narrow, plainly
checked case, and `fast_layout(func, args, kwargs)` makes the outputs itself (a few
microseconds); anything outside that case returns DECLINE and the op's own meta kernel runs.

The case is kept conservative: every tensor argument a plain strided meta tensor (no subclass,
no conj/neg bit) of a floating dtype (float16, bfloat16, float32, float64), canonically
contiguous (the strides `torch.empty(shape)` gives, so no size-1-dimension stride ambiguity,
no overlap, no channels_last), with at least one element; the tensors an op combines have one
shape and one dtype (no broadcasting, no type promotion); scalars are ints, floats or bools
(never complex), and values a kernel checks (elu's alpha with `is_result`, dropout's p, a
softmax dim) are checked here the same way or declined. Outputs are fresh contiguous meta
tensors, one storage each, as the meta kernels make them.

The elementwise rules (and dropout's backward, PReLU) also take "ordered" strided inputs
(branch s1): slices of a wider tensor (a concatenation's gradient), stepped views and
expansions (a mean's gradient), whose strides TensorIterator's and the Python refs'
output-layout sort leaves in logical order, so the output is contiguous (_row_major_order).
Factories (empty, zeros, ones, full, rand, randn, scalar_tensor) answer on the meta device
only; `_to_copy` and the *_like factories with the meta device's options.

Branch w1 widens four families past that case (sections at the end of the file): add / sub /
mul / div.Tensor of float32 / float64 tensors that broadcast, in any layouts, and of a tensor
with a Python number (these ops' meta kernels are torch._refs: the rules follow
torch._prims_common's elementwise output strides, not TensorIterator's C++ ones); cat of
strided inputs (compute_output_memory_format); stack. They are held to the kernels by
tests/capture/test_fast_layouts_strided.py (seeded random calls, thousands per op).

Identity with the meta kernels: tests/capture/test_fast_layouts.py compares every rule with
the op's own meta kernel over random shapes, strides, dtypes and scalars (hypothesis): each
output's shape, strides, storage offset, dtype, storage size, view flag and storage sharing,
and that the meta kernel does not raise where a rule answers.

Registry: FAST_LAYOUTS maps an op overload to its rule; a rule returns the outputs or DECLINE.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

aten = torch.ops.aten

DECLINE: Any = object()
"""A rule's answer when the call is outside its case: the op's own meta kernel must run."""

_FLOATS = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64})
_TENSORS = (torch.Tensor, torch.nn.Parameter)
_NUMBERS = (int, float, bool)
_STRIDED = torch.strided

Rule = Callable[[tuple, dict], Any]
FAST_LAYOUTS: dict[Any, Rule] = {}
"""op overload -> rule(args, kwargs): its outputs, or DECLINE."""


def _arity_checked(func: Any, rule: Rule) -> Rule:
    """`rule` for calls that give func's schema a valid argument count (positional arguments
    between the required and all, keyword arguments only the keyword-only ones)."""
    positional = [arg for arg in func._schema.arguments if not arg.kwarg_only]
    fewest = sum(1 for arg in positional if not arg.has_default_value())
    most = len(positional)
    keywords = frozenset(arg.name for arg in func._schema.arguments if arg.kwarg_only)

    def checked(args: tuple, kwargs: dict) -> Any:
        if not fewest <= len(args) <= most or any(name not in keywords for name in kwargs):
            return DECLINE
        return rule(args, kwargs)

    return checked


def register(funcs: Any, rule: Rule) -> None:
    """Make `rule` the fast layout of each op overload in `funcs` (one or an iterable)."""
    for func in (funcs,) if isinstance(funcs, torch._ops.OpOverload) else funcs:
        FAST_LAYOUTS[func] = _arity_checked(func, rule)


def fast_layout(func: Any, args: tuple, kwargs: dict) -> Any:
    """func's outputs on these arguments made directly, or DECLINE."""
    rule = FAST_LAYOUTS.get(func)
    if rule is None:
        return DECLINE
    return rule(args, kwargs)


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The strides torch.empty(shape) gives (a size-0 or size-1 dimension counts as 1)."""
    strides = []
    step = 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def _strided_meta(value: Any, dtypes: frozenset) -> bool:
    """A non-empty plain strided meta tensor of one of `dtypes` (no conj / neg bit)."""
    return (
        type(value) in _TENSORS
        and value.is_meta
        and value.layout is _STRIDED
        and value.dtype in dtypes
        and not value.is_conj()
        and not value.is_neg()
        and value.numel() != 0
    )


def _plain(value: Any, dtypes: frozenset = _FLOATS) -> bool:
    """A canonically contiguous, non-empty plain strided meta tensor of one of `dtypes`."""
    if not _strided_meta(value, dtypes) or not value.is_contiguous():
        return False
    shape = value.shape
    # contiguous and no size-1 dimension: the canonical strides (a size-1 dimension's stride
    # is free in is_contiguous)
    return 1 not in shape or value.stride() == contiguous_strides(tuple(shape))


def _plain_any_dtype(value: Any) -> bool:
    return _plain(value, _ANY_DTYPE)


_ANY_DTYPE = frozenset({
    torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.bool, torch.uint8,
    torch.int8, torch.int16, torch.int32, torch.int64,
})


_META = torch.device("meta")
_DEVICE = type(_META)  # torch.device itself (a capture replaces the name torch.device)
_BOOL = frozenset({torch.bool})


def _new(shape: tuple[int, ...], dtype: torch.dtype,
         strides: tuple[int, ...] | None = None) -> torch.Tensor:
    """A fresh contiguous meta tensor (`strides`: its contiguous strides when known)."""
    if strides is None:
        strides = contiguous_strides(shape)
    return torch.empty_strided(shape, strides, dtype=dtype, device=_META)


def _new_like(tensor: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A fresh tensor of a plain (canonically contiguous) tensor's layout."""
    return torch.empty_strided(tuple(tensor.shape), tensor.stride(),
                               dtype=tensor.dtype if dtype is None else dtype, device=_META)


def _scalar(value: Any) -> bool:
    return type(value) in _NUMBERS


# --- pointwise ops: same shape, same dtype, contiguous in and out ---------------------------


_APPROXIMATE = ("none", "tanh")  # gelu's approximate: the only string argument of these ops


def _ordered(value: Any, dtypes: frozenset = _FLOATS) -> bool:
    """A non-empty plain strided meta tensor of one of `dtypes` whose strides the elementwise
    output-layout sort would leave in logical order (see _row_major_order): a canonically
    contiguous tensor, or a slice of one along any dimensions, a stepped view, an expansion
    (stride 0) of one."""
    if not _strided_meta(value, dtypes):
        return False
    return _row_major_order(tuple(value.shape), value.stride())


def _row_major_order(shape: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    """No pair of dimensions that TensorIterator's reorder_dimensions (and
    torch._prims_common.compute_elementwise_output_logical_to_physical_perm, the Python
    refs') would swap: for dimensions b < a with non-zero strides, stride[a] < stride[b], or
    equal strides with size[a] <= size[b]. The sort only swaps on such a vote, so with every
    operand of one shape ordered so the output's permutation is the identity and the output
    contiguous; ordered tensors that are channels_last-contiguous or dense are contiguous too
    (their fast paths give the same)."""
    for a in range(1, len(shape)):
        stride_a = strides[a]
        if stride_a == 0:
            continue
        for b in range(a):
            stride_b = strides[b]
            if stride_b == 0:
                continue
            if stride_a > stride_b or (stride_a == stride_b and shape[a] > shape[b]):
                return False
    return True


def _same_layout(args: tuple, kwargs: dict) -> torch.Tensor | None:
    """The first tensor argument when every tensor argument is plain or ordered (_ordered)
    with one shape and dtype, and every other argument a number, gelu's approximate or None."""
    first = None
    for value in (*args, *kwargs.values()):
        if type(value) in _TENSORS:
            if not (_plain(value) or _ordered(value)):
                return None
            if first is None:
                first = value
            elif value.dtype != first.dtype or value.shape != first.shape:
                return None
        elif not (value is None or value in _APPROXIMATE or _scalar(value)):
            return None
    return first


def _pointwise(guard: Callable[[tuple, dict], bool] | None = None) -> Rule:
    """An elementwise op of one output: contiguous, of its inputs' shape and dtype."""
    def rule(args: tuple, kwargs: dict) -> Any:
        first = _same_layout(args, kwargs)
        if first is None or (guard is not None and not guard(args, kwargs)):
            return DECLINE
        return _new(tuple(first.shape), first.dtype)

    return rule


def _plain_pointwise(guard: Callable[[tuple, dict], bool] | None = None) -> Rule:
    """An op whose output follows a plain (canonically contiguous) input's layout only."""
    def rule(args: tuple, kwargs: dict) -> Any:
        first = _same_layout(args, kwargs)
        if first is None or (guard is not None and not guard(args, kwargs)):
            return DECLINE
        if not all(_plain(value) for value in (*args, *kwargs.values())
                   if type(value) in _TENSORS):
            return DECLINE
        return _new_like(first)

    return rule


def _arg(args: tuple, kwargs: dict, index: int, name: str) -> Any:
    return args[index] if len(args) > index else kwargs.get(name)


def _elu_backward_guard(args: tuple, kwargs: dict) -> bool:
    # elu_backward(grad_output, alpha, scale, input_scale, is_result, self_or_result):
    # with is_result a negative alpha is refused by the kernel
    alpha = _arg(args, kwargs, 1, "alpha")
    is_result = _arg(args, kwargs, 4, "is_result")
    return type(is_result) is bool and _scalar(alpha) and (not is_result or alpha >= 0)


def _leaky_relu_backward_guard(args: tuple, kwargs: dict) -> bool:
    # leaky_relu_backward(grad_output, self, negative_slope, self_is_result)
    slope = _arg(args, kwargs, 2, "negative_slope")
    is_result = _arg(args, kwargs, 3, "self_is_result")
    return type(is_result) is bool and _scalar(slope) and (not is_result or slope > 0)


def _two_tensors(args: tuple, kwargs: dict) -> bool:
    """A binary op's second operand is a tensor (shape checked by _same_layout), not a scalar
    wrapped by the caller."""
    return len(args) >= 2 and type(args[1]) in _TENSORS


_UNARY = (
    aten.relu.default, aten.elu.default, aten.leaky_relu.default, aten.gelu.default,
    aten.silu.default, aten.tanh.default, aten.sigmoid.default, aten.hardtanh.default,
    aten.hardswish.default, aten.hardsigmoid.default, aten.mish.default, aten.softplus.default,
    aten.neg.default, aten.abs.default, aten.exp.default, aten.sqrt.default, aten.rsqrt.default,
    aten.reciprocal.default, aten.cos.default, aten.sin.default,  # (cos, sin: rotary positions)
    aten.add.Scalar, aten.sub.Scalar, aten.mul.Scalar, aten.div.Scalar,
)
_BINARY = (
    aten.add.Tensor, aten.sub.Tensor, aten.mul.Tensor, aten.div.Tensor,
    aten.gelu_backward.default, aten.silu_backward.default, aten.tanh_backward.default,
    aten.sigmoid_backward.default, aten.threshold_backward.default,
    aten.hardtanh_backward.default, aten.hardswish_backward.default,
    aten.hardsigmoid_backward.default, aten.mish_backward.default,
    aten.softplus_backward.default,
)

register(_UNARY, _pointwise())
register(_BINARY, _pointwise(_two_tensors))
register(aten.elu_backward.default, _pointwise(_elu_backward_guard))


def _pow_tensor_scalar(args: tuple, kwargs: dict) -> Any:
    """pow.Tensor_Scalar(self, exponent). Its meta kernel (torch._refs.pow) returns
    `self.clone()` for an exponent equal to 1 (1, 1.0, True): preserve_format keeps the strides
    of an input that is non-overlapping and dense, a size-1 dimension's stride included (a
    (1, 1) tensor of strides (5, 1) keeps (5, 1)), and makes an ordered input that is not dense
    contiguous; any other exponent is elementwise, contiguous out."""
    first = _same_layout(args, kwargs)
    if first is None:
        return DECLINE
    if _arg(args, kwargs, 1, "exponent") == 1 and _dense(tuple(first.shape), first.stride()):
        return _new_like(first)
    return _new(tuple(first.shape), first.dtype)


def _dense(shape: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    """Non-overlapping and dense (c10's `is_non_overlapping_and_dense`): the dimensions of size
    2 or more, ordered by stride, step through every element once (a size-1 dimension's stride
    is free)."""
    expected = 1
    pairs = zip(shape, strides, strict=True)
    for size, stride in sorted((pair for pair in pairs if pair[0] != 1), key=lambda pair: pair[1]):
        if stride != expected:
            return False
        expected *= size
    return True


register(aten.pow.Tensor_Scalar, _pow_tensor_scalar)
register(aten.leaky_relu_backward.default, _pointwise(_leaky_relu_backward_guard))


def _clone_guard(args: tuple, kwargs: dict) -> bool:
    return kwargs.get("memory_format") in (None, torch.preserve_format, torch.contiguous_format)


register(aten.clone.default, _plain_pointwise(_clone_guard))


def _native_dropout(args: tuple, kwargs: dict) -> Any:
    # native_dropout(input, p, train) -> (output, bool mask)
    if len(args) != 3 or kwargs or not _plain(args[0]):
        return DECLINE
    _, p, train = args
    if train is not True or type(p) is not float or not 0.0 < p < 1.0:
        return DECLINE
    return (_new_like(args[0]), _new_like(args[0], torch.bool))


def _native_dropout_backward(args: tuple, kwargs: dict) -> Any:
    # native_dropout_backward(grad_output, mask, scale)
    if len(args) != 3 or kwargs:
        return DECLINE
    grad, mask, scale = args
    if not ((_plain(grad) or _ordered(grad)) and _scalar(scale)):
        return DECLINE
    if not (_plain(mask, _BOOL) or _ordered(mask, _BOOL)) or mask.shape != grad.shape:
        return DECLINE
    return _new(tuple(grad.shape), grad.dtype)


register(aten.native_dropout.default, _native_dropout)
register(aten.native_dropout_backward.default, _native_dropout_backward)


# --- factories like an input ------------------------------------------------------------------


_OPTION_VALUES: dict[str, tuple] = {
    # a factory's keyword options, the values under which its output is a plain meta tensor
    "layout": (None, torch.strided),
    "device": (None, _META),
    "pin_memory": (None, False),
    "memory_format": (None, torch.preserve_format, torch.contiguous_format),
}


def _options_ok(kwargs: dict, allowed: tuple[str, ...], dtypes: frozenset) -> bool:
    """Every keyword one of `allowed` with a value _OPTION_VALUES lists (dtype: None or one
    of `dtypes`; device: the meta device as torch.device("meta"))."""
    for name, value in kwargs.items():
        if name not in allowed:
            return False
        if name == "dtype":
            if value is not None and value not in dtypes:
                return False
        elif name == "device":
            if value is not None and not (type(value) is _DEVICE and value == _META):
                return False
        elif not any(value is ok for ok in _OPTION_VALUES[name]):
            return False
    return True


_LIKE_OPTIONS = ("dtype", "layout", "device", "pin_memory", "memory_format")


def _like(args: tuple, kwargs: dict) -> Any:
    # zeros_like / ones_like / empty_like(self, *, dtype, layout, device, pin_memory,
    # memory_format): strided on the meta device, unpinned, preserve or contiguous format;
    # the output has the plain input's (contiguous) strides, in dtype when given
    if len(args) != 1 or not _plain_any_dtype(args[0]):
        return DECLINE
    if not _options_ok(kwargs, _LIKE_OPTIONS, _ANY_DTYPE):
        return DECLINE
    return _new_like(args[0], kwargs.get("dtype"))


register((aten.zeros_like.default, aten.ones_like.default, aten.empty_like.default), _like)


# --- foreach ops (the optimizers') --------------------------------------------------------------


def _foreach_lists(args: tuple, kwargs: dict, count: int) -> list[list] | None:
    """The first `count` arguments as tensor lists of one length (>= 1) whose tensors at each
    index are plain, of one shape and dtype, and share no storage unless they are the same
    tensor."""
    if len(args) < count:
        return None
    lists = args[:count]
    if any(type(tensors) not in (list, tuple) for tensors in lists):
        return None
    length = len(lists[0])
    if length == 0 or any(len(tensors) != length for tensors in lists):
        return None
    for index in range(length):
        first = lists[0][index]
        if not _plain(first):
            return None
        layout = (first.shape, first.dtype)
        storages = {id(first.untyped_storage()): first}
        for tensors in lists[1:]:
            tensor = tensors[index]
            if tensor is first:
                continue
            if not _plain(tensor) or (tensor.shape, tensor.dtype) != layout:
                return None
            storage = id(tensor.untyped_storage())
            if storages.setdefault(storage, tensor) is not tensor:
                return None
    return [list(tensors) for tensors in lists]


def _foreach_extras_ok(extras: tuple, kwargs: dict, length: int) -> bool:
    """The non-list arguments: numbers, or lists of `length` numbers (ScalarList)."""
    for value in (*extras, *kwargs.values()):
        if type(value) in (list, tuple):
            if len(value) != length or not all(type(item) in (int, float) for item in value):
                return False
        elif type(value) not in (int, float):
            return False
    return True


def _foreach_in_place(count: int) -> Rule:
    """An in-place foreach op over `count` tensor lists (no return): its meta kernel only
    checks the arguments, which pass in this case."""

    def rule(args: tuple, kwargs: dict) -> Any:
        lists = _foreach_lists(args, kwargs, count)
        if lists is None or not _foreach_extras_ok(args[count:], kwargs, len(lists[0])):
            return DECLINE
        return None

    return rule


def _foreach_out_of_place(count: int) -> Rule:
    """An out-of-place foreach op over `count` tensor lists: a fresh tensor per index."""

    def rule(args: tuple, kwargs: dict) -> Any:
        lists = _foreach_lists(args, kwargs, count)
        if lists is None or not _foreach_extras_ok(args[count:], kwargs, len(lists[0])):
            return DECLINE
        return [_new_like(tensor) for tensor in lists[0]]

    return rule


_FOREACH_IN_PLACE = {
    aten._foreach_add_.Scalar: 1, aten._foreach_add_.ScalarList: 1, aten._foreach_add_.List: 2,
    aten._foreach_sub_.Scalar: 1, aten._foreach_sub_.ScalarList: 1, aten._foreach_sub_.List: 2,
    aten._foreach_mul_.Scalar: 1, aten._foreach_mul_.ScalarList: 1, aten._foreach_mul_.List: 2,
    aten._foreach_div_.Scalar: 1, aten._foreach_div_.ScalarList: 1, aten._foreach_div_.List: 2,
    aten._foreach_addcdiv_.Scalar: 3, aten._foreach_addcdiv_.ScalarList: 3,
    aten._foreach_addcmul_.Scalar: 3, aten._foreach_addcmul_.ScalarList: 3,
    aten._foreach_lerp_.Scalar: 2, aten._foreach_lerp_.ScalarList: 2,
    aten._foreach_lerp_.List: 3,
}
_FOREACH_OUT_OF_PLACE = {
    aten._foreach_sqrt.default: 1, aten._foreach_neg.default: 1,
    aten._foreach_add.Scalar: 1, aten._foreach_add.List: 2,
    aten._foreach_mul.Scalar: 1, aten._foreach_mul.List: 2,
    aten._foreach_div.Scalar: 1, aten._foreach_div.ScalarList: 1, aten._foreach_div.List: 2,
}
for _op, _count in _FOREACH_IN_PLACE.items():
    register(_op, _foreach_in_place(_count))
for _op, _count in _FOREACH_OUT_OF_PLACE.items():
    register(_op, _foreach_out_of_place(_count))


# --- normalization, softmax, matrix products ------------------------------------------------------


def _native_batch_norm(args: tuple, kwargs: dict) -> Any:
    # native_batch_norm(input, weight, bias, running_mean, running_var, training, momentum,
    # eps) -> (output, save_mean, save_invstd); the saved statistics in the compute dtype
    if len(args) != 8 or kwargs:
        return DECLINE
    x, weight, bias, running_mean, running_var, training, momentum, eps = args
    if not _plain(x) or x.dim() < 2 or type(training) is not bool:
        return DECLINE
    if not (_scalar(momentum) and _scalar(eps)):
        return DECLINE
    channels = x.shape[1]
    stats_dtype = _compute_dtype(x.dtype)
    for vector in (weight, bias, running_mean, running_var):
        if vector is None:
            continue
        if not _plain(vector) or tuple(vector.shape) != (channels,):
            return DECLINE
        if vector.dtype not in (x.dtype, stats_dtype):
            return DECLINE
    if not training and (running_mean is None or running_var is None):
        return DECLINE
    if training and running_var is not None and x.numel() == channels:
        return DECLINE  # one value per channel: the unbiased variance divides by zero
    return (_new_like(x), _new((channels,), stats_dtype),
            _new((channels,), stats_dtype))


def _native_batch_norm_backward(args: tuple, kwargs: dict) -> Any:
    # native_batch_norm_backward(grad_out, input, weight, running_mean, running_var, save_mean,
    # save_invstd, train, eps, output_mask) -> (grad_input, grad_weight?, grad_bias?)
    if len(args) != 10 or kwargs:
        return DECLINE
    grad, x, weight, running_mean, running_var, save_mean, save_invstd, train, eps, mask = args
    if not (_plain(grad) and _plain(x)) or x.dim() < 2 or grad.shape != x.shape:
        return DECLINE
    if grad.dtype != x.dtype or type(train) is not bool or not _scalar(eps):
        return DECLINE
    if type(mask) not in (list, tuple) or len(mask) != 3 or any(type(m) is not bool for m in mask):
        return DECLINE
    channels = x.shape[1]
    stats_dtype = _compute_dtype(x.dtype)
    for vector in (weight, running_mean, running_var, save_mean, save_invstd):
        if vector is None:
            continue
        if not _plain(vector) or tuple(vector.shape) != (channels,):
            return DECLINE
        if vector.dtype not in (x.dtype, stats_dtype):
            return DECLINE
    if train and (save_mean is None or save_invstd is None):
        return DECLINE
    if not train and (running_mean is None or running_var is None):
        return DECLINE
    weight_dtype = weight.dtype if weight is not None else x.dtype
    return (  # the input's gradient is made whatever output_mask[0] says
        _new_like(x),
        _new((channels,), weight_dtype) if mask[1] else None,
        _new((channels,), weight_dtype) if mask[2] else None,
    )


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


register(aten.native_batch_norm.default, _native_batch_norm)
register(aten.native_batch_norm_backward.default, _native_batch_norm_backward)


def _dim_ok(dim: Any, rank: int) -> bool:
    return type(dim) is int and -rank <= dim < rank


def _softmax(args: tuple, kwargs: dict) -> Any:
    # _softmax / _log_softmax(self, dim, half_to_float)
    if len(args) != 3 or kwargs or not _plain(args[0]):
        return DECLINE
    x, dim, half_to_float = args
    if half_to_float is not False or x.dim() == 0 or not _dim_ok(dim, x.dim()):
        return DECLINE
    return _new_like(x)


def _softmax_backward(args: tuple, kwargs: dict) -> Any:
    # _softmax_backward_data / _log_softmax_backward_data(grad_output, output, dim, input_dtype)
    if len(args) != 4 or kwargs:
        return DECLINE
    grad, out, dim, input_dtype = args
    if not (_plain(grad) and _plain(out)) or grad.shape != out.shape or grad.dtype != out.dtype:
        return DECLINE
    if input_dtype != grad.dtype or grad.dim() == 0 or not _dim_ok(dim, grad.dim()):
        return DECLINE
    return _new_like(grad)


register((aten._softmax.default, aten._log_softmax.default), _softmax)
register((aten._softmax_backward_data.default, aten._log_softmax_backward_data.default),
         _softmax_backward)


def _matrix(value: Any, dtype: torch.dtype | None = None) -> bool:
    """A 2-d non-empty plain meta tensor, contiguous or the transpose of a contiguous one."""
    if type(value) not in _TENSORS or value.dim() != 2:
        return False
    if not value.is_meta or value.layout is not _STRIDED or value.is_conj() or value.is_neg():
        return False
    if value.dtype not in _FLOATS or (dtype is not None and value.dtype != dtype):
        return False
    rows, cols = value.shape
    if rows == 0 or cols == 0:
        return False
    stride = value.stride()
    if stride == contiguous_strides((rows, cols)):
        return True
    return rows > 1 and cols > 1 and stride == (1, rows)  # a transposed contiguous matrix


def _mm(args: tuple, kwargs: dict) -> Any:
    # mm(self, mat2)
    if len(args) != 2 or kwargs or not _matrix(args[0]):
        return DECLINE
    a, b = args
    if not _matrix(b, a.dtype) or a.shape[1] != b.shape[0]:
        return DECLINE
    return _new((a.shape[0], b.shape[1]), a.dtype)


def _addmm(args: tuple, kwargs: dict) -> Any:
    # addmm(self, mat1, mat2, *, beta=1, alpha=1): self (n,) or (m, n)
    if len(args) != 3 or not _matrix(args[1]):
        return DECLINE
    bias, a, b = args
    if any(name not in ("beta", "alpha") or not _scalar(v) for name, v in kwargs.items()):
        return DECLINE
    if not _matrix(b, a.dtype) or a.shape[1] != b.shape[0]:
        return DECLINE
    shape = (a.shape[0], b.shape[1])
    if not _plain(bias) or bias.dtype != a.dtype or tuple(bias.shape) not in ((shape[1],), shape):
        return DECLINE
    return _new(shape, a.dtype)


register(aten.mm.default, _mm)
register(aten.addmm.default, _addmm)


# --- convolution and cat (branch r4) --------------------------------------------------------------


def _int_list(value: Any, length: int, least: int) -> bool:
    """A list or tuple of `length` ints, each at least `least` (no bools)."""
    return (type(value) in (list, tuple) and len(value) == length
            and all(type(item) is int and item >= least for item in value))


def _conv_output_shape(x: torch.Tensor, weight: torch.Tensor, stride: Any, padding: Any,
                       dilation: Any, transposed: Any, output_padding: Any,
                       groups: Any) -> tuple[int, ...] | None:
    """The output shape of a plain (not transposed) 1-3 d convolution of contiguous float
    tensors of one dtype, each spatial option given per dimension; None outside that case or
    where the kernel would raise (channels, kernel larger than the padded input, an empty
    output)."""
    rank = x.dim()
    if not 3 <= rank <= 5 or weight.dim() != rank or weight.dtype != x.dtype:
        return None
    if transposed is not False or type(groups) is not int or groups < 1:
        return None
    spatial = rank - 2
    if not (_int_list(stride, spatial, 1) and _int_list(padding, spatial, 0)
            and _int_list(dilation, spatial, 1) and _int_list(output_padding, spatial, 0)):
        return None
    if any(output_padding):
        return None
    out_channels = weight.shape[0]
    if weight.shape[1] * groups != x.shape[1] or out_channels % groups:
        return None
    shape = [x.shape[0], out_channels]
    for size, kernel, step, pad, spread in zip(
            x.shape[2:], weight.shape[2:], stride, padding, dilation, strict=True):
        reach = spread * (kernel - 1) + 1
        if size + 2 * pad < reach:
            return None
        shape.append((size + 2 * pad - reach) // step + 1)
    return tuple(shape)


def _convolution(args: tuple, kwargs: dict) -> Any:
    # convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding,
    # groups): the output contiguous in the input's dtype
    if len(args) != 9 or kwargs or not (_plain(args[0]) and _plain(args[1])):
        return DECLINE
    x, weight, bias, stride, padding, dilation, transposed, output_padding, groups = args
    shape = _conv_output_shape(x, weight, stride, padding, dilation, transposed,
                               output_padding, groups)
    if shape is None:
        return DECLINE
    if bias is not None and (not _plain(bias) or bias.dtype != x.dtype
                             or tuple(bias.shape) != (shape[1],)):
        return DECLINE
    return _new(shape, x.dtype)


def _convolution_backward(args: tuple, kwargs: dict) -> Any:
    # convolution_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation,
    # transposed, output_padding, groups, output_mask) -> (grad_input?, grad_weight?,
    # grad_bias?): contiguous (the inputs are), in grad_output's dtype
    if len(args) != 11 or kwargs:
        return DECLINE
    grad, x, weight, bias_sizes, stride, padding, dilation, transposed, output_padding, \
        groups, mask = args
    if not (_plain(grad) and _plain(x) and _plain(weight)) or grad.dtype != x.dtype:
        return DECLINE
    if type(mask) not in (list, tuple) or len(mask) != 3 or any(type(m) is not bool for m in mask):
        return DECLINE
    shape = _conv_output_shape(x, weight, stride, padding, dilation, transposed,
                               output_padding, groups)
    if shape is None or tuple(grad.shape) != shape:
        return DECLINE
    if mask[2] and not _int_list(bias_sizes, 1, 0):
        return DECLINE
    if bias_sizes is not None and not (_int_list(bias_sizes, 1, 0)
                                       and bias_sizes[0] == shape[1]):
        return DECLINE
    dtype = grad.dtype
    return (
        _new(tuple(x.shape), dtype) if mask[0] else None,
        _new(tuple(weight.shape), dtype) if mask[1] else None,
        _new((shape[1],), dtype) if mask[2] else None,
    )


register(aten.convolution.default, _convolution)
register(aten.convolution_backward.default, _convolution_backward)


def _cat(args: tuple, kwargs: dict) -> Any:
    # cat(tensors, dim=0): tensors of one rank (>= 1) and dtype, equal but along dim (integer
    # and bool tensors too: a decode loop's growing token ids, `cat((idx, next), dim=1)`)
    if kwargs or type(args[0]) not in (list, tuple) or not args[0]:
        return DECLINE
    tensors = args[0]
    dim = args[1] if len(args) > 1 else 0
    first = tensors[0]
    if not _plain(first, _ANY_DTYPE) or first.dim() == 0 or not _dim_ok(dim, first.dim()):
        return DECLINE
    dim %= first.dim()
    shape = list(first.shape)
    total = 0
    for tensor in tensors:
        if (not _plain(tensor, _ANY_DTYPE) or tensor.dtype != first.dtype
                or tensor.dim() != len(shape)):
            return DECLINE
        sizes = tensor.shape
        if any(sizes[d] != shape[d] for d in range(len(shape)) if d != dim):
            return DECLINE
        total += sizes[dim]
    shape[dim] = total
    return _new(tuple(shape), first.dtype)


register(aten.cat.default, _cat)


# --- nll_loss (branch r4) ------------------------------------------------------------------------

_REDUCTIONS = (0, 1, 2)  # none, mean, sum
_INDEX = frozenset({torch.int64})


def _nll_case(x: Any, target: Any, weight: Any, reduction: Any, ignore_index: Any) -> bool:
    """A batch of class scores (N, C) with int64 targets (N,), no or a (C,) weight of the
    scores' dtype, a known reduction and an int ignore_index."""
    if not (_plain(x) and x.dim() == 2 and _plain(target, _INDEX) and target.dim() == 1):
        return False
    if target.shape[0] != x.shape[0] or reduction not in _REDUCTIONS:
        return False
    if type(reduction) is not int or type(ignore_index) is not int:
        return False
    return weight is None or (_plain(weight) and weight.dtype == x.dtype
                              and tuple(weight.shape) == (x.shape[1],))


def _nll_loss_forward(args: tuple, kwargs: dict) -> Any:
    # nll_loss_forward(self, target, weight, reduction, ignore_index) -> (output, total_weight)
    if len(args) != 5 or kwargs or not _nll_case(*args):
        return DECLINE
    x, _, _, reduction, _ = args
    shape = (x.shape[0],) if reduction == 0 else ()
    return (_new(shape, x.dtype), _new((), x.dtype))


def _nll_loss_backward(args: tuple, kwargs: dict) -> Any:
    # nll_loss_backward(grad_output, self, target, weight, reduction, ignore_index,
    # total_weight) -> grad_input of self's layout
    if len(args) != 7 or kwargs:
        return DECLINE
    grad, x, target, weight, reduction, ignore_index, total_weight = args
    if not _nll_case(x, target, weight, reduction, ignore_index):
        return DECLINE
    shape = (x.shape[0],) if reduction == 0 else ()
    if not (_plain(grad) and grad.dtype == x.dtype and tuple(grad.shape) == shape):
        return DECLINE
    if not (_plain(total_weight) and total_weight.dtype == x.dtype and total_weight.dim() == 0):
        return DECLINE
    return _new_like(x)


register(aten.nll_loss_forward.default, _nll_loss_forward)
register(aten.nll_loss_backward.default, _nll_loss_backward)


# --- reductions over listed dimensions (branch r4) ------------------------------------------------


def _reduce_dims(args: tuple, kwargs: dict) -> Any:
    # mean.dim / sum.dim_IntList(self, dim, keepdim=False, *, dtype=None): a non-empty list
    # of distinct dimensions, the input's dtype; the output contiguous
    x = args[0]
    dim = args[1]
    keepdim = args[2] if len(args) > 2 else kwargs.get("keepdim", False)
    if not _plain(x) or x.dim() == 0 or type(keepdim) is not bool:
        return DECLINE
    if any(name not in ("keepdim", "dtype") for name in kwargs) or kwargs.get("dtype") is not None:
        return DECLINE
    if "keepdim" in kwargs and len(args) > 2:
        return DECLINE
    rank = x.dim()
    if type(dim) not in (list, tuple) or not dim or not all(_dim_ok(d, rank) for d in dim):
        return DECLINE
    reduced = {d % rank for d in dim}
    if len(reduced) != len(dim):
        return DECLINE
    if keepdim:
        shape = tuple(1 if d in reduced else size for d, size in enumerate(x.shape))
    else:
        shape = tuple(size for d, size in enumerate(x.shape) if d not in reduced)
    return _new(shape, x.dtype)


register((aten.mean.dim, aten.sum.dim_IntList), _reduce_dims)


# --- PReLU (branch s1) -----------------------------------------------------------------------------


def _prelu_case(x: Any, weight: Any) -> bool:
    """x ordered (_ordered), a weight of x's dtype that broadcasts to x's shape (PReLU's
    (C, 1, ..., 1) view of its (C,) or (1,) parameter) and is ordered itself."""
    if not ((_plain(x) or _ordered(x)) and _ordered(weight)) or weight.dtype != x.dtype:
        return False
    shape = tuple(x.shape)
    sizes = tuple(weight.shape)
    if len(sizes) > len(shape):
        return False
    trailing = shape[len(shape) - len(sizes):]
    return all(size in (1, full) for size, full in zip(sizes, trailing, strict=True))


def _prelu_kernel(args: tuple, kwargs: dict) -> Any:
    # _prelu_kernel(self, weight): elementwise, the output contiguous of self's shape
    if len(args) != 2 or kwargs or not _prelu_case(*args):
        return DECLINE
    return _new(tuple(args[0].shape), args[0].dtype)


def _prelu_kernel_backward(args: tuple, kwargs: dict) -> Any:
    # _prelu_kernel_backward(grad_output, self, weight) -> (grad_input, grad_weight), both of
    # self's shape (the weight's gradient is reduced afterwards by autograd's formula)
    if len(args) != 3 or kwargs:
        return DECLINE
    grad, x, weight = args
    if not _prelu_case(x, weight) or not (_plain(grad) or _ordered(grad)):
        return DECLINE
    if grad.shape != x.shape or grad.dtype != x.dtype:
        return DECLINE
    shape = tuple(x.shape)
    return (_new(shape, x.dtype), _new(shape, x.dtype))


register(aten._prelu_kernel.default, _prelu_kernel)
register(aten._prelu_kernel_backward.default, _prelu_kernel_backward)


# --- factories on the meta device, and copies (branch s1) ----------------------------------------

_FACTORY_OPTIONS = ("dtype", "layout", "device", "pin_memory")


def _sizes(value: Any) -> bool:
    return type(value) in (list, tuple) and all(type(size) is int and size >= 0
                                                for size in value)


def _factory(dtypes: frozenset, memory_format: bool = False) -> Rule:
    """empty / zeros / ones / rand / randn(size, *, dtype, layout, device, pin_memory): a
    contiguous meta tensor of `size` in dtype (the default dtype when None); only with the
    device given as the meta device (a host factory makes real values: its kernel runs)."""
    allowed = _FACTORY_OPTIONS + (("memory_format",) if memory_format else ())

    def rule(args: tuple, kwargs: dict) -> Any:
        if len(args) != 1 or not _sizes(args[0]) or kwargs.get("device") is None:
            return DECLINE
        if not _options_ok(kwargs, allowed, dtypes):
            return DECLINE
        if memory_format and kwargs.get("memory_format") is torch.preserve_format:
            return DECLINE  # empty refuses it
        dtype = kwargs.get("dtype")
        if dtype is None:
            dtype = torch.get_default_dtype()
        return _new(tuple(args[0]), dtype)

    return rule


register(aten.empty.memory_format, _factory(_ANY_DTYPE, memory_format=True))
register((aten.zeros.default, aten.ones.default), _factory(_ANY_DTYPE))
register((aten.rand.default, aten.randn.default), _factory(_FLOATS))


def _full(args: tuple, kwargs: dict) -> Any:
    # full(size, fill_value, *, dtype, ...): a float fill (the default dtype when dtype is
    # None) or an int / float fill with a floating dtype
    if len(args) != 2 or not _sizes(args[0]) or kwargs.get("device") is None:
        return DECLINE
    fill = args[1]
    dtype = kwargs.get("dtype")
    if not _options_ok(kwargs, _FACTORY_OPTIONS, _FLOATS):
        return DECLINE
    if type(fill) is not float and not (type(fill) is int and dtype is not None):
        return DECLINE
    return _new(tuple(args[0]), torch.get_default_dtype() if dtype is None else dtype)


def _scalar_tensor(args: tuple, kwargs: dict) -> Any:
    # scalar_tensor(s, *, dtype, ...): a 0-d meta tensor, the default dtype when None
    if len(args) != 1 or not _scalar(args[0]) or kwargs.get("device") is None:
        return DECLINE
    if not _options_ok(kwargs, _FACTORY_OPTIONS, _FLOATS):
        return DECLINE
    dtype = kwargs.get("dtype")
    return _new((), torch.get_default_dtype() if dtype is None else dtype)


register(aten.full.default, _full)
register(aten.scalar_tensor.default, _scalar_tensor)

_ARANGE_DTYPES = frozenset({torch.int64})
_ARANGE_BOUND = 1 << 52
"""Arguments of at most this size: the kernel's checks and length exact in any arithmetic."""


def _arange(args: tuple, kwargs: dict) -> Any:
    # arange(end) / arange(start, end) / arange(start, end, step), *, dtype, ...: with plain int
    # arguments (no bools) and dtype None or int64, torch._refs.arange's int64 iota of
    # (end - start + step - sign(step)) // step elements; a zero step or a bound on the wrong
    # side of start (the kernel raises), float arguments and other dtypes: the kernel
    if not args or len(args) > 3 or kwargs.get("device") is None:
        return DECLINE
    if any(type(value) is not int or abs(value) > _ARANGE_BOUND for value in args):
        return DECLINE
    if not _options_ok(kwargs, _FACTORY_OPTIONS, _ARANGE_DTYPES):
        return DECLINE
    start, end = (0, args[0]) if len(args) == 1 else args[:2]
    step = args[2] if len(args) == 3 else 1
    if step == 0 or (step > 0 and end < start) or (step < 0 and end > start):
        return DECLINE
    sign = 1 if step > 0 else -1
    return _new(((end - start + step - sign) // step,), torch.int64)


register((aten.arange.default, aten.arange.start, aten.arange.start_step), _arange)


_COPY_OPTIONS = ("dtype", "layout", "device", "pin_memory", "non_blocking", "memory_format")


def _to_copy(args: tuple, kwargs: dict) -> Any:
    # _to_copy(self, *, dtype, layout, device, pin_memory, non_blocking, memory_format): a plain
    # meta tensor copied on the meta device, its (contiguous) strides kept, in dtype if given
    if len(args) != 1 or not _plain_any_dtype(args[0]):
        return DECLINE
    options = {name: value for name, value in kwargs.items() if name != "non_blocking"}
    if type(kwargs.get("non_blocking", False)) is not bool:
        return DECLINE
    if not _options_ok(options, _COPY_OPTIONS, _ANY_DTYPE):
        return DECLINE
    return _new_like(args[0], kwargs.get("dtype"))


register(aten._to_copy.default, _to_copy)


# --- layer norm (branch s1) ------------------------------------------------------------------------


def _layer_norm_case(x: Any, normalized_shape: Any, weight: Any, bias: Any,
                     ordered: bool = False) -> bool:
    """A plain input (`ordered`: or one the elementwise output-layout sort leaves in logical
    order, _ordered) whose trailing dimensions are `normalized_shape` (a non-empty list of
    ints), and no or a plain weight / bias of the input's dtype and that shape."""
    if not (_plain(x) or (ordered and _ordered(x))):
        return False
    if type(normalized_shape) not in (list, tuple) or not normalized_shape:
        return False
    count = len(normalized_shape)
    if count > x.dim() or any(type(size) is not int for size in normalized_shape):
        return False
    if tuple(x.shape[x.dim() - count:]) != tuple(normalized_shape):
        return False
    return all(vector is None or (_plain(vector) and vector.dtype == x.dtype
                                  and tuple(vector.shape) == tuple(normalized_shape))
               for vector in (weight, bias))


def _layer_norm_stats_shape(x: torch.Tensor, count: int) -> tuple[int, ...]:
    return tuple(x.shape[:x.dim() - count]) + (1,) * count


def _native_layer_norm(args: tuple, kwargs: dict) -> Any:
    # native_layer_norm(input, normalized_shape, weight, bias, eps) -> (output, mean, rstd):
    # a contiguous output (the input's layout where it is plain; an ordered input, a slice such
    # as a decode loop's last position `x[:, -1:]`, whose size-1 dimension's stride changes
    # every step, also gives a contiguous one: the decomposition's elementwise ops), the
    # statistics (leading dims, 1, ..., 1) in the compute dtype
    if len(args) != 5 or kwargs:
        return DECLINE
    x, normalized_shape, weight, bias, eps = args
    if not _layer_norm_case(x, normalized_shape, weight, bias, ordered=True) \
            or not _scalar(eps):
        return DECLINE
    stats = _layer_norm_stats_shape(x, len(normalized_shape))
    dtype = _compute_dtype(x.dtype)
    return (_new(tuple(x.shape), x.dtype), _new(stats, dtype), _new(stats, dtype))


def _native_layer_norm_backward(args: tuple, kwargs: dict) -> Any:
    # native_layer_norm_backward(grad_out, input, normalized_shape, mean, rstd, weight, bias,
    # output_mask) -> (grad_input?, grad_weight?, grad_bias?): the weight's and bias's
    # gradients only where they are given and asked for
    if len(args) != 8 or kwargs:
        return DECLINE
    grad, x, normalized_shape, mean, rstd, weight, bias, mask = args
    if not _layer_norm_case(x, normalized_shape, weight, bias):
        return DECLINE
    if not _plain(grad) or grad.shape != x.shape or grad.dtype != x.dtype:
        return DECLINE
    if type(mask) not in (list, tuple) or len(mask) != 3 or any(type(m) is not bool for m in mask):
        return DECLINE
    stats = _layer_norm_stats_shape(x, len(normalized_shape))
    dtype = _compute_dtype(x.dtype)
    for saved in (mean, rstd):
        if not _plain(saved) or saved.dtype != dtype or tuple(saved.shape) != stats:
            return DECLINE
    shape = tuple(normalized_shape)
    return (
        _new_like(x) if mask[0] else None,
        _new(shape, x.dtype) if mask[1] and weight is not None else None,
        _new(shape, x.dtype) if mask[2] and bias is not None else None,
    )


register(aten.native_layer_norm.default, _native_layer_norm)
register(aten.native_layer_norm_backward.default, _native_layer_norm_backward)


# --- broadcasting binary ops: the Python refs' output layout (issue 14, branch w1) -----------
#
# The meta kernels of add / sub / mul / div.Tensor are Python (torch._refs through
# torch._meta_registrations): the operands broadcast by `expand` (_maybe_broadcast), then
# prims' elementwise meta takes its strides from
# torch._prims_common.compute_elementwise_output_strides. The rule below is that function on
# the expanded operands' strides, for float32 / float64 operands (their computation dtype:
# no conversion; float16 / bfloat16 compute in float32 through converted copies, declined).


def _broadcast_shape(shapes: list[tuple[int, ...]]) -> tuple[int, ...] | None:
    """The operands' broadcast shape, or None where they do not broadcast."""
    rank = max(len(shape) for shape in shapes)
    out = [1] * rank
    for shape in shapes:
        offset = rank - len(shape)
        for i, size in enumerate(shape):
            have = out[offset + i]
            if have == 1:
                out[offset + i] = size
            elif size not in (1, have):
                return None
    return tuple(out)


def _expanded_strides(sizes: tuple[int, ...], strides: tuple[int, ...],
                      shape: tuple[int, ...]) -> tuple[int, ...]:
    """An operand's strides after `expand(shape)` (inferExpandGeometry; an operand of `shape`
    is not expanded): an expanded dimension 0; a new leading dimension of size 1 the next
    dimension's size times its stride; a 0-dim operand all 0."""
    if sizes == shape:
        return strides
    rank = len(shape)
    if not sizes:
        return (0,) * rank
    offset = rank - len(sizes)
    out = [0] * rank
    for i in range(rank - 1, -1, -1):
        dim = i - offset
        if dim >= 0:
            size, stride = sizes[dim], strides[dim]
        else:
            size, stride = 1, shape[i + 1] * out[i + 1]
        out[i] = 0 if size != shape[i] else stride
    return tuple(out)


def _contiguous_like(shape: tuple[int, ...], strides: tuple[int, ...],
                     order: tuple[int, ...]) -> bool:
    """Size-1 dimensions skipped, the others nested in `order` (fastest first) from stride 1
    (_prims_common.is_contiguous / is_channels_last_contiguous_2d of a non-empty tensor)."""
    expected = 1
    for d in order:
        size = shape[d]
        if size == 1:
            continue
        if strides[d] != expected:
            return False
        expected *= size
    return True


def _elementwise_output_strides(shape: tuple[int, ...], operands: list[tuple]) -> tuple:
    """_prims_common.compute_elementwise_output_strides of operands of one non-empty `shape`
    (their strides `operands`): contiguous when all are contiguous and not all
    channels_last-contiguous, channels_last in the reverse case, else the dimensions
    insertion-sorted (compute_elementwise_output_logical_to_physical_perm: the first operand
    with non-zero strides in a pair orders it, the smaller stride faster; equal strides swap
    where the faster-placed dimension is the larger) and the output dense in that order."""
    rank = len(shape)
    if rank <= 1:
        return (1,) * rank
    row_major = tuple(range(rank - 1, -1, -1))
    is_contiguous = all(_contiguous_like(shape, strides, row_major) for strides in operands)
    is_channels_last = rank == 4 and all(
        _contiguous_like(shape, strides, (1, 3, 2, 0)) for strides in operands)
    if is_contiguous and not is_channels_last:
        return contiguous_strides(shape)
    if is_channels_last and not is_contiguous:
        return _channels_last_strides(shape)

    def should_swap(a: int, b: int) -> int:
        for strides in operands:
            stride_a = strides[a]
            stride_b = strides[b]
            if stride_a == 0 or stride_b == 0:
                continue
            if stride_a == stride_b:
                if shape[b] >= shape[a]:
                    continue
                return 1
            return -1 if stride_b > stride_a else 1
        return 0

    perm = list(row_major)  # sorted back to front: perm[0] the fastest dimension
    for i in range(1, rank):
        dim1 = i
        for dim0 in range(i - 1, -1, -1):
            comparison = should_swap(perm[dim0], perm[dim1])
            if comparison > 0:
                perm[dim0], perm[dim1] = perm[dim1], perm[dim0]
                dim1 = dim0
            elif comparison < 0:
                break
    out = [0] * rank
    step = 1
    for dim in perm:
        out[dim] = step
        step *= shape[dim]
    return tuple(out)


def _channels_last_strides(shape: tuple[int, ...]) -> tuple[int, ...] | None:
    """c10's get_channels_last_strides_2d / _3d (4 and 5 dimensions; None otherwise)."""
    if len(shape) == 4:
        _, c, h, w = shape
        return (h * w * c, 1, w * c, c)
    if len(shape) == 5:
        _, c, d, h, w = shape
        return (d * h * w * c, 1, h * w * c, w * c, c)
    return None


_REF_COMPUTED = frozenset({torch.float32, torch.float64})
"""Dtypes the refs compute in (no conversion of the operands or the result)."""


def _binary_dtype(tensors: list[torch.Tensor]) -> torch.dtype | None:
    """The result dtype where no dimensioned operand is converted: every dimensioned tensor
    float32 or every one float64 (0-dim tensors of any floating dtype follow it: only they
    are converted, and they broadcast with zero strides), or all 0-dim of one such dtype."""
    dimensioned = {t.dtype for t in tensors if t.dim() != 0}
    if not dimensioned:
        dimensioned = {t.dtype for t in tensors}
    if len(dimensioned) != 1:
        return None
    dtype = dimensioned.pop()
    return dtype if dtype in _REF_COMPUTED else None


def _broadcast_binary(args: tuple, kwargs: dict) -> Any:
    """add / sub / mul / div.Tensor of two float32 / float64 strided tensors of any layouts
    that broadcast (a rotary `t * cos`, a mask `x + bias[None]`), no alpha (add's and sub's
    alpha scales the second operand through its own prim first): the refs' output layout."""
    if len(args) != 2 or kwargs:
        return DECLINE
    a, b = args
    if not (_strided_meta(a, _FLOATS) and _strided_meta(b, _FLOATS)):
        return DECLINE
    dtype = _binary_dtype([a, b])
    if dtype is None:
        return DECLINE
    sizes_a, sizes_b = tuple(a.shape), tuple(b.shape)
    shape = sizes_a if sizes_a == sizes_b else _broadcast_shape([sizes_a, sizes_b])
    if shape is None:
        return DECLINE
    operands = [_expanded_strides(sizes_a, a.stride(), shape),
                _expanded_strides(sizes_b, b.stride(), shape)]
    return _new(shape, dtype, _elementwise_output_strides(shape, operands))


_INTEGERS_COMPUTED = frozenset({torch.int64, torch.int32})


def _scalar_binary(args: tuple, kwargs: dict, integers: bool) -> Any:
    """add / sub / mul / div.Tensor of a strided tensor and a Python number (`t * 0.125`,
    `x + 0`, `pos - 0`), no alpha: the refs keep the tensor's dtype (float32 / float64 with an
    int or a float; int64 / int32 with an int, not for div's true division) and the output
    layout is the elementwise sort over the tensor alone (contiguous where it is contiguous;
    not compute_elementwise_output_strides' one-tensor shortcut that keeps a dense tensor's
    strides: held to the kernel by test_fast_layouts_strided.py)."""
    if len(args) != 2 or kwargs:
        return DECLINE
    x, number = args
    kind = type(number)
    if kind is float:
        dtypes = _REF_COMPUTED
    elif kind is int:
        dtypes = _REF_COMPUTED | _INTEGERS_COMPUTED if integers else _REF_COMPUTED
    else:
        return DECLINE
    if not _strided_meta(x, dtypes):
        return DECLINE
    shape = tuple(x.shape)
    return _new(shape, x.dtype, _elementwise_output_strides(shape, [x.stride()]))


def _binary_rule(func: Any) -> Rule:
    """The same-layout rule, else the broadcasting one (two tensors) or the scalar one."""
    integers = func is not aten.div.Tensor  # an integer tensor / an int: true division
    def rule(args: tuple, kwargs: dict) -> Any:
        out = _SAME_LAYOUT_BINARY(args, kwargs)
        if out is not DECLINE:
            return out
        if len(args) == 2 and type(args[1]) in _TENSORS:
            return _broadcast_binary(args, kwargs)
        return _scalar_binary(args, kwargs, integers)

    return rule


_SAME_LAYOUT_BINARY = _pointwise(_two_tensors)
BROADCAST_BINARY = (aten.add.Tensor, aten.sub.Tensor, aten.mul.Tensor, aten.div.Tensor)
for _func in BROADCAST_BINARY:
    register(_func, _binary_rule(_func))


# --- cat of strided inputs: compute_output_memory_format (issue 14, branch w1) -----------------


def _channels_last_like(shape: tuple[int, ...], strides: tuple[int, ...], order: tuple) -> bool:
    """c10's is_channels_last_strides_2d_s4 / 3d_s5 over the dimensions in `order`."""
    if strides[1] == 0:
        return False
    low = 0
    for d in order:
        size = shape[d]
        if size == 0 or strides[d] < low:
            return False
        if d == 0 and low == strides[1]:
            return False
        low = strides[d]
        if size > 1:
            low *= size
    return True


def suggest_memory_format(tensor: torch.Tensor) -> Any:
    """TensorBase::suggest_memory_format of a strided tensor: channels_last where its strides
    are like channels_last's (4 dimensions), channels_last_3d (5), contiguous otherwise."""
    shape = tuple(tensor.shape)
    if len(shape) == 4 and _channels_last_like(shape, tensor.stride(), (1, 3, 2, 0)):
        return torch.channels_last
    if len(shape) == 5 and _channels_last_like(shape, tensor.stride(), (1, 4, 3, 2, 0)):
        return torch.channels_last_3d
    return torch.contiguous_format


def _cat_strided(args: tuple, kwargs: dict) -> Any:
    """cat of non-empty strided tensors of one dtype and rank in any layouts (a key/value
    cache of transposed keys): the output is contiguous unless every input suggests one
    channels_last format (compute_output_memory_format), then in that format."""
    if kwargs or type(args[0]) not in (list, tuple) or not args[0]:
        return DECLINE
    tensors = args[0]
    dim = args[1] if len(args) > 1 else 0
    first = tensors[0]
    if not _strided_meta(first, _ANY_DTYPE) or first.dim() == 0 or not _dim_ok(dim, first.dim()):
        return DECLINE
    rank = first.dim()
    dim %= rank
    shape = list(first.shape)
    total = 0
    format_ = None
    for tensor in tensors:
        if (not _strided_meta(tensor, _ANY_DTYPE) or tensor.dtype != first.dtype
                or tensor.dim() != rank):
            return DECLINE
        sizes = tensor.shape
        if any(sizes[d] != shape[d] for d in range(rank) if d != dim):
            return DECLINE
        total += sizes[dim]
        if format_ is not torch.contiguous_format:
            suggested = suggest_memory_format(tensor)
            if format_ is not None and suggested is not format_:
                suggested = torch.contiguous_format
            format_ = suggested
    shape[dim] = total
    shape = tuple(shape)
    if format_ is torch.contiguous_format:
        return _new(shape, first.dtype)
    return _new(shape, first.dtype, _channels_last_strides(shape))


def _cat_then_strided(args: tuple, kwargs: dict) -> Any:
    out = _cat(args, kwargs)
    if out is DECLINE:
        return _cat_strided(args, kwargs)
    return out


register(aten.cat.default, _cat_then_strided)


def _stack(args: tuple, kwargs: dict) -> Any:
    """stack(tensors, dim=0) of one shape, as torch._refs.stack: a dim inside the rank, the
    layout of `cat(tensors, dim).view(sizes)` (the strided cat rule), in a fresh tensor (the
    kernel's output is not a view: measured); the dim after the last, the cat of the inputs
    unsqueezed there."""
    if kwargs or type(args[0]) not in (list, tuple) or not args[0]:
        return DECLINE
    tensors = args[0]
    dim = args[1] if len(args) > 1 else 0
    first = tensors[0]
    if not _strided_meta(first, _ANY_DTYPE) or not _dim_ok(dim, first.dim() + 1):
        return DECLINE
    rank = first.dim()
    shape = first.shape
    if any(type(t) not in _TENSORS or t.shape != shape for t in tensors):
        return DECLINE
    dim %= rank + 1
    if dim == rank:
        return _cat_then_strided(([t.unsqueeze(dim) for t in tensors], dim), {})
    out = _cat_then_strided((tensors, dim), {})
    if out is DECLINE:
        return DECLINE
    sizes = list(shape)
    sizes.insert(dim, len(tensors))
    return _new(tuple(sizes), out.dtype, out.view(sizes).stride())


register(aten.stack.default, _stack)
