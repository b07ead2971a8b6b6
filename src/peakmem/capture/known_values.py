"""Known host values carried through cheap ops on small device tensors (fake mode).

A small device tensor built from host data (`torch.tensor(data, device="cuda")`, `t.to("cuda")`,
a small tensor loaded onto the device) keeps its host values for host reads
(`device_map.give_host_data`). Jobs read values *derived* from such tensors: PyG's
`int(mask.sum())` of a mask moved with the graph, torchmetrics' `len(torch.unique(target))` of
the labels, `.tolist()` of a `torch.arange(n, device="cuda")` slice. Fake mode has no values
for results of device ops, so those reads saw placeholder zeros (a division by zero, a failed
validity check) and auto mode fell back to eager.

The ops in `KNOWN_VALUE_OPS` are also run on the host when every device tensor among their
inputs has known values, their inputs and outputs have at most
`device_map.HOST_DATA_MAX_ELEMENTS` elements each and no input requires grad: the device
result gets the host result's values (cheap: at most 65,536 elements an input). A device
factory in the registry (`torch.arange(n, device="cuda")`) has no inputs to know and is always
carried. Ops whose output size depends on the values (`SIZED_BY_VALUES`: `unique`, `nonzero`,
boolean-mask indexing) are not sized from above then: the device result is the host result
copied to the device, of the size the GPU would give. Nothing here changes what is allocated
for any other op, and eager mode (real values) never comes here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils._pytree import SUPPORTED_NODES, tree_flatten, tree_map

from peakmem.capture.arg_tensors import tensors_in
from peakmem.capture.device_specs import is_cuda_spec
from peakmem.capture.replaced_methods import ORIGINAL
from peakmem.cuda_rules.true_device import is_meta

Tensor = torch.Tensor
_NO_VIEW = torch._C.DisableTorchFunction


def _ops(*names: str, namespaces: tuple = (torch, Tensor)) -> set[Callable]:
    """The functions called `name` in torch and on Tensor (those that exist)."""
    found = set()
    for name in names:
        for namespace in namespaces:
            op = getattr(namespace, name, None)
            if op is not None:
                found.add(op)
    return found


ELEMENTWISE = _ops(
    "add", "sub", "subtract", "mul", "multiply", "div", "divide", "true_divide", "floor_divide",
    "remainder", "fmod", "neg", "abs", "pow", "clamp", "clip", "minimum", "maximum", "sign",
    "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_not", "logical_xor",
    "bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_not", "isin", "where", "masked_fill",
    "floor", "ceil", "round", "trunc", "isnan", "isinf", "isfinite",
    "__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__truediv__",
    "__rtruediv__", "__floordiv__", "__rfloordiv__", "__mod__", "__rmod__", "__pow__", "__rpow__",
    "__neg__", "__abs__", "__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__",
    "__and__", "__rand__", "__or__", "__ror__", "__xor__", "__rxor__", "__invert__",
    "long", "int", "float", "double", "half", "bfloat16", "bool", "byte", "type_as", "clone",
    "contiguous",
)
"""Elementwise ops and dtype conversions."""
REDUCTIONS = _ops(
    "sum", "prod", "mean", "max", "min", "amax", "amin", "argmax", "argmin", "any", "all",
    "cumsum", "cumprod", "count_nonzero", "sort", "argsort", "diff",
)
SHAPING = _ops(
    "cat", "concat", "stack", "reshape", "flatten", "repeat", "flip",
    "gather", "index_select", "take", "__getitem__",
)
"""Copies into new shapes and indexing (views of a known tensor are known already)."""
SIZED_BY_VALUES = _ops("unique", "unique_consecutive", "nonzero", "masked_select", "argwhere")
"""Ops whose output size the values decide."""
IN_PLACE = _ops(
    "add_", "sub_", "mul_", "div_", "clamp_", "masked_fill_", "fill_", "zero_", "cumsum_",
    "__iadd__", "__isub__", "__imul__", "__itruediv__", "__iand__", "__ior__",
    namespaces=(Tensor,),
)
"""In-place ops on a known tensor (no view): its values follow."""
FACTORIES = _ops("arange", "range", "zeros", "ones", "full", "linspace", "eye",
                 namespaces=(torch,))
"""Device factories: nothing to know."""
INDEX_RESULTS = _ops("argmax", "argmin")
"""Ops whose result holds indices along one dimension: at most that many distinct values."""
UNIQUE = _ops("unique")
ASSUMED_FINITE = _ops("isfinite")
"""`isfinite` of unknown values reads True, as a validity check does (`device_map`'s
`_ASSUMED_TRUE`): Lightning's EarlyStopping stops the run when `torch.isfinite(metric)` is
False, which the 0-d placeholder (False) said of every fake metric."""
KNOWN_VALUE_OPS = frozenset(ELEMENTWISE | REDUCTIONS | SHAPING | SIZED_BY_VALUES | IN_PLACE
                            | FACTORIES)
_DISTINCT = "_peakmem_distinct_at_most"
"""On a device tensor of unknown values: how many distinct values it holds at most (the indices
`argmax(x, dim)` returns lie in `range(x.shape[dim])`)."""


def carries(func: Any) -> bool:
    return func in KNOWN_VALUE_OPS


class _Unknown(Exception):
    """An input's values are not known (or too large, or need grad): nothing is carried."""


