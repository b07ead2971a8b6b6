"""`torch.nn.attention.flex_attention` under the capture: its higher-order operators
(`flex_attention`, `flex_attention_backward`) make what the compiled CUDA (Triton) kernels make.

A higher-order operator does not reach the recorder's `__torch_dispatch__`: torch looks up a
handler registered for the innermost dispatch mode's class (`HOP.py_impl(ModeClass)`), and
without one the job fails ("no rule registered for HigherOrderOperator flex_attention"). The
handlers here are registered for the recorder (`register_hop_handlers`); they make meta outputs
of the kernel's shapes, dtypes and strides and record their allocations, without running the
score_mod / mask_mod (no values on the fake device).

What the kernels allocate (torch/_inductor/kernel/flex/flex_attention.py, the lowerings of both
operators): forward: `out` (B x Hq x M x Dv, the query's dtype, dense in the query's stride
order), `logsumexp` and `max_scores` (B x Hq x M, fp32 whatever the inputs' dtype; the public API
drops `max_scores` unless asked for it, autograd keeps `out` and `logsumexp`). Backward: `delta`
(B x Hq x M fp32, rowsum(out * grad_out), minus grad_logsumexp when the logsumexp had a
gradient, which then adds its log2-scaled copy) freed after the kernel; `grad_query`,
`grad_value` and `grad_key` (key/value-shaped with the query's batch, dense in each input's stride
order), summed over the batch when key/value were broadcast (Bkv == 1); a gradient for each
`score_mod` buffer that requires one (accumulated in fp32, cast to the buffer's dtype).
What eager torch would run instead (the unfused math path, which materialises the B x H x M x N
scores) is not what a compiled job's GPU does; `create_block_mask` runs as it is (its ops are
ordinary aten ops, recorded as such).

Before the forward operator runs, its autograd rule traces the score_mod into forward and joint
graphs (`create_fw_bw_graph`, with FakeTensors of its own); that tracing runs beneath the
capture's dispatch modes (`flex_attention_graphs` library patch): it allocates nothing on the
GPU, and eager mode's shadow values cannot follow FakeTensors.

In eager mode the outputs' real values come from torch's math implementation of the operator
(`sdpa_dense`; backward: autograd through it) run on the host shadows: the values the kernel
computes, without recording that path's allocations.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor
from torch._higher_order_ops.flex_attention import (
    flex_attention,
    flex_attention_backward,
    sdpa_dense,
    sdpa_dense_backward,
)
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import _disable_current_modes, _get_current_dispatch_mode_stack
from torch.utils._pytree import tree_flatten, tree_map

from peakmem.capture.eager import ShadowExecutor
from peakmem.capture.host_deferred import claim, outputs_kind
from peakmem.capture.library_patches import patched, register_library_patch
from peakmem.capture.recorder_guard import peakmem_modes_off
from peakmem.capture.session import CaptureSession
from peakmem.cuda_rules.true_device import is_meta
from peakmem.trace.vocab import Category

FORWARD_OP = "flex_attention"
BACKWARD_OP = "flex_attention_backward"


def dense_strides_like(size: Sequence[int], like_strides: Sequence[int]) -> list[int]:
    """Dense strides for `size` that fill dimensions in the order of `like_strides` (smallest
    stride first), with the last dimension innermost (inductor's `infer_dense_strides`)."""
    fill_order = sorted(range(len(size)), key=lambda dim: like_strides[dim])
    last = len(size) - 1
    strides = _strides_for(size, fill_order)
    if strides[last] != 1:
        fill_order = [last] + [dim for dim in fill_order if dim != last]
        strides = _strides_for(size, fill_order)
    return strides


def _strides_for(size: Sequence[int], fill_order: Sequence[int]) -> list[int]:
    strides = [0] * len(size)
    current = 1
    for dim in fill_order:
        strides[dim] = current
        current *= size[dim]
    return strides


class _Outputs:
    """Makes a kernel's meta outputs and records them as device allocations (only when the
    inputs are device tensors: a host-deferred or the job's own meta input makes none)."""

    def __init__(self, session: CaptureSession, op: str, inputs: tuple) -> None:
        self.session = session
        self.op = op
        self.kind, self.category = outputs_kind(session, inputs, {})

    def new(self, like: Tensor, size: Sequence[int], strides: Sequence[int] | None = None,
            dtype: torch.dtype | None = None) -> Tensor:
        size = [int(s) for s in size]
        if strides is None:
            strides = _strides_for(size, list(reversed(range(len(size)))))
        tensor = like.new_empty_strided(size, strides, dtype=dtype or like.dtype)
        self.track(tensor)
        return tensor

    def track(self, tensor: Tensor) -> None:
        if not claim(self.session, tensor, self.kind):
            self.session.track(tensor, self.op, self.category)

    def scratch(self, nbytes: int) -> int | None:
        if self.kind != "device":
            return None
        return self.session.scratch(nbytes, category=Category.TEMPORARY.value,
                                    op=f"{self.op}[delta]")


def flex_attention_forward(
    mode: Any,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    score_mod: Callable,
    block_mask: tuple,
    scale: float,
    kernel_options: dict[str, Any],
    score_mod_other_buffers: tuple = (),
    mask_mod_other_buffers: tuple = (),
) -> tuple[Tensor, Tensor, Tensor]:
    if not any(is_meta(t) for t in (query, key, value)):  # host tensors: torch's own path
        return sdpa_dense(query, key, value, score_mod, block_mask, scale, kernel_options,
                          score_mod_other_buffers, mask_mod_other_buffers)
    outputs = _Outputs(mode.session, FORWARD_OP, (query, key, value))
    batch, heads, seq_q, _ = query.shape
    out_size = (batch, heads, seq_q, value.shape[-1])
    out = outputs.new(query, out_size, dense_strides_like(out_size, query.stride()))
    logsumexp = outputs.new(query, (batch, heads, seq_q), dtype=torch.float32)
    max_scores = outputs.new(query, (batch, heads, seq_q), dtype=torch.float32)
    _fill_real_values(
        mode.session, (out, logsumexp, max_scores), sdpa_dense,
        (query, key, value, score_mod, block_mask, scale, kernel_options,
         score_mod_other_buffers, mask_mod_other_buffers),
    )
    return out, logsumexp, max_scores


def flex_attention_backward_kernel(
    mode: Any,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    out: Tensor,
    logsumexp: Tensor,
    grad_out: Tensor | None,
    grad_logsumexp: Tensor | None,
    fw_graph: Callable,
    joint_graph: Any,
    block_mask: tuple,
    scale: float,
    kernel_options: dict[str, Any],
    score_mod_other_buffers: tuple = (),
    mask_mod_other_buffers: tuple = (),
) -> tuple[Tensor, Tensor, Tensor, tuple[Tensor | None, ...]]:
    if not any(is_meta(t) for t in (query, key, value)):  # host tensors: torch's own path
        return sdpa_dense_backward(
            query, key, value, out, logsumexp, grad_out, grad_logsumexp, fw_graph, joint_graph,
            block_mask, scale, kernel_options, score_mod_other_buffers, mask_mod_other_buffers)
    outputs = _Outputs(mode.session, BACKWARD_OP, (query, key, value, out))
    session = mode.session
    batch_q, heads_q, seq_q, qk_dim = query.shape
    batch_kv, heads_kv, seq_kv, v_dim = value.shape
    per_row = batch_q * heads_q * seq_q * 4  # fp32 per query row
    deltas = [outputs.scratch(per_row)]
    if grad_logsumexp is not None:  # its log2-scaled copy, and delta minus it
        deltas += [outputs.scratch(per_row), outputs.scratch(per_row)]
    q_size = (batch_q, heads_q, seq_q, qk_dim)
    grad_query = outputs.new(query, q_size, dense_strides_like(q_size, query.stride()))
    v_size = (batch_q, heads_kv, seq_kv, v_dim)
    grad_value = outputs.new(value, v_size, dense_strides_like(v_size, value.stride()))
    k_size = (batch_q, heads_kv, seq_kv, qk_dim)
    grad_key = outputs.new(key, k_size, dense_strides_like(k_size, key.stride()))
    for ident in deltas:
        if ident is not None:
            session.release(ident)
    if batch_kv != batch_q:  # broadcast key/value: their gradients summed over the batch
        grad_key = outputs.new(key, (1, heads_kv, seq_kv, qk_dim))
        grad_value = outputs.new(value, (1, heads_kv, seq_kv, v_dim))
    buffer_grads = tuple(_buffer_grad(outputs, buffer) for buffer in score_mod_other_buffers)
    _fill_real_values(
        session, (grad_query, grad_key, grad_value, buffer_grads), _math_backward,
        (query, key, value, grad_out, grad_logsumexp, fw_graph, block_mask, scale,
         kernel_options, score_mod_other_buffers, mask_mod_other_buffers),
    )
    return grad_query, grad_key, grad_value, buffer_grads


def _buffer_grad(outputs: _Outputs, buffer: Any) -> Tensor | None:
    if not isinstance(buffer, Tensor) or not buffer.requires_grad:
        return None
    grad = outputs.new(buffer, buffer.shape, dtype=torch.float32)  # accumulated in fp32
    if buffer.dtype != torch.float32:
        grad = outputs.new(buffer, buffer.shape)
    return grad


def _fill_real_values(session: CaptureSession, meta_outputs: tuple, math: Callable[..., Any],
                      args: tuple) -> None:
    """Eager mode: run `math` (torch's implementation of the operator) on the arguments' host
    shadows and copy its results into the meta outputs' shadows. Nothing in fake mode."""
    if not session.eager:
        return
    stack = _get_current_dispatch_mode_stack()
    executor = next((m for m in reversed(stack) if isinstance(m, ShadowExecutor)), None)
    if executor is None:
        return
    with peakmem_modes_off(), _disable_current_modes():
        host_args = tree_map(lambda v: executor.shadow(v) if is_meta(v) else v, args)
        with _ClosedOverShadows(executor):
            real = math(*host_args)
        for meta, value in zip(tree_flatten(meta_outputs)[0], tree_flatten(real)[0], strict=True):
            if is_meta(meta) and isinstance(value, Tensor):
                executor.shadow(meta).copy_(value)


class _ClosedOverShadows(TorchFunctionMode):
    """Device tensors a score_mod / mask_mod reaches other than through its arguments (ALiBi
    slopes, a document-id table, a bias table closed over or global; the constants of the
    graph torch traced from it) take their host shadows when the math path uses them."""

    def __init__(self, executor: ShadowExecutor) -> None:
        super().__init__()
        self.executor = executor

    def __torch_function__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        def host(value: Any) -> Any:
            return self.executor.shadow(value) if isinstance(value, Tensor) and is_meta(value) \
                else value

        return func(*tree_map(host, args), **tree_map(host, kwargs or {}))


_AUTOGRAD_KEYS = (
    torch._C.DispatchKey.AutogradOther,
    torch._C.DispatchKey.AutogradNestedTensor,
    torch._C.DispatchKey.AutogradFunctionality,
)


def _math_backward(query: Tensor, key: Tensor, value: Tensor, grad_out: Tensor | None,
                   grad_logsumexp: Tensor | None, score_mod: Callable, block_mask: tuple,
                   scale: float, kernel_options: dict[str, Any], score_mod_other_buffers: tuple,
                   mask_mod_other_buffers: tuple) -> tuple:
    """The backward operator's results on host tensors: autograd through the math forward (the
    joint graph torch traced holds the capture's meta device). The operator runs below autograd:
    autograd is dispatched again for this host computation."""
    excluded = torch._C._dispatch_tls_local_exclude_set()
    for autograd_key in _AUTOGRAD_KEYS:  # what `_AutoDispatchBelowAutograd` excludes
        excluded = excluded.remove(autograd_key)
    with torch._C._ForceDispatchKeyGuard(torch._C._dispatch_tls_local_include_set(), excluded), \
            torch.enable_grad():
        inputs = [t.detach().requires_grad_() for t in (query, key, value)]
        buffers = [
            b.detach().requires_grad_() if isinstance(b, Tensor) and b.is_floating_point() else b
            for b in score_mod_other_buffers
        ]
        out, logsumexp, _ = sdpa_dense(*inputs, score_mod, block_mask, scale, kernel_options,
                                       tuple(buffers), mask_mod_other_buffers)
        pairs = [(o, g) for o, g in ((out, grad_out), (logsumexp, grad_logsumexp)) if g is not None]
        wanted = inputs + [b for b in buffers if isinstance(b, Tensor) and b.requires_grad]
        grads = torch.autograd.grad([o for o, _ in pairs], wanted, [g for _, g in pairs],
                                    allow_unused=True) if pairs else [None] * len(wanted)
    grads = [torch.zeros_like(w) if g is None else g for g, w in zip(grads, wanted, strict=True)]
    buffer_grads = iter(grads[3:])
    return (*grads[:3], tuple(
        next(buffer_grads) if isinstance(b, Tensor) and b.requires_grad else None for b in buffers
    ))


def _closure_cells(fn: Any, seen: set[int] | None = None) -> list[Any]:
    """The closure cells of `fn` and of the functions it closes over (a score_mod built by a
    helper that closes over another function), each once."""
    seen = set() if seen is None else seen
    if id(fn) in seen or not callable(fn):
        return []
    seen.add(id(fn))
    cells = []
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        cells.append(cell)
        if callable(value) and not isinstance(value, Tensor):
            cells.extend(_closure_cells(value, seen))
    return cells


def lifted_hop_wrapper(hop_wrapper: Callable[..., Any]) -> Callable[..., Any]:
    """flex_attention's `_flex_attention_hop_wrapper`, which torch compiles (Dynamo with the
    eager backend) even for an uncompiled call: Dynamo lifts the tensors a score_mod closes over
    into `score_mod_other_buffers`, so one that requires grad (a learnable bias table) gets its
    gradient. The capture does not run Dynamo: closed-over tensors that require grad are lifted
    here, the score_mod reading the operator's buffers through its closure cells."""

    def lifted(query: Tensor, key: Tensor, value: Tensor, score_mod: Callable, *args: Any,
               **kwargs: Any) -> Any:
        cells = [cell for cell in _closure_cells(score_mod)
                 if isinstance(cell.cell_contents, Tensor) and cell.cell_contents.requires_grad]
        if not cells or len(args) != 3 or kwargs:  # (block_mask, scale, kernel_options)
            return hop_wrapper(query, key, value, score_mod, *args, **kwargs)
        block_mask, scale, kernel_options = args
        buffers = tuple(cell.cell_contents for cell in cells)

        def score_mod_of_buffers(score: Any, b: Any, h: Any, m: Any, n: Any, *given: Any) -> Any:
            originals = [cell.cell_contents for cell in cells]
            for cell, buffer in zip(cells, given, strict=True):
                cell.cell_contents = buffer
            try:
                return score_mod(score, b, h, m, n)
            finally:
                for cell, original in zip(cells, originals, strict=True):
                    cell.cell_contents = original

        return flex_attention(query, key, value, score_mod_of_buffers, block_mask, scale,
                              kernel_options, buffers, ())

    return lifted


HOP_HANDLERS: dict[Any, Callable[..., Any]] = {
    flex_attention: flex_attention_forward,
    flex_attention_backward: flex_attention_backward_kernel,
}
"""Higher-order operator -> its handler under the recorder (called as handler(mode, *args))."""


def register_hop_handlers(mode_class: type) -> None:
    """Register every handler for `mode_class` (once per process: torch refuses a second)."""
    for hop, handler in HOP_HANDLERS.items():
        if mode_class not in hop.python_key_table:
            hop.py_impl(mode_class)(_own_region(handler))


def _own_region(handler: Callable[..., Any]) -> Callable[..., Any]:
    """`handler` run as peakmem's own code: torch calls it with the recorder popped, which the
    torch-function mode must not put back (capture.recorder_guard)."""

    def in_own_region(*args: Any, **kwargs: Any) -> Any:
        with peakmem_modes_off():
            return handler(*args, **kwargs)

    return in_own_region


_HOP_MODULE = "torch._higher_order_ops.flex_attention"  # the package exports the HOP by that name


@register_library_patch("flex_attention_graphs")
@contextmanager
def graphs_traced_beneath_the_capture() -> Iterator[None]:
    """flex_attention's score_mod tracing (`create_fw_bw_graph`) with the dispatch modes off."""
    module = sys.modules.get(_HOP_MODULE)
    original = getattr(module, "create_fw_bw_graph", None)
    if original is None:
        yield
        return

    def create_fw_bw_graph(*args: Any, **kwargs: Any) -> Any:
        with peakmem_modes_off(), _disable_current_modes():
            return original(*args, **kwargs)

    with patched(module, "create_fw_bw_graph", create_fw_bw_graph):
        yield
