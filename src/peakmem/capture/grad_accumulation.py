"""Autograd's gradient accumulation, as the engine does it on CUDA.

When several backward edges feed one input, the engine sums the gradients in the node's input
buffer (torch/csrc/autograd/input_buffer.cpp `accumulate`): with grad mode off, and the buffer
holding the only reference to a dense, non-overlapping gradient (`can_accumulate_inplace`), it
adds the new gradient in place (`old_var.add_(var)`); else out of place (`old_var + var`). Both
checks also ask `isTensorSubclassLike`, which is true for every meta tensor (and every tensor
while a dispatch mode runs): under the capture the engine always adds out of place, and every
residual branch of a network gets a gradient-sized temporary in backward that the GPU run never
allocates (seen in H100 allocator snapshots of transformer jobs).

The capture marks where the engine is between nodes: a backward call installs a pre-hook (a
node's work begins) and a post-hook (it ends) on every node of the graph it runs, removed when
it returns. The pre-hook also names the node whose formula runs (`current_node`, e.g.
"GatherBackward0"), for the backward formulas' in-place branches (capture/in_place_branches.py).
An `add.Tensor` the engine makes between nodes, with grad mode off, is an accumulation; the
session then replays it as in place if the old buffer's storage is released right after the
add (the engine drops the old value as soon as the sum replaces it: the buffer held the only
reference, CUDA's `can_accumulate_inplace`): the sum's allocation is withdrawn and the old
allocation lives on as the sum's (session.CaptureSession.expect_accumulation).

Not replayed: sums shaped like a leaf of the graph (a parameter used twice, e.g. tied input and
output embeddings). On an H100 (torch 2.11) such jobs (GPT-2, BERT, T5, Llama 3.2 1B) measured
one weight-sized block more than the in-place replay gives; why the engine adds out of place
there is not established, so those sums stay as the capture sees them (out of place).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch

from peakmem.capture.replaced_methods import ORIGINAL

_local = threading.local()


@dataclass(frozen=True)
class NodeWork:
    """A node's own work is running (its pre-hook ran, its post-hook not yet)."""

    name: str
    """The node's `name()`, e.g. "GatherBackward0" (capture/in_place_branches.py)."""


def _stack() -> list[Any]:
    """This thread's frames: a backward call's frame (the layouts of its graph's leaves), or
    a `NodeWork` while a node works; nested backward calls (reentrant checkpointing) nest."""
    stack = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    return stack


def engine_frame() -> frozenset[tuple[tuple[int, ...], Any]] | None:
    """Where the autograd engine runs between two nodes of a backward call (where it accumulates
    gradients, not inside a node's own work): the (shape, dtype) of that graph's leaves; else
    None."""
    stack = _stack()
    return stack[-1] if stack and not isinstance(stack[-1], NodeWork) else None


def between_nodes() -> bool:
    """Whether the autograd engine runs here between two nodes of a backward call."""
    return engine_frame() is not None


def current_node() -> str | None:
    """The name of the autograd node whose own work runs here (its backward formula), e.g.
    "GatherBackward0"; None outside a node's work (forward, or the engine between nodes)."""
    stack = _stack()
    return stack[-1].name if stack and isinstance(stack[-1], NodeWork) else None


def _pre_hook(work: NodeWork, _grad_outputs: Any) -> None:
    _stack().append(work)


def _post_hook(_grad_inputs: Any, _grad_outputs: Any) -> None:
    stack = _stack()
    if stack and isinstance(stack[-1], NodeWork):
        stack.pop()


def graph_nodes(roots: Iterable[Any]) -> list[Any]:
    """Every autograd node reachable from `roots` (grad_fn objects), each once."""
    seen: set[int] = set()
    nodes: list[Any] = []
    todo = [root for root in roots if root is not None]
    while todo:
        node = todo.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        nodes.append(node)
        todo.extend(nxt for nxt, _ in node.next_functions if nxt is not None)
    return nodes


def backward_roots(func: Any, args: tuple, kwargs: dict) -> list[Any]:
    """The grad_fn of the tensors a backward call differentiates (`Tensor.backward(self)`,
    `torch.autograd.backward(tensors)`, `torch.autograd.grad(outputs)`)."""
    if func is ORIGINAL["backward"]:
        first = args[0] if args else kwargs.get("self")
        tensors: Any = [first]
    else:
        tensors = args[0] if args else kwargs.get("tensors", kwargs.get("outputs"))
    if isinstance(tensors, torch.Tensor):
        tensors = [tensors]
    return [getattr(t, "grad_fn", None) for t in (tensors or []) if isinstance(t, torch.Tensor)]


@contextmanager
def engine_marked(roots: Iterable[Any]) -> Iterator[None]:
    """Mark, for the duration of one backward call, when the engine is between nodes."""
    nodes = graph_nodes(roots)
    handles = []
    for node in nodes:
        try:
            handles.append(node.register_prehook(partial(_pre_hook, NodeWork(node.name()))))
            handles.append(node.register_hook(_post_hook))
        except (RuntimeError, AttributeError, TypeError):
            continue  # a node that takes no hooks: its work counts as the engine's
    leaves = frozenset(
        (tuple(node.variable.shape), node.variable.dtype)
        for node in nodes if hasattr(node, "variable")
    )
    stack = _stack()
    depth = len(stack)
    stack.append(leaves)
    try:
        yield
    finally:
        del stack[depth:]
        for handle in handles:
            handle.remove()
