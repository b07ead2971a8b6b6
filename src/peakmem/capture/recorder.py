"""A dispatch mode that sees every aten op of the job and records the device storages it creates,
then applies the op's CUDA rule (workspaces, scratch)."""

from __future__ import annotations

import contextlib
import inspect

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from peakmem.capture.session import CaptureSession
from peakmem.cuda_rules import host_outputs_for, op_rule_for
from peakmem.trace.vocab import Category

_HOST_COPY_OPS = {"_to_copy", "copy_", "_copy_from", "_copy_from_and_resize"}


def _op_name(func) -> str:
    return func.__name__ if hasattr(func, "__name__") else str(func)


class AllocationRecorder(TorchDispatchMode):
    def __init__(self, session: CaptureSession) -> None:
        super().__init__()
        self.session = session

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        rule = None if self.session.closed else op_rule_for(func)
        around = None
        if rule is not None and inspect.isgeneratorfunction(rule):
            around = rule(self.session, func, args, kwargs)
            next(around)  # allocations the kernel makes before its outputs
        out = func(*args, **kwargs)
        if self.session.closed:
            return out
        op = _op_name(func)
        host_outputs = host_outputs_for(func)
        skip = {id(t) for t in host_outputs(out)} if host_outputs is not None else set()
        category = None
        if func.overloadpacket.__name__ in _HOST_COPY_OPS and _reads_host(args):
            category = Category.INPUT.value
        flat, _ = tree_flatten(out)
        for tensor in flat:
            if isinstance(tensor, torch.Tensor) and tensor.is_meta and id(tensor) not in skip:
                self.session.track(tensor, op, category)
        if around is not None:
            with contextlib.suppress(StopIteration):
                around.send(out)
        elif rule is not None:
            rule(self.session, func, args, kwargs, out)
        return out


def _reads_host(args) -> bool:
    flat, _ = tree_flatten(args)
    return any(isinstance(t, torch.Tensor) and t.device.type == "cpu" for t in flat)
