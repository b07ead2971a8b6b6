"""Copies of the trained weights kept in sync with them (EMA / averaged models) labelled `ema`.

An EMA model is a second set of weights that no optimizer steps and, often, no forward runs
while training: `deepcopy(model).to(device)` (DiT), diffusers' `EMAModel` shadow tensors
(`p.clone().detach()` moved with `.to(device)`), timm's `ModelEmaV2/V3`,
`torch.optim.swa_utils.AveragedModel`, ema-pytorch. Made by a host-to-device copy or a clone
between steps, their blocks were tagged `input` / `other`. What they are is seen when they are
kept in sync: an in-place write (`copy_`, `add_`, `sub_`, `lerp_` and their `_foreach_` forms)
whose source is a trained parameter, or a value computed from one by elementwise ops
(`p * (1 - decay)`, `s - p`, `decay * e + (1 - decay) * p`), into a tensor that is not itself
trained:
- `e.mul_(d).add_(p.data, alpha=1 - d)` (DiT), `e.lerp_(p, w)` / `_foreach_lerp_` (timm,
  AveragedModel), `s.sub_(w * (s - p))` (diffusers), `e.copy_(d * e + (1 - d) * p)` (timm V2),
  `t.data.mul_(m).add_((1 - m) * s.detach().data)` (DINO's teacher).
That target's block is re-tagged `ema` (from `input`, `other`, `model_copy` — a
`deepcopy(model)` made between steps, capture.model_copies — or `parameter`: a teacher whose
forward runs was tagged a parameter by it; it keeps `ema` from then on, see
`PhaseTracker._classify_module_state`). So is a frozen parameter's new block when the job
replaces its data with such a value (`param_k.data = param_k.data * m + param_q.data * (1 - m)`:
MoCo, BYOL; `replaced`, from capture.module_apply).

Trained parameters are those that received a gradient in a backward (the phase tracker says
which). Only ops between steps are watched (phase `other`) and no-grad forwards (an evaluation,
phase `eval`, or a no-grad forward inside a step):
never the training forward, the backward or an optimizer's step (Lookahead's slow weights are
optimizer state, made and synced inside `step`).
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

from peakmem.capture.session import CaptureSession
from peakmem.trace.vocab import Category, Phase

EMA = Category.EMA.value
_TARGETS = (Category.INPUT.value, Category.OTHER.value, Category.PARAMETER.value,
            Category.MODEL_COPY.value)
"""What a copy's block may be tagged before it is seen kept in sync."""

_REPLACED = (*_TARGETS, Category.TEMPORARY.value, Category.ACTIVATION.value)
"""What a computed block given to a frozen parameter (`param.data = new`) may be tagged."""

_SYNC_OPS = frozenset({"copy_", "add_", "sub_", "lerp_",
                       "_foreach_copy_", "_foreach_add_", "_foreach_sub_", "_foreach_lerp_"})
"""In-place writes that sync `args[0]` (a tensor or a list of them) from `args[1]`."""
_DERIVING_OPS = frozenset({"add", "sub", "mul", "div", "lerp", "clone", "_to_copy",
                           "_foreach_add", "_foreach_sub", "_foreach_mul", "_foreach_div",
                           "_foreach_lerp"})
"""Elementwise ops whose output, of a trained weight's shape, carries that weight's values."""
_SYNC, _DERIVE = 1, 2
_FORWARD, _OTHER, _EVAL = Phase.FORWARD.value, Phase.OTHER.value, Phase.EVAL.value


