"""transformers' `generate` ends at its max length in a capture.

The decoding loops (`GenerationMixin._sample`, beam search) stop when
`_has_unfinished_sequences(this_peer_finished, ...)` says so, and `this_peer_finished` is
`unfinished_sequences.max() == 0`, a device value: fake mode reads it as False, so the loop
never ended, even past `max_length` (a job's evaluation that generates hung until its timeout).
Reaching the max length is known on the host from the shape of `input_ids`
(`MaxLengthCriteria`): once a `StoppingCriteriaList` call sees it, every sequence is finished on
a GPU too, and the next `_has_unfinished_sequences` answers False. End-of-sequence tokens and
other value-driven criteria stay unknown in fake mode (generation runs to its max length, the
longest it can run).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

from peakmem.capture.library_patches import patched, register_library_patch
from peakmem.capture.on_import import Undo, patch_on_import

_reached = threading.local()


def _max_length_reached(criteria: Any, input_ids: Any) -> bool:
    max_length = getattr(criteria, "max_length", None)
    shape = getattr(input_ids, "shape", None)
    return isinstance(max_length, int) and bool(shape) and shape[-1] >= max_length


def _patch_stopping_criteria(module: Any) -> Undo:
    criteria_list = module.StoppingCriteriaList
    original = criteria_list.__call__

    def call(self: Any, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
        if _max_length_reached(self, input_ids):
            _reached.value = True
        return original(self, input_ids, scores, **kwargs)

    return _swap(criteria_list, "__call__", call)


def _patch_generation_mixin(module: Any) -> Undo:
    mixin = module.GenerationMixin
    original = mixin._has_unfinished_sequences

    def has_unfinished(self: Any, *args: Any, **kwargs: Any) -> bool:
        if getattr(_reached, "value", False):
            _reached.value = False
            return False
        return original(self, *args, **kwargs)

    return _swap(mixin, "_has_unfinished_sequences", has_unfinished)


def _swap(owner: Any, name: str, value: Any) -> Undo:
    stack = ExitStack()
    stack.enter_context(patched(owner, name, value))
    return stack.close


@register_library_patch("transformers_generate_max_length")
@contextmanager
def generate_ends_at_max_length() -> Iterator[None]:
    with ExitStack() as stack:
        stack.enter_context(patch_on_import("transformers.generation.stopping_criteria",
                                            _patch_stopping_criteria))
        stack.enter_context(patch_on_import("transformers.generation.utils", _patch_generation_mixin))
        _reached.value = False
        yield
