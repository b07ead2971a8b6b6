"""A cache of meta-kernel results: the same op on fake tensors of the same shapes, strides and
dtypes makes outputs of the same shapes, strides and dtypes, so it is run once per distinct call.

Many ops' meta kernels are Python (torch._refs, torch._decomp, torch._meta_registrations) and
cost 0.1 to 10 ms per call; a training step repeats the same calls every iteration. A hit makes
fresh meta outputs with the recorded layout (empty_strided / set_ on a fresh storage) in a few
microseconds. Only calls whose result provably depends on nothing but the key are cached:

- the op is functional (no mutable argument, no aliasing return), has no data-dependent output
  shape (`index.Tensor` is, with a mask: its calls with integer indices only are cached,
  CALL_GUARDED_OPS), and every output is a fresh plain strided meta tensor that shares no
  storage with an input;
- every tensor argument is a plain strided meta tensor (no subclass, no real host values); the
  key holds its dtype, shape, strides, storage offset, conj/neg bits, requires_grad and which
  arguments share a storage; every other argument is a plain value (numbers, bools, strings,
  None, dtypes, devices, layouts, memory formats and lists of them) compared by type and value;
- the global switches a kernel may read (default dtype, grad mode, deterministic algorithms) are
  in the key too.

- the op is an aten / prims op (a custom op's fake kernel is the job's code) and no peakmem fused
  kernel (cuda_rules registry.FUSED_KERNELS, installed as the op's Meta kernel in each capture)
  is registered for it: while one is, the kernel in place decides every time, so a result of the
  op's own meta kernel is never handed out where peakmem's would run, or the reverse. A fused
  kernel registered as layout-pure (registry.LAYOUT_PURE_FUSED_KERNELS: its output depends only
  on the key, and on whether cuDNN is enabled, also keyed for it) is cached like any op, its
  misses answered by itself, never by capture/fast_layouts.py.

In-place foreach arithmetic (`_foreach_add_`, `_sub_`, `_mul_`, `_div_`, `_addcdiv_`,
`_addcmul_`, `_lerp_`: VALUE_BLIND_OPS) keys its float scalars by type, not value: their meta
kernels only check the arguments' layouts, dtypes and the scalars' types (type promotion), and
return nothing, so an optimizer whose per-step scalars change (Adam's bias corrections: a
ScalarList of new floats every step) checks its arguments once per layout instead of once per
step (tests/capture/test_meta_cache.py runs every such overload with many float values, and
every dtype, and sees the same outcome).

A miss is first offered to capture/fast_layouts.py, whose rules make the outputs of common
ops (pointwise, dropout, batch norm, softmax, mm / addmm, the *_like factories, the optimizers'
foreach ops) from the input layouts where that provably gives the meta kernel's layouts; the
rest run the op's meta kernel.

A call with a host device option (a host factory, a copy to the host) runs its kernel
without a key: its output holds real values and is never cached.

`call_entry` also hands back the call's entry (`CacheEntry`: the recipe and a `memo` slot) and
its tensor arguments' storage ids, read while keying: what a consumer derives from the key alone
is kept in the memo and read back with no second key (the utilization observer keeps a call's
decision and op cost there: utilization/observer.py).

A call that raises is never cached (it raises again next time). Eager captures (real values)
do not use the cache. A job that registers its own Meta kernel for an aten op in the middle of
a run would still get the first kernel's layouts for calls seen before (not met in practice).
"""

from __future__ import annotations

from typing import Any

import torch

from peakmem.capture.fast_layouts import DECLINE, fast_layout
from peakmem.cuda_rules.registry import FUSED_KERNELS, LAYOUT_PURE_FUSED_KERNELS

_MAX_ENTRIES = 100_000
_PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)
_PLAIN_VALUES = (int, float, bool, str, type(None), torch.dtype, torch.device, torch.layout,
                 torch.memory_format)
_UNCACHEABLE = object()
_INT_ONLY = frozenset((int,))  # `issuperset` of an iterator stops at the first miss
_STRIDED = torch.strided
_META = torch.device("meta")
_DEVICE = torch.device


class _NotCacheable(Exception):
    pass


def _validates_only(func: Any) -> bool:
    """An in-place foreach op with no return (`_foreach_add_`, ...): its meta kernel only checks
    the arguments' layouts, the same checks for the same key."""
    schema = func._schema
    return (
        schema.name.startswith("aten::_foreach_")
        and schema.name.endswith("_")
        and not schema.returns
    )


UNCACHED_OPS: set[str] = {
    "aten::_unsafe_view",  # its output is a view of its input: never cached, so never keyed
}
"""Op names ("aten::foo") whose meta kernel must always run: one with side effects beyond its
outputs (a kernel registered by peakmem that records into the capture session, say) goes here,
and ops whose output always shares its input's storage though the schema says no alias
(`_recipe` refuses them every call: keying them only costs; branch s1)."""


