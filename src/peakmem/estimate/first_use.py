"""The device memory outside PyTorch's caching allocator that a job's kernels bring in on first
use (issue 6): a base (the CUDA context and the first kernel) plus, per kernel family the job
runs, the bytes that family's first launch added in the measured first-use table
(benchmarks/first_use_probe.py -> benchmarks/groundtruth/<gpu>_first_use.csv).

The figures live in the stack profile, per GPU (`[first_use_bytes.<gpu>]`: `base` and one entry
per family, each with its `source`); which aten ops belong to which family is the registry
FIRST_USE_FAMILIES below. cuDNN's convolution kernels are not in it: the capture charges them
through `library_bytes.<gpu>.cudnn_convolution` when it sees a convolution (cuda_rules/).

Under lazy module loading (CUDA 11.7+, torch's default) the driver places kernel images in
device memory in 2 MiB pages as they are first launched, so small families share pages and a
family's delta depends on what ran before (see docs/context.md for the table and its findings).
A family the table measured at nothing has an entry of 0 that says so; a family without an entry
for the GPU adds nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from peakmem.profiles.loader import GpuProfile, StackProfile

BASE = "base"
"""The `[first_use_bytes.<gpu>]` key of the context and first kernel (before any family)."""


@dataclass(frozen=True)
class FirstUseFamily:
    name: str
    ops: frozenset[str] | None
    """aten overload packets whose allocations in the trace show the family ran ("mm"), or
    packets at a dtype ("mm:bf16", from the capture's per-op cost record); None: every job that
    launches kernels (the elementwise / reduction / optimizer kernels all jobs run)."""
    description: str
    loaded_with: frozenset[str] = frozenset()
    """ops whose presence means the family's pages are already there (a job that runs them
    adds nothing for this family)."""


FIRST_USE_FAMILIES: dict[str, FirstUseFamily] = {}


def register(
    name: str, ops: Iterable[str] | None, description: str, loaded_with: Iterable[str] = ()
) -> FirstUseFamily:
    if name in FIRST_USE_FAMILIES or name == BASE:
        raise ValueError(f"first-use family {name!r} registered twice")
    family = FirstUseFamily(
        name, None if ops is None else frozenset(ops), description, frozenset(loaded_with)
    )
    FIRST_USE_FAMILIES[name] = family
    return family


GEMM_OPS = ("mm", "addmm", "bmm", "baddbmm", "addbmm", "addmv", "mv", "_addmm_activation")
CONVOLUTION_OPS = ("convolution", "convolution_backward", "cudnn_convolution", "_convolution")

register(
    "torch_kernels",
    None,
    "torch's own elementwise, reduction, loss and optimizer kernels every training job runs",
)
register(
    "cublas_gemm",
    (*GEMM_OPS, "matmul", "linear", "_scaled_mm", "_int_mm"),
    "cuBLAS / cuBLASLt GEMM kernels and handles (one per thread: forward and autograd's)",
)
register("batched_gemm", ("bmm", "baddbmm"), "cuBLAS batched GEMM kernels")
register(
    "sdpa_efficient",
    ("_scaled_dot_product_efficient_attention", "_efficient_attention_forward"),
    "memory-efficient SDPA kernels (fp32 attention, attention with a mask or bias)",
)
register(
    "sdpa_flash",
    ("_scaled_dot_product_flash_attention", "_flash_attention_forward"),
    "flash-attention SDPA kernels (bf16 / fp16 attention)",
)
register(
    "sdpa_cudnn",
    ("_scaled_dot_product_cudnn_attention", "_cudnn_attention_forward"),
    "cuDNN attention (bf16 / fp16 attention where the torch release prefers it: sm 9.0 / 10.x "
    "with torch 2.11, cuda_rules/sdpa.py)",
)
register("avg_pool", ("avg_pool2d", "avg_pool3d"), "average pooling kernels")
register(
    "fused_optimizer",
    ("_fused_adam_", "_fused_adamw_", "_fused_sgd_", "_fused_adagrad_"),
    "the optimizers' fused kernels (fused=True)",
)
register(
    "grad_scaler",
    ("_amp_foreach_non_finite_check_and_unscale_", "_amp_update_scale_"),
    "GradScaler's unscale / inf check and scale update kernels",
)
register(
    "bf16_gemm",
    [f"{op}:bf16" for op in GEMM_OPS],
    "bf16 tensor-core GEMM kernels (not separable in the first-use table: chosen on the "
    "calibration split; a job that convolves measured nothing more for them)",
    loaded_with=CONVOLUTION_OPS,
)


def job_ops(capture: Any) -> frozenset[str]:
    """What a capture ran, for the registry: the aten overload packets of its trace's
    allocations ("addmm") and, from its per-op cost record of a training step, each op at its
    dtype ("addmm:bf16")."""
    from peakmem.estimate.margin_kinds import op_packets
    from peakmem.utilization.kernel_families import META_KEY

    ops = set(op_packets(tag.op for tag in capture.trace.tags))
    record = capture.trace.meta.get(META_KEY)
    if isinstance(record, dict) and isinstance(record.get("ops"), list):
        for op in record["ops"]:
            if isinstance(op, list) and len(op) > 5 and isinstance(op[0], str):
                ops.update((op[0], f"{op[0]}:{op[5]}"))
    return frozenset(ops)


def families_run(ops: Iterable[str]) -> tuple[str, ...]:
    """The registered families a job with these aten ops (overload packets) runs, in registry
    order."""
    seen = frozenset(ops)
    return tuple(
        name
        for name, family in FIRST_USE_FAMILIES.items()
        if (family.ops is None or not family.ops.isdisjoint(seen))
        and family.loaded_with.isdisjoint(seen)
    )


def first_use_bytes(stack: StackProfile, gpu: GpuProfile, ops: Iterable[str],
                    environ: Mapping[str, str] | None = None) -> dict[str, int]:
    """Per family the job runs: the bytes its first use adds outside the allocator on `gpu`
    (families without an entry for the GPU add nothing); {} where the GPU has no table or the
    job loads modules eagerly (`environ`: the job's, capture.job_module_loading)."""
    table = stack.first_use_table(gpu, environ)
    if BASE not in table:
        return {}
    return {name: int(table[name].value) for name in families_run(ops) if name in table}


