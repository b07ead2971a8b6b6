"""transformers behaviours of the release installed where the job is to run, where that release
is older than the one the capture imports and the difference changes what the GPU allocates.

The target release is named by the environment variable `PEAKMEM_TRANSFORMERS_RELEASE` (e.g.
``5.17.0``; unset: the installed release is the target, nothing changes). It is read at each
call, so an `env NAME=VALUE` prefix of the estimated command works as well as the caller's
environment.

Behaviours, one registry entry each (first release without the old behaviour, what it did):

- `create_position_bias_mask` (integrations/sdpa_attention.py, T5 and its family through SDPA):
  up to 5.19 it returned the position bias, or `torch.where(mask, position_bias, min)`, in the
  layout of `T5Attention.compute_bias`, `embedding(buckets).permute([2, 0, 1]).unsqueeze(0)`:
  the heads' dimension has stride 1 and the keys' dimension stride `heads`. 5.20 returns
  `.contiguous()`. On CUDA every fused SDPA backend needs a mask whose last dimension has stride
  1 (sdp_utils_cpp.h `check_last_dim_stride_equals_1_dense`), so up to 5.19 the encoder and
  decoder self-attention layers of a T5 run the math path (cuda_rules/sdpa.py), which saves the
  float32 softmax, the dropout mask and the dropout output for backward (9 B per batch x heads x
  queries x keys element, bf16 autocast included: the math path computes in float32); from 5.20
  they run memory-efficient attention, which saves none of that, plus one contiguous
  (1, heads, queries, keys) copy of the bias per layer. The cross-attention's bias (zeros) is
  contiguous in both.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from peakmem.capture.library_patches import patched, register_library_patch
from peakmem.capture.on_import import Undo, patch_on_import
from peakmem.release_numbers import leading_numbers

RELEASE_VARIABLE = "PEAKMEM_TRANSFORMERS_RELEASE"


def parse_release(text: str) -> tuple[int, ...]:
    """`5.17.0` -> (5, 17, 0); a suffix after the numbers (`5.17.0.dev0`, `5.17.0rc1`) is
    dropped. Text that does not start with a number raises InputError (a ValueError) naming
    the variable."""
    try:  # 5000 digits: int() refuses more than sys.get_int_max_str_digits()
        parts = leading_numbers(text) if len(text) <= 64 else ()
    except ValueError:
        parts = ()
    if not parts:
        from peakmem.inputs import InputError, one_line

        raise InputError(f"{RELEASE_VARIABLE}={one_line(repr(text), 60)} is not a release "
                         "number (use e.g. 5.17.0)")
    return parts


def target_release() -> tuple[int, ...] | None:
    """The release named by `PEAKMEM_TRANSFORMERS_RELEASE`, None when unset or empty."""
    text = os.environ.get(RELEASE_VARIABLE, "").strip()
    return parse_release(text) if text else None


def runs_older_than(release: tuple[int, ...]) -> bool:
    """The target release is older than `release` (never when no target is named)."""
    target = target_release()
    return target is not None and target < release


def position_bias_mask_as_is(position_bias: torch.Tensor, attention_mask: torch.Tensor | None,
                             is_causal: bool, query: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    """transformers <= 5.19's `create_position_bias_mask`: the same values as later releases,
    in the layout the position bias and `torch.where` give (no `.contiguous()`)."""
    min_dtype = torch.finfo(key.dtype).min
    if attention_mask is None:
        if not is_causal:
            return position_bias
        q_length, kv_length = query.shape[2], key.shape[2]
        causal = (torch.arange(q_length, device=key.device)[:, None]
                  >= torch.arange(kv_length, device=key.device)[None, :])
        return torch.where(causal.view(1, 1, q_length, kv_length), position_bias, min_dtype)
    if attention_mask.dtype == torch.bool:
        return torch.where(attention_mask, position_bias, min_dtype)
    return position_bias + attention_mask


@dataclass(frozen=True)
class ReleaseBehaviour:
    module: str
    function: str
    fixed_in: tuple[int, ...]
    """The first release with the installed behaviour."""
    old: Callable[..., Any]


BEHAVIOURS: dict[str, ReleaseBehaviour] = {
    "sdpa_position_bias_layout": ReleaseBehaviour(
        "transformers.integrations.sdpa_attention", "create_position_bias_mask", (5, 20),
        position_bias_mask_as_is),
}


def _apply(behaviour: ReleaseBehaviour) -> Callable[[Any], Undo]:
    def apply(module: Any) -> Undo:
        original = getattr(module, behaviour.function, None)
        if original is None:
            return lambda: None

        def chosen(*args: Any, **kwargs: Any) -> Any:
            use = behaviour.old if runs_older_than(behaviour.fixed_in) else original
            return use(*args, **kwargs)

        stack = ExitStack()
        stack.enter_context(patched(module, behaviour.function, chosen))
        return stack.close

    return apply


@register_library_patch("transformers_target_release")
@contextmanager
def transformers_target_release() -> Iterator[None]:
    target_release()  # a malformed value fails here, before the job runs
    with ExitStack() as stack:
        for behaviour in BEHAVIOURS.values():
            stack.enter_context(patch_on_import(behaviour.module, _apply(behaviour)))
        yield