VALUE_BLIND_OPS = frozenset({
    "aten::_foreach_add_", "aten::_foreach_sub_", "aten::_foreach_mul_", "aten::_foreach_div_",
    "aten::_foreach_addcdiv_", "aten::_foreach_addcmul_", "aten::_foreach_lerp_",
})
"""In-place foreach ops whose meta kernel reads a float scalar's type, never its value."""
_BLIND_FLOAT = (float, None)


def _value_blind(func: Any) -> bool:
    return _validates_only(func) and func._schema.name in VALUE_BLIND_OPS


_INTEGER_INDEX_DTYPES = frozenset({torch.int64, torch.int32})


def _integer_indices(args: tuple, kwargs: dict) -> bool:
    """`index.Tensor(self, indices)` with every index None or an int64 / int32 tensor: its
    meta kernel (`meta_index_Tensor`) then sizes and strides the output from the layouts alone
    (a bool or int8 index is a mask, sized by its values through `nonzero`). `v[:, [-1]]` of
    nanoGPT / minGPT / makemore's top-k sampling, every decoding step."""
    if kwargs or len(args) != 2 or type(args[1]) not in (list, tuple) or not args[1]:
        return False
    return all(index is None or (type(index) in _PLAIN_TENSORS
                                 and index.dtype in _INTEGER_INDEX_DTYPES)
               for index in args[1])


CALL_GUARDED_OPS: dict[Any, Any] = {torch.ops.aten.index.Tensor: _integer_indices}
"""Ops tagged `dynamic_output_shape` whose output layout is a function of the key on the calls
a guard (args, kwargs) -> bool accepts: those calls are cached, the others always run the
kernel."""


def _op_cacheable(func: Any) -> bool:
    schema = getattr(func, "_schema", None)
    if schema is None or schema.name in UNCACHED_OPS:
        return False
    if not schema.name.startswith(("aten::", "prims::")):
        return False  # a custom op's fake kernel is the job's code: it always runs
    if schema.is_mutable:
        return _validates_only(func)
    if any(ret.alias_info is not None for ret in schema.returns):
        return False
    if any(arg.alias_info is not None for arg in schema.arguments):
        return False
    tags = getattr(func, "tags", ())
    return not (
        (torch.Tag.dynamic_output_shape in tags and func not in CALL_GUARDED_OPS)
        or torch.Tag.data_dependent_output in tags
        or torch.Tag.inplace_view in tags
    )


def _fused_names(func: Any) -> tuple[str, str]:
    """The names a peakmem fused kernel for `func` is registered under (registry.FUSED_KERNELS)."""
    packet = func.overloadpacket.__name__
    return (packet, f"{packet}.{func._overloadname}")


class CacheEntry:
    """One cached call: how to make its outputs again (`_recipe`), and `memo`, where a consumer
    keeps what it derives from the call's key alone (None until one does)."""

    __slots__ = ("recipe", "memo")

    def __init__(self, recipe: tuple) -> None:
        self.recipe = recipe
        self.memo: Any = None


Cached = tuple[CacheEntry, dict[int, int]]
"""A cached call (MetaCache.call_entry): its entry, and its tensor arguments' storage ids (->
the index of the storage among them)."""


