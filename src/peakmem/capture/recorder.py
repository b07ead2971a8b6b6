"""A dispatch mode that sees every aten op of the job and records the device storages it creates,
then applies the op's CUDA rule (workspaces, scratch)."""

from __future__ import annotations

import contextlib
import inspect

import torch
from torch import Tensor
from torch._C._dynamo.eval_frame import get_eval_frame_callback
from torch._prims_common import is_non_overlapping_and_dense_or_false
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from peakmem.capture.eager import op_name
from peakmem.capture.flex_attention import register_hop_handlers
from peakmem.capture.grad_accumulation import engine_frame
from peakmem.capture.host_deferred import DEVICE, claim, outputs_kind
from peakmem.capture.in_place_branches import has_in_place_branch, in_place_branch
from peakmem.capture.meta_cache import SHARED_CACHE
from peakmem.capture.session import CaptureSession
from peakmem.capture.subclass_storages import storage_tensors
from peakmem.cuda_rules import host_outputs_for, op_rule_for, output_order_for
from peakmem.cuda_rules.true_device import is_meta, true_device
from peakmem.trace.vocab import Category

_DISABLE_TORCH_FUNCTION = torch._C.DisableTorchFunction
_HOST_COPY_OPS = {"_to_copy", "copy_", "_copy_from", "_copy_from_and_resize", "to"}
"""Ops whose output read from a host tensor is the job's data (`input`); `to` itself reaches the
recorder under `torch.inference_mode()` (a batch moved in an inference-mode evaluation)."""


def _op_name(func) -> str:
    return func.__name__ if hasattr(func, "__name__") else str(func)


class _OpInfo:
    """What the recorder needs to know of one op overload (looked up once per capture)."""

    __slots__ = ("func", "rule", "around", "host_outputs", "name", "host_copy", "dynamic_shape",
                 "output_order", "accumulates", "branches")

    def __init__(self, func) -> None:
        self.func = func  # kept alive: the recorder's table is keyed by its id
        self.rule = op_rule_for(func)
        self.around = self.rule is not None and inspect.isgeneratorfunction(self.rule)
        self.host_outputs = host_outputs_for(func)
        self.name = _op_name(func)
        self.host_copy = func.overloadpacket.__name__ in _HOST_COPY_OPS
        self.dynamic_shape = (torch.Tag.dynamic_output_shape in getattr(func, "tags", ())
                              or func.overloadpacket.__name__ in _VALUE_SIZED_OPS)
        self.output_order = output_order_for(func)
        self.accumulates = func is _ADD  # autograd's gradient accumulation (`_is_accumulation`)
        self.branches = has_in_place_branch(func)  # registered in capture/in_place_branches.py


_VALUE_SIZED_OPS = frozenset({"to_sparse", "_to_sparse", "_to_sparse_csr", "_to_sparse_csc"})
"""Ops whose output size depends on the values although torch does not tag them
`dynamic_output_shape`: a dense tensor made sparse has an entry per nonzero value (bounded on
fake tensors: cuda_rules/sparse.py). Counted with the tagged ones (`data_dependent`). The
recorder sees either the `_to_sparse` that `to_sparse` calls (a plain device tensor) or
`to_sparse` itself (seen in sentence-transformers' SparseEncoder.encode, on embeddings made
under `torch.inference_mode()`); never both for one call."""


