"""Inputs an older torch's autograd saved for backward where the torch the capture runs does not.

The capture runs the installed torch's autograd formulas; a target stack whose formulas saved
more (stack profile `saved_inputs`, each entry with its PyTorch issue or PR) is modelled by
holding the op's input until the op's backward node has run: the reference lives in the node's
metadata (so it dies with the graph when no backward runs) and a post-hook on the node drops it
right after the node ran, when the older engine released the node's saved variables
(`release_variables()` after `call_function`). Saved-tensor hooks in force apply to it as to any
saved variable: non-reentrant checkpointing keeps a handle and recomputes it in backward,
reentrant checkpointing runs the forward without grad (nothing is held) and its recomputation
holds it as the older torch did.
"""

from __future__ import annotations

from typing import Any

import torch

from peakmem.cuda_rules.registry import RuleContext

METADATA_KEY = "peakmem.saved_inputs"


def keep_saved_inputs(ctx: RuleContext, op_name: str, inputs: tuple[Any, ...], out: Any) -> Any:
    """Hold `inputs` (the tensors among them) until `out`'s backward node has run, where the
    target stack lists `op_name` in `saved_inputs`; returns `out` unchanged."""
    if op_name not in getattr(ctx.stack, "saved_inputs", {}):
        return out
    node = out.grad_fn if isinstance(out, torch.Tensor) else None
    if node is None:
        return out
    held: list[Any] = [t for t in inputs if isinstance(t, torch.Tensor)]
    hooks = torch._C._autograd._top_saved_tensors_default_hooks(False)
    if hooks is not None:
        # As a SavedVariable would be: packed by the saved-tensor hooks in force (non-reentrant
        # checkpointing keeps only a handle and recomputes; CPU offloading moves it to the
        # host) and unpacked when the node runs.
        pack, unpack = hooks
        held = [pack(t) for t in held]
    else:
        unpack = None
    node.metadata.setdefault(METADATA_KEY, []).append(held)

    def release(_grad_inputs: Any, _grad_outputs: Any) -> None:
        if unpack is not None:
            for packed in held:
                unpack(packed)
        held.clear()

    node.register_hook(release)
    return out
