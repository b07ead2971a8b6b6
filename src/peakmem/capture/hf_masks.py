"""transformers' packed-sequence check answers in a capture as it does on a GPU for a model's own
position ids.

Without a 2-D attention mask and without a cache (a training step on unpadded token ids),
`masking_utils._preprocess_mask_arguments` asks `find_packed_sequence_indices(position_ids)`
whether the batch packs several sequences per row. The function computes
`(diff(position_ids) != 1).cumsum(-1)` and, on a GPU, returns None when no row restarts its
positions: `if not is_tracing(mask) and (mask[:, -1] == 0).all(): return None`. `is_tracing` is
true for a FakeTensor, and a capture's device tensors read placeholder values (their `all()` is
False), so in a capture it always returned the mask: `create_causal_mask` then
could not skip the causal mask (`allow_is_causal_skip = False`) and every attention layer got a
(batch, 1, seq, seq) boolean mask instead of SDPA's `is_causal=True`. On the GPU the model's own
positions (`torch.arange(seq) + past`, GPT-2, Llama, ...) never restart: no mask, and SDPA runs
flash (fp16 / bf16) or memory-efficient attention without a bias. The capture instead ran
memory-efficient attention with a bias that each layer converts and saves for backward (one
batch x seq x seq tensor of the query's dtype per layer: +1 MiB per layer and sample at seq 512
in fp32 on the H200 GPT-2 runs of benchmarks/groundtruth/h200.csv).

Here, when the mask's values are unknown (a capture's device tensor or a FakeTensor, outside torch.compile), the
check answers as for positions that never restart: None. A job that packs sequences and passes
its own restarting `position_ids` without an attention mask is estimated without the packed
mask (its values are not known in a capture either way).

Since capture/known_values.py, a model's own `torch.arange` positions are known values while
every tensor of the check has at most 65,536 elements, and the check computes the GPU's answer
itself; this patch answers for the rest (larger batches, positions computed from unknown
values: tests/capture/test_hf_masks.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor

from peakmem.capture.library_patches import patched, register_library_patch
from peakmem.capture.on_import import Undo, patch_on_import
from peakmem.cuda_rules.true_device import is_meta

MODULE = "transformers.masking_utils"


def values_unknown(tensor: Any) -> bool:
    """A tensor whose values the capture does not have (a device tensor, kept on the meta
    device; a FakeTensor), outside torch.compile (where transformers skips the check on the GPU
    too)."""
    if not isinstance(tensor, torch.Tensor) or torch.compiler.is_compiling():
        return False
    return isinstance(tensor, FakeTensor) or is_meta(tensor)


def _patch_masking_utils(module: Any) -> Undo:
    original = getattr(module, "find_packed_sequence_indices", None)
    if original is None:
        return lambda: None

    def find_packed_sequence_indices(position_ids: Any) -> Any:
        packed = original(position_ids)
        return None if values_unknown(packed) else packed

    stack = ExitStack()
    stack.enter_context(patched(module, "find_packed_sequence_indices", find_packed_sequence_indices))
    return stack.close


@register_library_patch("transformers_unpacked_positions")
@contextmanager
def unpacked_positions() -> Iterator[None]:
    with patch_on_import(MODULE, _patch_masking_utils):
        yield