_HOST_DATA: tuple | None = None


def _host_data() -> tuple:
    """(HOST_DATA_MAX_ELEMENTS, known_host_data, give_host_data) of capture.device_map (which
    imports this module), looked up once."""
    global _HOST_DATA
    if _HOST_DATA is None:
        from peakmem.capture.device_map import (
            HOST_DATA_MAX_ELEMENTS,
            give_host_data,
            known_host_data,
        )

        _HOST_DATA = (HOST_DATA_MAX_ELEMENTS, known_host_data, give_host_data)
    return _HOST_DATA


def _assumed_true() -> str:
    from peakmem.capture.device_map import _ASSUMED_TRUE

    return _ASSUMED_TRUE


_PLAIN_CONTAINERS = (tuple, list, dict)


def _plain(value: Any) -> bool:
    """Whether `value` nests only in plain tuples, lists and dicts (an op's arguments, as a
    rule): no namedtuple, `torch.Size` or other registered pytree node anywhere."""
    kind = type(value)
    if kind is tuple or kind is list:
        return all(_plain(item) for item in value)
    if kind is dict:
        return all(_plain(item) for item in value.values())
    return kind not in SUPPORTED_NODES and not isinstance(value, _PLAIN_CONTAINERS)


def _plain_map(fn: Callable, value: Any) -> Any:
    kind = type(value)
    if kind is tuple:
        return tuple([_plain_map(fn, item) for item in value])
    if kind is list:
        return [_plain_map(fn, item) for item in value]
    if kind is dict:
        return {key: _plain_map(fn, item) for key, item in value.items()}
    return fn(value)


def _fast_tree_map(fn: Callable, value: Any) -> Any:
    """`tree_map(fn, value)`: for plain values (`_plain`) a walk without pytree's per-node
    bookkeeping (the same leaves, in the same order, the same containers rebuilt), pytree's
    own otherwise."""
    if _plain(value):
        return _plain_map(fn, value)
    return tree_map(fn, value)


def _fast_leaves(value: Any) -> list:
    """`tree_flatten(value)[0]`; a tensor (most results) is its own only leaf."""
    if type(value) is Tensor:
        return [value]
    return tree_flatten(value)[0]


def _host_arguments(args: tuple, kwargs: dict, bound: int, known: Callable) -> tuple | None:
    """(args, kwargs) with each device tensor replaced by its known host values, a device
    named as the host; None when one is not known (or the call is no device op at all)."""
    tensors = tensors_in((args, kwargs) if kwargs else args)
    for tensor in tensors:  # first: the common training op (large, or needing grad) stops here
        if tensor.requires_grad or tensor.numel() > bound:
            return None
    device_named = "device" in kwargs and is_cuda_spec(kwargs["device"], ints=True)
    first = None  # the first device tensor: the first the walk below asks `known` of
    with _NO_VIEW():  # `is_meta` of each, in one context
        for tensor in tensors:
            if tensor.is_meta:
                first = tensor
                break
    if first is None:
        if not device_named:
            return None  # a host op: real values already
    elif _holds_no_values(first):
        return None  # the walk below would stop there (decode loops: most small ops)

    def to_host(value: Any) -> Any:
        if isinstance(value, Tensor) and is_meta(value):
            host = known(value)
            if host is None:
                raise _Unknown
            return host
        return value

    try:
        host_args, host_kwargs = _fast_tree_map(to_host, (args, kwargs))
    except _Unknown:
        return None
    if device_named:
        host_kwargs["device"] = "cpu"
    return host_args, host_kwargs


_ATTRIBUTES: tuple | None = None
"""(device_map's assumed-true mark, its host-values attribute), looked up once."""


def _holds_no_values(tensor: Tensor) -> bool:
    """Whether `known(tensor)` (a device tensor) answers None for want of any values: no
    assumed-true mark, no values attribute on its base (attribute reads only). A small device
    tensor of unknown values (every activation of a decode loop under no_grad) is turned away
    at little cost. Where it holds values (known, read lazily from a file, assumed true; or
    stale: `known` decides), `_host_arguments`' walk runs as before: `known` copies them
    through the capture's dispatch (a host op) before any later tensor turns out unknown."""
    global _ATTRIBUTES
    if _ATTRIBUTES is None:
        from peakmem.capture.device_map import _ASSUMED_TRUE, _HOST_DATA

        _ATTRIBUTES = (_ASSUMED_TRUE, _HOST_DATA)
    assumed_true, values = _ATTRIBUTES
    if getattr(tensor, assumed_true, False):
        return False
    base = tensor if tensor._base is None else tensor._base
    return getattr(base, values, None) is None


def _on_host(func: Any, host_args: tuple, host_kwargs: dict) -> Any:
    """`func` on host values, below the capture's modes (no job op is recorded for it); None
    when it fails (the device op raises its own error, or runs)."""
    try:
        with _disable_current_modes(), torch._C.DisableTorchFunction(), torch.no_grad():
            return func(*host_args, **host_kwargs)
    except Exception:  # noqa: BLE001
        return None


