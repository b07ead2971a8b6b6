"""Ops whose output size depends on tensor values (`nonzero`, boolean-mask indexing) cannot know
it on fake tensors. The capture bounds them from above: every element counts as selected, so the
estimate never undercounts what such an op allocates."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch.fx.experimental._config as fx_config

from peakmem.cuda_rules.registry import register_runtime_patch


@register_runtime_patch("data_dependent_upper_bounds")
@contextmanager
def assume_all_selected() -> Iterator[None]:
    previous = fx_config.meta_nonzero_assume_all_nonzero
    fx_config.meta_nonzero_assume_all_nonzero = True
    try:
        yield
    finally:
        fx_config.meta_nonzero_assume_all_nonzero = previous