class AllocationRecorder(TorchDispatchMode):
    def __init__(self, session: CaptureSession) -> None:
        super().__init__()
        self.session = session
        self._ops: dict = {}

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        """Not wrapped by `TorchDispatchMode.__init_subclass__` in `torch._disable_dynamo`: the
        recorder keeps Dynamo out of its frames itself (`__torch_dispatch__`), at less cost
        per op where no Dynamo frame callback is set (every op of an ordinary capture)."""
        return False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if get_eval_frame_callback() is not None:
            # a Dynamo frame callback is set (compiled code runs): Dynamo must not trace the
            # recorder's frames, as the base class's `torch._disable_dynamo` wrapper ensures
            return _dispatch_without_dynamo(self, func, types, args, kwargs)
        # Without a callback that wrapper sets none and restores none: the call is the same
        # (`_guarded_dispatch`'s body, one frame less per op).
        with _DISABLE_TORCH_FUNCTION():
            return self._dispatch(func, args, kwargs or {})

    def _guarded_dispatch(self, func, types, args=(), kwargs=None):
        # kernels written in Python (meta kernels, decompositions) and the rules must see the
        # true devices, not the job's device view (capture/device_view.py)
        with torch._C.DisableTorchFunction():
            return self._dispatch(func, args, kwargs or {})

    def _dispatch(self, func, args, kwargs):
        session = self.session
        if session.devices is not None:  # several GPUs: the op on its device
            return session.devices.dispatch(self._dispatch_here, func, args, kwargs)
        return self._dispatch_here(func, args, kwargs)

    def _dispatch_here(self, func, args, kwargs):
        session = self.session
        info = self._ops.get(id(func))  # an int key: an OpOverload's `__hash__` is Python
        if info is None:
            info = self._ops[id(func)] = _OpInfo(func)
        kind, kind_category = outputs_kind(session, args, kwargs)
        # a host-deferred or the job's own meta tensor: no CUDA kernel runs
        rule = None if session.closed or kind != "device" else info.rule
        if rule is not None and not _touches_device(session, args, kwargs):
            rule = None  # a host op (real CPU tensors only): no CUDA kernel either
        around = None
        if rule is not None and info.around:
            around = rule(session, func, args, kwargs)
            next(around)  # allocations the kernel makes before its outputs
        try:
            out, cached = _run(session, func, args, kwargs)
        except Exception as exc:
            if not session.eager and session.fake_limit is None:
                session.fake_limit = fake_limit_reason(func, args, kwargs, exc)
            raise
        if session.closed:
            return out
        if session.watch_op is not None:
            session.watch_op(func, args, out)
        if not session.eager and info.dynamic_shape and _data_dependent(func, args):
            name = op_name(func)
            session.data_dependent[name] = session.data_dependent.get(name, 0) + 1
        op = info.name
        host_outputs = info.host_outputs
        skip = {id(t) for t in host_outputs(out)} if host_outputs is not None else ()
        category = None
        if info.host_copy and not session.in_backward and _reads_host(args):
            # a copy from the host is the job's data; in backward it is a saved tensor brought
            # back (`save_on_cpu`, activation offloading): the backward's own, not an input
            category = Category.INPUT.value
        category = kind_category or category
        if type(out) is Tensor:  # one plain tensor (most ops): its own leaf, no inner storages
            tensors = (out,)
        else:
            tensors = _leaves(out)
            if info.output_order is not None and len(tensors) >= len(info.output_order):
                # the order the CUDA kernel allocates them in (cuda_rules OUTPUT_ORDER)
                tensors = ([tensors[i] for i in info.output_order]
                           + tensors[len(info.output_order):])
            tensors = storage_tensors(tensors)  # a wrapper subclass: its inner storages
        # `claim` answers False without a look while no storage is host-deferred or meta
        unclaimed = not session.storage_kinds and kind == DEVICE
        for tensor in tensors:
            if (
                isinstance(tensor, Tensor)
                and tensor.is_meta
                and id(tensor) not in skip
                and (unclaimed or not claim(session, tensor, kind))
            ):
                session.track(tensor, op, category)
        if info.accumulates and session.in_backward and _is_accumulation(args, kwargs, out):
            session.expect_accumulation(args[0], out)
        elif info.branches:
            branch = in_place_branch(func, args, kwargs, out)
            if branch is not None:
                session.expect_in_place(args[0], out, branch.name)
        if session.op_observer is not None:
            session.op_observer(func, args, kwargs, out, kind, cached)
        if around is not None:
            with contextlib.suppress(StopIteration):
                around.send(out)
        elif rule is not None:
            rule(session, func, args, kwargs, out)
        return out


register_hop_handlers(AllocationRecorder)  # flex_attention's operators (capture/flex_attention.py)

_ADD = torch.ops.aten.add.Tensor
_LOCAL_SCALAR_DENSE = torch.ops.aten._local_scalar_dense.default


_dispatch_without_dynamo = torch._disable_dynamo(
    AllocationRecorder._guarded_dispatch, recursive=True)
"""The recorder's dispatch as the base class would have wrapped it (Dynamo kept out)."""