class WeightCopies:
    """Watches the job's ops (`watch`, from the phase tracker's op hook) for weight copies."""

    def __init__(self, session: CaptureSession) -> None:
        self.session = session
        self._trained: set[int] = set()  # id(storage) of parameters that received a gradient
        self._derived: dict[int, weakref.ref] = {}  # id(storage) of values computed from them
        self._kinds: dict[Any, int] = {}

    def add_trained(self, storages: set[int]) -> None:
        """Storages of parameters that received a gradient in the last backward."""
        self._trained.update(storages)

    def watch(self, func: Any, args: tuple, out: Any) -> None:
        if not self._trained or not args:
            return
        phase = self.session.state.phase
        if phase not in (_OTHER, _EVAL) and (phase != _FORWARD or torch.is_grad_enabled()):
            return  # the training forward, backward, an optimizer's step
        kind = self._kinds.get(func)
        if kind is None:
            name = func.overloadpacket.__name__ if hasattr(func, "overloadpacket") else ""
            kind = self._kinds[func] = (
                _SYNC if name in _SYNC_OPS else _DERIVE if name in _DERIVING_OPS else 0
            )
        if kind == _SYNC and len(args) > 1:
            for target, source in _pairs(args[0], args[1]):
                if self._carries_weights(source) and source.shape == target.shape:
                    self._synced(target)
        elif kind == _DERIVE:
            sources = [t for t in _flat(args) if self._carries_weights(t)]
            if sources:
                shapes = {t.shape for t in sources}
                for result in _flat(out):
                    if result.shape in shapes:
                        self._derive(result)

    def replaced(self, param: torch.Tensor, new: Any) -> bool:
        """`param.data = new` (MoCo's and BYOL's momentum encoders:
        `param_k.data = param_k.data * m + param_q.data * (1 - m)`): a frozen parameter given
        a value computed from the trained weights is a copy kept in sync: its block and the
        new one are re-tagged `ema` (True; called before the swap, so the copy's first blocks,
        a `deepcopy`'s, are `ema` too). A trainable one (`p.data = p.data - lr * p.grad`) is
        not."""
        if param.requires_grad or not self._trained or not self._carries_weights(new):
            return False
        self.session.classify(param, EMA, only_from=_REPLACED)
        self.session.classify(new, EMA, only_from=_REPLACED)
        return True

    def _carries_weights(self, tensor: torch.Tensor) -> bool:
        key = _storage_key(tensor)
        if key is None:
            return False
        if key in self._trained:
            return True
        ref = self._derived.get(key)
        return ref is not None and ref() is not None

    def _derive(self, tensor: torch.Tensor) -> None:
        try:
            storage = tensor.untyped_storage()
        except (RuntimeError, NotImplementedError):
            return
        key = id(storage)
        derived = self._derived

        def forget(ref: weakref.ref, key: int = key) -> None:
            if derived.get(key) is ref:
                del derived[key]

        derived[key] = weakref.ref(storage, forget)

    def _synced(self, target: torch.Tensor) -> None:
        key = _storage_key(target)
        if key is None or key in self._trained:
            return  # a trained weight written from another (`copy_to`, weight loading)
        self.session.classify(target, EMA, only_from=_TARGETS)


def _storage_key(tensor: Any) -> int | None:
    if not isinstance(tensor, torch.Tensor) or tensor.layout != torch.strided:
        return None
    try:
        return id(tensor.untyped_storage())
    except (RuntimeError, NotImplementedError):
        return None


def _flat(value: Any) -> list[torch.Tensor]:
    """The tensors in an op's arguments or outputs (one level of lists, as aten passes them)."""
    if isinstance(value, torch.Tensor):
        return [value]
    found: list[torch.Tensor] = []
    if isinstance(value, list | tuple):
        for item in value:
            if isinstance(item, torch.Tensor):
                found.append(item)
            elif isinstance(item, list | tuple):
                found.extend(t for t in item if isinstance(t, torch.Tensor))
    return found


def _pairs(targets: Any, sources: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(target, source) tensors of an in-place op: one pair, or a `_foreach_` op's lists."""
    if isinstance(targets, torch.Tensor):
        return [(targets, sources)] if isinstance(sources, torch.Tensor) else []
    if isinstance(targets, list | tuple) and isinstance(sources, list | tuple):
        return [(t, s) for t, s in zip(targets, sources, strict=False)
                if isinstance(t, torch.Tensor) and isinstance(s, torch.Tensor)]
    return []