def _small(leaves: list, bound: int) -> bool:
    return all(not isinstance(leaf, Tensor) or leaf.numel() <= bound for leaf in leaves)


def call_carrying_values(
    func: Any, args: tuple, kwargs: dict, run: Callable[[tuple], Any]
) -> Any:
    """`run(args)` (the op as the capture runs it), its device outputs given the host values the
    op computes from known inputs (see the module docstring)."""
    bound, known, give = _host_data()
    host_call = _host_arguments(args, kwargs, bound, known)
    masked = func is ORIGINAL["__getitem__"] and _masks(args)
    if host_call is None:
        if masked:  # the selection's size is known from a known mask, the values are not
            return run(_masks_as_indices(args, known, give))
        if func in UNIQUE:
            return run(_fewer_distinct(args, kwargs))
        result = run(args)
        if func in INDEX_RESULTS:
            _note_distinct(args, kwargs, result)
        elif func in ASSUMED_FINITE and isinstance(result, Tensor) and is_meta(result):
            setattr(result, _assumed_true(), True)
        return result
    if func in SIZED_BY_VALUES or masked:
        host_result = _on_host(func, *host_call)  # no larger than its inputs
        if host_result is None:
            return run(args)
        return tree_map(lambda leaf: _to_device(leaf, give), host_result)
    result = run(args)
    leaves = _fast_leaves(result)
    if not _small(leaves, bound):  # a broadcast grew it (`a[:, None] == b`): not computed
        return result
    host_result = _on_host(func, *host_call)
    if host_result is None:
        return result
    if func in IN_PLACE:
        target = args[0]
        if isinstance(target, Tensor) and target._base is None and result is target:
            give(target, host_call[0][0])
        return result
    host_leaves = _fast_leaves(host_result)
    if len(leaves) == len(host_leaves):
        for leaf, host in zip(leaves, host_leaves, strict=True):
            if (isinstance(leaf, Tensor) and isinstance(host, Tensor) and is_meta(leaf)
                    and leaf._base is None and leaf.shape == host.shape
                    and leaf.dtype == host.dtype):
                give(leaf, host)
    return result


def _masks(args: tuple) -> bool:
    """Whether an index holds a boolean mask (the selection's size comes from its values)."""
    return any(t.dtype == torch.bool for t in tensors_in(args[1:]))


def _masks_as_indices(args: tuple, known: Callable, give: Callable) -> tuple:
    """`x[mask]` with a device mask whose values are known: the mask replaced by the indices
    of its True elements (`mask.nonzero(as_tuple=True)`, as ATen turns a boolean index into
    integer ones before it selects, allocating them on the device), so the selection has the
    size the GPU gives (the upper bound otherwise: every element selected). A selection of
    known values by a known mask has that size too, so the two agree (`out[train_mask]` and
    `y[train_mask]` in one loss)."""
    tensor, index = args
    parts = index if type(index) is tuple else (index,)
    converted: list[Any] = []
    for part in parts:
        host = known(part) if isinstance(part, Tensor) and part.dtype == torch.bool else None
        if host is None or host.dim() == 0:
            converted.append(part)
            continue
        converted.extend(_to_device(rows, give) for rows in host.nonzero(as_tuple=True))
    return (tensor, tuple(converted))


def _to_device(leaf: Any, give: Callable) -> Any:
    """A host result copied to the device (recorded as the op's allocation), its values kept."""
    if not isinstance(leaf, Tensor):
        return leaf
    device = leaf.to("meta")
    give(device, leaf)
    return device


def _note_distinct(args: tuple, kwargs: dict, result: Any) -> None:
    """`argmax(x, dim)` / `argmin(x, dim)`: the result's values lie in `range(x.shape[dim])`."""
    dim = kwargs.get("dim", args[1] if len(args) > 1 else None)
    source = args[0] if args else kwargs.get("input")
    if (isinstance(dim, int) and isinstance(source, Tensor) and isinstance(result, Tensor)
            and is_meta(result) and source.dim() > 0):
        setattr(result, _DISTINCT, source.shape[dim])


def _fewer_distinct(args: tuple, kwargs: dict) -> tuple:
    """`torch.unique(t)` of unknown values with at most `n` distinct ones (`_note_distinct`):
    sized from the first `n` elements, as if all `n` occurred (the bound every element
    distinct gives otherwise: torchmetrics checks `len(torch.unique(preds)) <= num_classes` of
    `preds = logits.argmax(dim=1)`). Not with `return_inverse` (shaped like the input) or a
    `dim`."""
    tensor = args[0] if args else None
    if not isinstance(tensor, Tensor) or len(args) > 2 or kwargs.get("return_inverse") \
            or kwargs.get("dim") is not None:
        return args
    distinct = getattr(tensor, _DISTINCT, None)
    if distinct is None and tensor._base is not None:
        distinct = getattr(tensor._base, _DISTINCT, None)
    if distinct is None or distinct >= tensor.numel() or not tensor.is_contiguous():
        return args
    return (tensor.reshape(-1)[:distinct], *args[1:])
