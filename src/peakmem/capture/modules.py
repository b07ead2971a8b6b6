"""Which module is running, in forward and in backward, without keeping any tensor alive.

`torch.utils.module_tracker.ModuleTracker` attaches hooks that reference module inputs and
outputs; those closures form reference cycles with autograd's graph, so activations are only
freed by Python's garbage collector, long after a GPU run frees them. Here forward uses global
module hooks and a stack of names; backward attaches one pre-hook per output `grad_fn` whose
closure holds only a one-element list with the module name (also kept in the node's metadata so
the innermost module wins when modules share an output node).
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

import torch

from peakmem.capture.arg_tensors import tensors_in

_METADATA_KEY = "peakmem_module"


COMPILED_WRAPPER = "_orig_mod"
"""The submodule an OptimizedModule (`torch.compile(module)`) wraps: left out of module names, so
a compiled model's modules are named as the model's own (`GPT.transformer.h.0`, not
`OptimizedModule._orig_mod.transformer.h.0`)."""


def _compiled_module(module: torch.nn.Module) -> torch.nn.Module:
    """The module a (possibly repeated) torch.compile wrapper wraps; `module` itself otherwise."""
    while isinstance(module, _optimized_module_class()):
        module = module.__dict__["_modules"][COMPILED_WRAPPER]
    return module


def _optimized_module_class() -> type:
    dynamo = sys.modules.get("torch._dynamo.eval_frame")
    return getattr(dynamo, "OptimizedModule", _NoClass)


class _NoClass:
    """Nothing is an instance of it (Dynamo not imported: no OptimizedModule exists)."""


def _without_compiled_wrappers(name: str) -> str:
    if COMPILED_WRAPPER not in name:
        return name
    return ".".join(part for part in name.split(".") if part != COMPILED_WRAPPER)


class ModulePaths:
    def __init__(self, on_root: Callable[[torch.nn.Module], None] | None = None) -> None:
        self.names: dict[int, str] = {}
        self.roots: weakref.WeakValueDictionary[int, torch.nn.Module] = weakref.WeakValueDictionary()
        self._forward: list[str] = []
        self.backward_module: str | None = None
        self.in_backward = False
        self._on_root = on_root
        self._stack = ExitStack()

    def __enter__(self) -> ModulePaths:
        hooks = torch.nn.modules.module
        self._stack.callback(hooks.register_module_forward_pre_hook(self._pre).remove)
        self._stack.callback(
            hooks.register_module_forward_hook(self._post, always_call=True).remove
        )
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def current(self) -> str | None:
        if self.in_backward:
            return self.backward_module
        return self._forward[-1] if self._forward else None

    def in_forward(self) -> bool:
        """Whether a module's forward is running (outside backward)."""
        return bool(self._forward) and not self.in_backward

    def name_of(self, module: torch.nn.Module) -> str | None:
        return self.names.get(id(module))

    # -- hooks ---------------------------------------------------------------------------------
    def _register_root(self, module: torch.nn.Module) -> None:
        self.roots[id(module)] = module
        prefix = type(_compiled_module(module)).__name__
        named = []
        for name, sub in module.named_modules():
            if id(sub) not in self.names:
                name = _without_compiled_wrappers(name)
                self.names[id(sub)] = f"{prefix}.{name}" if name else prefix
                named.append(id(sub))
        # the job may delete the model (diffusers' DreamBooth: `del pipeline` after generating
        # its class images): nothing here keeps it, or its device memory, alive, and its ids
        # are forgotten with it (a new module may reuse one)
        weakref.finalize(module, self._forget, named)
        if self._on_root is not None:
            self._on_root(module)

    def _forget(self, ids: list[int]) -> None:
        for key in ids:
            self.names.pop(key, None)

    def _pre(self, module: torch.nn.Module, args: Any) -> None:
        if id(module) not in self.names:
            self._register_root(module)
        self._forward.append(self.names[id(module)])

    def _post(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        name = self.names.get(id(module))
        if self._forward and self._forward[-1] == name:
            self._forward.pop()
        if name is None or not torch.is_grad_enabled():
            return
        for tensor in tensors_in(output):
            if tensor.grad_fn is not None:
                self._mark_backward_entry(tensor.grad_fn, name)

    def _mark_backward_entry(self, node: Any, name: str) -> None:
        holder = node.metadata.get(_METADATA_KEY)
        if holder is not None:
            if name.count(".") > holder[0].count("."):
                holder[0] = name
            return
        holder = [name]
        node.metadata[_METADATA_KEY] = holder

        def enter(grad_outputs: Any, holder: list[str] = holder) -> None:
            self.backward_module = holder[0]

        node.register_prehook(enter)