class MetaCache:
    """`call(func, args, kwargs)`: func's result, from the cache when the same call was seen."""

    def __init__(self) -> None:
        self._entries: dict[tuple, CacheEntry] = {}
        self._ops: dict[int, tuple[tuple[str, str] | bool, bool, Any, Any]] = {}
        """id(op) -> (its fused-kernel names, or False where not cacheable; whether its float
        arguments are keyed by type only; the op; its CALL_GUARDED_OPS guard or None). Holds every op it has seen, so an op's `id`
        (here and in a cache key) stays its own; an int key, as an OpOverload's `__hash__` is
        Python."""
        self.hits = 0
        self.misses = 0
        self.fast = 0  # misses answered by capture/fast_layouts.py's rules

    def call(self, func: Any, args: tuple, kwargs: dict) -> Any:
        return self.call_entry(func, args, kwargs)[0]

    def call_entry(self, func: Any, args: tuple, kwargs: dict) -> tuple[Any, Cached | None]:
        """`call`'s result, and where it is cached (None where it is not): its entry, made from
        or stored in, and its tensor arguments' storage ids (`id(untyped_storage())`, every
        one). Every call of the same key gets the same entry, so what is a function of the key
        alone may be kept in its `memo` (the utilization observer's cost of the op)."""
        facts = self._ops.get(id(func))
        if facts is None:
            names = _fused_names(func) if _op_cacheable(func) else False
            facts = self._ops[id(func)] = (names, names is not False and _value_blind(func), func,
                                           CALL_GUARDED_OPS.get(func))
        names, blind, _, guard = facts
        fused = False
        if names is not False:
            fused = names[0] in FUSED_KERNELS or names[1] in FUSED_KERNELS
        if names is False or (fused and not _layout_pure(names)):
            # not cacheable, or peakmem's fused meta kernel replaces the op's own while it is
            # registered (each capture installs them): the kernel in place decides, every time
            return func(*args, **kwargs), None
        if guard is not None and not guard(args, kwargs):
            return func(*args, **kwargs), None  # this call's layout is not the key's alone
        if kwargs and type(kwargs.get("device")) is _DEVICE and kwargs["device"].type != "meta":
            # a host factory or copy (randint, empty, _to_copy to the host...): real values,
            # never cached (_recipe keeps meta outputs only), so no key is made (branch s1)
            return func(*args, **kwargs), None
        storages: dict[int, int] = {}
        try:
            key = (
                id(func),  # `_ops` keeps func alive: no other op takes its id
                (_get_default_dtype(), _is_grad_enabled(), _is_inference_mode_enabled(),
                 _are_deterministic_algorithms_enabled()),  # `_global_state()`, inline
                _key(args, storages, blind),
                _kwargs_key(kwargs, storages, blind) if kwargs else (),
                torch._C._get_cudnn_enabled() if fused else None,  # read by cuda_rules' kernels
            )
        except _NotCacheable:
            return func(*args, **kwargs), None
        entry = self._entries.get(key)
        if entry is not None:
            self.hits += 1
            return _rebuild(entry.recipe), (entry, storages)
        # a layout-pure fused kernel answers its misses itself (its rule is not torch's meta)
        out = DECLINE if fused else fast_layout(func, args, kwargs)
        if out is DECLINE:
            out = func(*args, **kwargs)
        else:
            self.fast += 1
        self.misses += 1
        if len(self._entries) < _MAX_ENTRIES:
            recipe = _recipe(out, storages)
            if recipe is not None:
                entry = self._entries[key] = CacheEntry(recipe)
                return out, (entry, storages)
        return out, None


def _layout_pure(names: tuple[str, str]) -> bool:
    """Whether the fused kernel registered under `names` is a pure function of the arguments'
    metadata (registry.LAYOUT_PURE_FUSED_KERNELS), so its results may be kept."""
    name = names[0] if names[0] in FUSED_KERNELS else names[1]
    return name in LAYOUT_PURE_FUSED_KERNELS


_get_default_dtype = torch.get_default_dtype
_is_grad_enabled = torch.is_grad_enabled
_is_inference_mode_enabled = torch.is_inference_mode_enabled
_are_deterministic_algorithms_enabled = torch.are_deterministic_algorithms_enabled


def _global_state() -> tuple:
    return (
        torch.get_default_dtype(),
        torch.is_grad_enabled(),
        torch.is_inference_mode_enabled(),
        torch.are_deterministic_algorithms_enabled(),
    )


def _key(values: tuple | list, storages: dict[int, int], blind: bool = False) -> tuple:
    """The key of a call's arguments (a tuple or list; kwargs as a tuple of (name, value));
    `blind`: floats by type only (VALUE_BLIND_OPS)."""
    parts = []
    append = parts.append
    for value in values:
        kind = type(value)
        if kind in _PLAIN_TENSORS:  # `_tensor_key(value, storages)`, inline
            if value.layout is not _STRIDED or not value.is_meta:
                raise _NotCacheable
            dtype = value.dtype
            append((
                dtype,
                tuple(value.shape),
                value.stride(),
                value.storage_offset(),
                storages.setdefault(id(value.untyped_storage()), len(storages)),
                value.requires_grad,
                dtype.is_complex and value.is_conj(),
                value.is_neg(),
            ))
        elif kind is tuple or kind is list:
            if _INT_ONLY.issuperset(map(type, value)):  # sizes, strides, dims (or empty)
                append((kind, tuple(value)))
            else:
                append((kind, _key(value, storages, blind), None))
        elif blind and kind is float:
            append(_BLIND_FLOAT)
        elif kind in _PLAIN_VALUES:
            append((kind, value))
        else:
            raise _NotCacheable
    return tuple(parts)


def _kwargs_key(kwargs: dict, storages: dict[int, int], blind: bool = False) -> tuple:
    """`_key(tuple(kwargs.items()), storages, blind)`, the same tuple, with a plain value (a
    dtype, device, bool, ... : most keyword arguments) keyed here instead of through a call of
    `_key` per (name, value) pair."""
    parts = []
    append = parts.append
    for name, value in kwargs.items():
        if type(name) is not str:  # not met from torch's dispatch: the generic way
            return _key(tuple(kwargs.items()), storages, blind)
        kind = type(value)
        if kind in _PLAIN_VALUES and not (blind and kind is float):
            part = (kind, value)
        else:
            part = _key((value,), storages, blind)[0]
        append((tuple, ((str, name), part), None))
    return tuple(parts)


