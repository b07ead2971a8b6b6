"""`torch.einsum` of three or more device operands without opt_einsum: noted.

torch.einsum contracts its operands in the order opt_einsum's path finder gives when the
`opt_einsum` package is installed (and `torch.backends.opt_einsum.enabled`); without it, left to
right, whose intermediates can be far larger than the operands (timm's Kron optimizer, which
warns it is "unusable without" opt_einsum: its preconditioner contraction over a 512 x 512 x 3
x 3 convolution weight makes an outer product of two 512 x 512 factors first, 256 GiB in
float32). The capture runs the job's einsum as torch would here, so the trace holds those
intermediates; the note says why, and what changes the estimate.
"""

from __future__ import annotations

from typing import Any

import torch

from peakmem.capture.arg_tensors import tensors_in
from peakmem.capture.tensor_overrides import register_override
from peakmem.cuda_rules.true_device import is_meta

NOTE = (
    "torch.einsum contracted {count} operands on the device left to right: the opt_einsum "
    "package is not installed here (or torch.backends.opt_einsum.enabled is off), so torch "
    "did not optimize the contraction order and its intermediates, as traced, can be much "
    "larger than the operands (timm's Kron optimizer calls itself unusable without "
    "opt_einsum); install opt_einsum where the job runs, then estimate again"
)


def path_optimized() -> bool:
    """Whether torch.einsum picks its contraction order with opt_einsum."""
    backend = torch.backends.opt_einsum
    return bool(backend.is_available() and backend.enabled)


@register_override([torch.einsum])
def einsum_noting_unoptimized_paths(mode: Any, func: Any, args: tuple, kwargs: dict) -> Any:
    operands = tensors_in(args[1:])
    if len(operands) >= 3 and not path_optimized() and any(is_meta(t) for t in operands):
        notes = mode.session.notes
        if not any(note.startswith("torch.einsum contracted") for note in notes):
            notes.append(NOTE.format(count=len(operands)))
    return func(*args, **kwargs)
