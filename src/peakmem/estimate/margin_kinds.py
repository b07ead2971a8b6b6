"""Which calibrated safety margin an estimate states: one kind per family of jobs whose errors
were fitted on a declared calibration split of their own (bench/calibration.py), first match wins.

A stack profile holds one `safety_margin.<gpu>.<kind>` per kind; a kind without a figure for the
stack falls back to that stack's `default` margin (profiles/loader.py `safety_margin_for`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

DEFAULT_KIND = "default"

# aten ops (overload packets) of the fused attention kernels: a job that runs one is an
# attention job (Transformer encoders, Hugging Face models on SDPA)
FUSED_ATTENTION_OPS = frozenset({
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_cudnn_attention",
    "_efficient_attention_forward",
    "_flash_attention_forward",
})


@dataclass(frozen=True)
class JobSignature:
    """What an estimate knows about the kind of job: the libraries it loaded and the aten ops
    (overload packet names) whose allocations its trace records."""

    libraries: frozenset[str]
    ops: frozenset[str]


@dataclass(frozen=True)
class MarginKind:
    name: str
    description: str
    applies: Callable[[JobSignature], bool]


MARGIN_KINDS: tuple[MarginKind, ...] = (
    MarginKind(
        "cudnn_convolution",
        "jobs that convolve through cuDNN (its workspace model's error dominates)",
        lambda job: "cudnn_convolution" in job.libraries,
    ),
    MarginKind(
        "attention",
        "jobs that run a fused attention kernel (Transformer encoders and decoders)",
        lambda job: not job.ops.isdisjoint(FUSED_ATTENTION_OPS),
    ),
)


def op_packets(op_names: Iterable[str | None]) -> frozenset[str]:
    """Trace tag op names ("addmm.default") as overload packet names ("addmm")."""
    return frozenset(name.split(".", 1)[0] for name in op_names if name)


def margin_kind(libraries: Iterable[str], ops: Iterable[str] = ()) -> str:
    """The first kind in MARGIN_KINDS whose test the job passes, else `default`."""
    job = JobSignature(frozenset(libraries), frozenset(ops))
    for kind in MARGIN_KINDS:
        if kind.applies(job):
            return kind.name
    return DEFAULT_KIND