def _tensor_key(value: torch.Tensor, storages: dict[int, int]) -> tuple:
    """A meta tensor's part of a key, equal to `_tensor_key_plain`'s: the conjugate bit read only
    for a complex dtype (torch sets it on no other). The shape is copied to a plain tuple: a key
    of plain tuples of numbers, dtypes and bools is untracked by the garbage collector once it
    has seen it (a `torch.Size` would keep the whole key tracked, and every full collection of a
    bench worker would walk every key)."""
    if value.layout is not _STRIDED or not value.is_meta:
        raise _NotCacheable
    dtype = value.dtype
    share = storages.setdefault(id(value.untyped_storage()), len(storages))
    return (
        dtype,
        tuple(value.shape),
        value.stride(),
        value.storage_offset(),
        share,
        value.requires_grad,
        dtype.is_complex and value.is_conj(),
        value.is_neg(),
    )


def _tensor_key_plain(value: torch.Tensor, storages: dict[int, int]) -> tuple:
    """`_tensor_key` read the plain way, every attribute, the shape copied (the reference its
    tests hold it to)."""
    if value.layout is not _STRIDED or not value.is_meta:
        raise _NotCacheable
    share = storages.setdefault(id(value.untyped_storage()), len(storages))
    return (
        value.dtype,
        tuple(value.shape),
        value.stride(),
        value.storage_offset(),
        share,
        value.requires_grad,
        value.is_conj(),
        value.is_neg(),
    )


def _recipe(out: Any, input_storages: dict[int, int]) -> tuple | None:
    """How to make `out` again: (container type or None, [(shape, stride, offset, dtype,
    storage group, storage bytes, whether those bytes are exactly what the tensor spans from
    offset 0) or None per output])."""
    if out is None:
        return (None, ())  # an in-place foreach op: nothing to make
    single = type(out) in _PLAIN_TENSORS
    items = (out,) if single else out
    if not single and type(out) not in (tuple, list):
        return None
    groups: dict[int, int] = {}
    parts: list[tuple | None] = []
    for tensor in items:
        if tensor is None:
            parts.append(None)
            continue
        if (
            type(tensor) is not torch.Tensor
            or tensor.layout is not _STRIDED
            or not tensor.is_meta
            or tensor.is_conj()
            or tensor.is_neg()
            or tensor.requires_grad
            or tensor._is_view()
        ):
            return None
        storage = tensor.untyped_storage()
        key = id(storage)
        if key in input_storages:
            return None  # aliases an input
        group = groups.setdefault(key, len(groups))
        shape, stride, offset = tuple(tensor.shape), tensor.stride(), tensor.storage_offset()
        nbytes = storage.nbytes()
        # a storage of exactly the bytes its first tensor spans from offset 0: empty_strided
        minimal = offset == 0 and nbytes == _min_bytes(shape, stride, tensor.dtype)
        parts.append((shape, stride, offset, tensor.dtype, group, nbytes, minimal))
    return (None if single else type(out), tuple(parts))


def _rebuild(entry: tuple) -> Any:
    container, parts = entry
    if container is None:  # one output tensor, or nothing (an in-place foreach op)
        if not parts:
            return None
        shape, stride, offset, dtype, group, nbytes, minimal = parts[0]
        if minimal:  # most ops: a storage of exactly its bytes, no other output to share it
            return torch.empty_strided(shape, stride, dtype=dtype, device=_META)
    storages: dict[int, Any] = {}
    made = []
    for part in parts:
        if part is None:
            made.append(None)
            continue
        shape, stride, offset, dtype, group, nbytes, minimal = part
        storage = storages.get(group)
        if storage is None and minimal:
            tensor = torch.empty_strided(shape, stride, dtype=dtype, device=_META)
            storages[group] = tensor.untyped_storage()
        else:
            if storage is None:
                storage = storages[group] = torch.empty(
                    (nbytes,), dtype=torch.uint8, device=_META
                ).untyped_storage()
            tensor = torch.empty((0,), dtype=dtype, device=_META)
            tensor.set_(storage, offset, shape, stride)
        made.append(tensor)
    if container is None:
        return made[0]
    return container(made)


def _min_bytes(shape: tuple, stride: tuple, dtype: torch.dtype) -> int:
    if any(size == 0 for size in shape):
        return 0
    return (1 + sum((size - 1) * step for size, step in zip(shape, stride, strict=True))) * (
        dtype.itemsize
    )


SHARED_CACHE = MetaCache()
"""One cache for every capture in this process (its keys hold everything a result depends on)."""