def _is_accumulation(args: tuple, kwargs: dict, out) -> bool:
    """`old + var` made by autograd's engine between nodes with grad mode off (its gradient
    accumulation, capture/grad_accumulation.py), on a dense old gradient of the sum's layout:
    CUDA may add in place there."""
    leaves = engine_frame()
    if leaves is None or torch.is_grad_enabled() or kwargs.get("alpha", 1) != 1:
        return False
    old = args[0] if args else None
    return (
        isinstance(old, Tensor)
        and isinstance(out, Tensor)
        and old.is_meta
        and old.layout == torch.strided
        and old.dtype == out.dtype
        and old.shape == out.shape
        and is_non_overlapping_and_dense_or_false(old)
        and (tuple(old.shape), old.dtype) not in leaves
    )


def _run(session: CaptureSession, func, args, kwargs) -> tuple:
    """The op's outputs, and where the meta cache keeps the call (None: not cached)."""
    if session.eager:  # real values: always the kernel
        return func(*args, **kwargs), None
    if func is _LOCAL_SCALAR_DENSE:
        # a device tensor read as a Python number below the torch-function layer (an op's
        # Scalar argument: `torch.full(..., fill_value=t)`): its values, where they are known
        from peakmem.capture.device_map import known_host_data

        known = known_host_data(args[0])
        if known is not None:
            return known.item(), None
    # fake tensors: a repeated call's outputs are made from its recorded layout
    return SHARED_CACHE.call_entry(func, args, kwargs)


def _leaves(value) -> list:
    """The leaves of an op's arguments or outputs (tensors, numbers, devices, ...) in
    tree_flatten's order: an aten op's values nest only in tuples, lists and dicts."""
    if isinstance(value, Tensor):
        return [value]
    out: list = []
    _collect(value, out)
    return out


def _collect(value, out: list) -> None:
    if isinstance(value, (list, tuple)):
        for item in value:
            if isinstance(item, (list, tuple, dict)):
                _collect(item, out)
            else:
                out.append(item)
    elif isinstance(value, dict):
        for item in value.values():
            _collect(item, out)
    else:
        out.append(value)


_INDEX_OPS = {"index", "index_put", "index_put_", "_index_put_impl_", "_unsafe_index"}


def _data_dependent(func, args) -> bool:
    """Whether a `dynamic_output_shape` op's size depends on device values here (indexing
    only does with a boolean mask)."""
    flat, _ = tree_flatten(args)
    if not any(is_meta(t) for t in flat):
        return False
    if func.overloadpacket.__name__ in _INDEX_OPS:
        return any(
            isinstance(t, torch.Tensor) and t.dtype in (torch.bool, torch.uint8) for t in flat[1:]
        )
    return True


def fake_limit_reason(func, args, kwargs, exc: BaseException) -> str | None:
    """Why `func` failed on the fake device, when it failed *because* the device is fake
    (None for the job's own errors: shape mismatches, wrong devices, ...)."""
    flat, _ = tree_flatten((args, kwargs))
    if not any(
        is_meta(t) or (isinstance(t, torch.device) and t.type == "meta")
        for t in flat
    ):
        return None
    name = op_name(func)
    text = str(exc)
    first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    custom = not name.startswith(("aten::", "prims::"))
    if custom and ("fake impl" in text or "fake kernel" in text):
        return f"{name} (a custom op) has no meta/fake kernel"
    if func is torch.ops.aten._local_scalar_dense.default or "cannot be called on meta" in text:
        return f"{name} reads a device value on the host ({first})"
    if isinstance(exc, NotImplementedError):
        return f"{name} has no meta kernel" + (" (a custom op)" if custom else "")
    if custom:
        return f"{name} (a custom op) failed on fake tensors: {first}"
    if "meta" in text.lower() and "device" not in text.lower():
        return f"{name} cannot run on fake (meta) tensors: {first}"
    return None


def _touches_device(session: CaptureSession, args, kwargs) -> bool:
    """Whether the op reads a device tensor, or makes one from nothing (a factory on the
    device): CUDA rules apply to device ops only."""
    flat = _leaves((args, kwargs))
    tensors = [t for t in flat if isinstance(t, Tensor)]
    if not tensors:
        return any(isinstance(d, torch.device) and d.type == "meta" for d in flat)
    return any(t.is_meta and session.storage_kind(t) == "device" for t in tensors)


def _reads_host(args) -> bool:
    flat = _leaves(args)
    return any(isinstance(t, torch.Tensor) and true_device(t).type == "cpu" for t in flat)
