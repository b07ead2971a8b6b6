"""Gradient accumulation windows: how many batches feed one optimizer step.

A shortened DataLoader epoch (capture.dataloader) must still reach the steady state of training:
at least `STEADY_STEPS` optimizer steps, the later ones with the optimizer state already
allocated. With gradient accumulation a step takes a whole window of W batches, so the epoch
yields `max(STEADY_BATCHES, STEADY_STEPS * W)` full batches before it skips to its last one.

Frameworks that count batches themselves from `len(loader)` (Hugging Face `Trainer`, Lightning)
must see a length consistent with what the epoch yields, so their window has to be known when
they ask for the length: a registry of `WindowSource`s reads it from the framework's objects in
the frames that ask (`Trainer.args.gradient_accumulation_steps`, Lightning's
`trainer.accumulate_grad_batches`). Loops that count for themselves
(`if (i + 1) % accum == 0: opt.step()`, accelerate's `accumulate()`) need no length: their
epoch keeps yielding full batches until it has fed `STEADY_STEPS` steps (`MAX_WAIT_BATCHES` at
most).
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable
from typing import Any

STEADY_STEPS = 2
"""Optimizer steps a shortened training epoch feeds before it skips to its last batch."""
MAX_WINDOW = 256
"""The largest accumulation window read from a framework (a larger one is capped)."""
MAX_WAIT_BATCHES = STEADY_STEPS * MAX_WINDOW + 1
"""Full batches a training epoch yields at most while it waits for its steps."""
FRAMES = 12
"""How many caller frames `window_in_callers` looks through."""

WindowSource = Callable[[dict[str, Any]], "int | None"]
WINDOW_SOURCES: dict[str, WindowSource] = {}


def register_window_source(name: str) -> Callable[[WindowSource], WindowSource]:
    def decorator(source: WindowSource) -> WindowSource:
        if name in WINDOW_SOURCES:
            raise ValueError(f"window source {name!r} is already registered")
        WINDOW_SOURCES[name] = source
        return source

    return decorator


def _positive_int(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return None
    return min(value, MAX_WINDOW)


@register_window_source("transformers.Trainer")
def _hf_trainer(frame_locals: dict[str, Any]) -> int | None:
    """Hugging Face `Trainer` (and TRL's trainers): `args.gradient_accumulation_steps`."""
    for holder in (frame_locals.get("args"), getattr(frame_locals.get("self"), "args", None)):
        if holder is not None and any(
            cls.__name__ == "TrainingArguments" for cls in type(holder).__mro__
        ):  # TrainingArguments and its subclasses (Seq2SeqTrainingArguments, TRL's SFTConfig)
            window = _positive_int(getattr(holder, "gradient_accumulation_steps", None))
            if window is not None:
                return window
    return None


@register_window_source("lightning.Trainer")
def _lightning_trainer(frame_locals: dict[str, Any]) -> int | None:
    """Lightning's `Trainer.accumulate_grad_batches` (the fit loop's `trainer`)."""
    for holder in (frame_locals.get("trainer"), getattr(frame_locals.get("self"), "trainer", None)):
        module = type(holder).__module__ if holder is not None else ""
        if module.startswith(("lightning", "pytorch_lightning")):
            window = _positive_int(getattr(holder, "accumulate_grad_batches", None))
            if window is not None:
                return window
    return None


def window_in_callers(skip: int = 2) -> int | None:
    """The accumulation window a framework in the calling frames declares (None: none does)."""
    try:
        frame = sys._getframe(skip)
    except ValueError:
        return None
    for _ in range(FRAMES):
        if frame is None:
            break
        window = _window_in_frame(frame)
        if window is not None:
            return window
        frame = frame.f_back
    return None


SOURCE_NAMES = frozenset({"args", "self", "trainer"})
"""The local names the registered sources read: a function frame without any is not read."""
_SNAPSHOT_LOCALS = sys.version_info < (3, 13)
"""Python < 3.13 materialises a function frame's `f_locals` as a dict kept on the frame, which
holds references to its locals (a training loop's previous batch) until the frame ends."""


def _window_in_frame(frame: Any) -> int | None:
    code = frame.f_code
    function = bool(code.co_flags & inspect.CO_OPTIMIZED)
    if function and SOURCE_NAMES.isdisjoint(code.co_varnames + code.co_cellvars):
        return None  # reading f_locals would keep this frame's locals alive: nothing to read
    frame_locals = frame.f_locals
    try:
        for source in WINDOW_SOURCES.values():
            try:
                window = source(frame_locals)
            except Exception:  # a framework object that does not answer: not this one
                window = None
            if window is not None:
                return window
        return None
    finally:
        if function and _SNAPSHOT_LOCALS and type(frame_locals) is dict:
            # drop the snapshot's references (the frame's real locals are untouched), so that
            # looking never keeps a tensor alive longer than the job would
            frame_locals.clear()
