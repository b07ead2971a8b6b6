"""Copies of a model's weights made between steps are labelled `model_copy` in the breakdown.

A best-weights snapshot (`best = copy.deepcopy(model.state_dict())`, the torchvision fine-tuning
tutorial), a state_dict cloned or cast for a checkpoint (`{k: v.clone()}`, `v.half()`), a
`copy.deepcopy(model)` kept aside: each is a clone / `_to_copy` of a parameter or buffer (or a
`copy_` of one into a fresh block). Made between steps, their blocks were tagged `other`; made
right after an evaluation, before its phase ended with its top-level module, they were tagged
like the forward's and became `activation` when the next training backward started.

Here the output of such an op is re-tagged `model_copy` when its source is tagged a weight
(`parameter`, `buffer`, `ema` or itself a `model_copy`) and the op runs outside any forward,
backward or optimizer step (phase `other`, or a forward phase under `no_grad` with no module
running: a pre-training validation's phase lasts until the first backward). Later owners win:
a copy that a forward then runs is `parameter` (PhaseTracker._classify_module_state), one kept
in sync with the trained weights is `ema` (capture.weight_copies), a frozen one is `parameter`
(capture.frozen_weights), one an optimizer steps is `parameter`.

A weight is known as one once its module's forward ran (or an optimizer stepped it), or, before
that, when its module was moved to the device (`model.to(device)`: its parameters' blocks stay
`input` until a forward claims them, but they are the model's; `moved`, from
capture.module_apply). A copy of parameters made on the device directly
(`nn.Linear(..., device="cuda")`) before their first forward stays `other`.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch

from peakmem.capture.session import CaptureSession
from peakmem.trace.vocab import Category, Phase

MODEL_COPY = Category.MODEL_COPY.value
_INPUT = Category.INPUT.value
WEIGHTS = frozenset({Category.PARAMETER.value, Category.BUFFER.value, Category.EMA.value,
                     MODEL_COPY})
"""What a copy's source is tagged when it is a model's weight."""
_UNCLAIMED = (Category.OTHER.value, Category.TEMPORARY.value)
"""What the copy's new block is tagged by its op (`other` between steps, `temporary` in a
forward phase)."""
_OUT_OF_PLACE = frozenset({"clone", "_to_copy"})
_INTO = frozenset({"copy_"})
_OTHER, _FORWARD = Phase.OTHER.value, Phase.FORWARD.value


class ModelCopies:
    """Watches the job's ops (`watch`, from the phase tracker's op hook) for weight copies.
    `in_module` says whether a module's forward is running."""

    def __init__(self, session: CaptureSession, in_module: Callable[[], bool]) -> None:
        self.session = session
        self._in_module = in_module
        self._kinds: dict[Any, int] = {}  # 0: not a copy, 1: out of place, 2: into args[0]
        self._moved: dict[int, weakref.ref] = {}  # id(storage) of parameters moved to the device
        self._pending: list[weakref.ref] = []  # storages of copies the last op made

    def moved(self, params: Any) -> None:
        """Parameters a module's `_apply` just moved to the device (their blocks are `input`
        until a forward claims them): their storages are weights."""
        moved = self._moved
        for param in params:
            if not isinstance(param, torch.Tensor) or not param.is_meta:
                continue
            try:
                storage = param.untyped_storage()
            except (RuntimeError, NotImplementedError):
                continue
            key = id(storage)

            def forget(ref: weakref.ref, key: int = key) -> None:
                if moved.get(key) is ref:
                    del moved[key]

            moved[key] = weakref.ref(storage, forget)

    def watch(self, func: Any, args: tuple, out: Any) -> None:
        if self._pending:
            self.flush()
        kind = self._kinds.get(func)
        if kind is None:
            name = func.overloadpacket.__name__ if hasattr(func, "overloadpacket") else ""
            kind = self._kinds[func] = 1 if name in _OUT_OF_PLACE else 2 if name in _INTO else 0
        if not kind or not args or not self._between_steps():
            return
        if kind == 1:
            source, copy = args[0], out
        elif len(args) > 1:
            source, copy = args[1], args[0]
        else:
            return
        if not (
            isinstance(source, torch.Tensor)
            and isinstance(copy, torch.Tensor)
            and copy.numel() == source.numel()
            and self._is_weight(source)
        ):
            return
        if kind == 1:
            # the op's output is tracked by the recorder after this hook (if it is device
            # memory): classified at the next op, or when the capture ends (`flush`); by its
            # storage (weakly: nothing is kept alive), which outlives the tensor when the job
            # wraps it anew (`Parameter.__deepcopy__`)
            try:
                self._pending.append(weakref.ref(copy.untyped_storage()))
            except (RuntimeError, NotImplementedError):
                return
        else:
            self.session.classify(copy, MODEL_COPY, only_from=_UNCLAIMED)

    def flush(self) -> None:
        """Classify the copies the last op made (now tracked, if they are device memory)."""
        pending, self._pending = self._pending, []
        for ref in pending:
            storage = ref()
            if storage is not None:
                self.session.classify_storage(storage, MODEL_COPY, only_from=_UNCLAIMED)

    def _between_steps(self) -> bool:
        phase = self.session.state.phase
        if phase == _OTHER:
            return True
        return phase == _FORWARD and not torch.is_grad_enabled() and not self._in_module()

    def _is_weight(self, tensor: torch.Tensor) -> bool:
        category = self._category(tensor)
        if category in WEIGHTS:
            return True
        if category != _INPUT or not self._moved:
            return False
        ref = self._moved.get(id(tensor.untyped_storage()))
        return ref is not None and ref() is not None

    def _category(self, tensor: torch.Tensor) -> str | None:
        session = self.session
        if tensor.layout != torch.strided or not tensor.is_meta:
            return None
        try:
            record = session.live.get(id(tensor.untyped_storage()))
        except (RuntimeError, NotImplementedError):
            return None
        if record is None:
            return None
        tag = session.trace.tag_of(record.alloc_index)
        return None if tag is None else tag.category
