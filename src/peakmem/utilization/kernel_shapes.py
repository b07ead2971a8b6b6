"""Kernel launch shapes: per op, the grid (blocks), block (threads), shared memory and registers of
the CUDA kernel(s) it launches, and from the GPU profile's per-SM limits its occupancy (resident
blocks per SM), waves and SM fill.

A registry from kernel kind to a shape rule; the kind comes from the op's name (softmax, layer
norm, batch norm, pooling) or else from its family (utilization.op_costs):

- GEMM / convolution / attention: a cuBLAS/CUTLASS-style output tile per block, the largest tile
  that still gives every SM a block (assumed tile attributes below), split-K for a small output
  with a long reduction.
- Elementwise: TensorIterator's `gpu_kernel`, 128 threads x 4 elements per block.
- Reductions: ATen's `setReduceConfig` (aten/src/ATen/native/cuda/Reduce.cuh): at most 512
  threads, a block of `block_width x block_height` from powers of two of the reduced and output
  sizes, 4-wide vector loads along a contiguous reduced dimension, the input split across warps
  when each thread keeps >= 16 values, and across blocks (`ctas_per_output`) when threads would
  keep >= 256 values and the outputs are too few to fill the GPU.
- Softmax: the persistent warp softmax for rows of <= 1024 elements (128 threads, one or two rows
  per warp), else one block per row (`SoftMax_getBlockSize`: ILP 4, up to 1024 threads).
- Layer norm: one block of 128 threads per row. Batch norm: one block of 512 threads per channel
  (`batch_norm_collect_statistics`) for the statistics.
- Foreach (multi_tensor_apply): 512 threads per 65536-element chunk, at most 48 tensors and 320
  blocks per launch.

Occupancy: resident blocks per SM = min(blocks limit, warps limit / warps per block, shared
memory per SM / per block, registers per SM / per block). A kernel of B blocks with k resident
per SM on S SMs runs ceil(B / (S k)) waves; the last partial wave leaves SMs idle or
under-occupied, which lowers SM activity and occupancy.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

WARP = 32
REGISTERS_PER_SM = 65536  # every compute capability >= 5.0 (CUDA C++ Programming Guide)
REGISTER_GRANULE = 256  # registers are allocated per warp in units of 256


@dataclass(frozen=True)
class SmLimits:
    """Per-SM limits of a GPU profile (throughput table)."""

    sms: int
    max_warps: int
    max_blocks: int
    shared_bytes: int
    registers: int = REGISTERS_PER_SM

    @classmethod
    def of(cls, gpu: Any) -> SmLimits:
        t = gpu.throughput or {}
        return cls(
            sms=int(gpu.sm_count.value),
            max_warps=int(t.get("max_warps_per_sm", 64)),
            max_blocks=int(t.get("max_blocks_per_sm", 32)),
            shared_bytes=int(t.get("shared_memory_kb_per_sm", 100) * 1024),
            registers=int(t.get("registers_per_sm", REGISTERS_PER_SM)),
        )


@dataclass(frozen=True)
class Launch:
    """One op's kernel: grid blocks, threads per block, shared memory per block (bytes),
    registers per thread, and the number of launches it takes (foreach)."""

    blocks: float
    threads: int
    shared_bytes: int = 0
    registers: int = 32
    launches: float = 1.0


# -- cuBLAS / cuDNN tiles: (output elements per block, threads, shared bytes, registers) ------
# assumed: typical attributes of cuBLAS SIMT SGEMM and CUTLASS tensor-core kernels
# (128x128 / 128x64 / 64x64 / 64x32 / 32x32 output tiles, as Nsight Compute lists them)
TILES: tuple[tuple[int, int, int, int], ...] = (
    (16384, 256, 48 * 1024, 128),
    (8192, 128, 48 * 1024, 128),
    (4096, 128, 40 * 1024, 96),
    (2048, 128, 24 * 1024, 80),
    (1024, 64, 20 * 1024, 64),
)
SPLIT_K_MIN = 256  # a split keeps at least this much of the reduction (K)
ELEMENTWISE_THREADS = 128
ELEMENTS_PER_THREAD = 4
MAX_REDUCE_THREADS = 512
REDUCE_VECTOR = 4
MIN_VALUES_PER_THREAD = 16
MAX_VALUES_PER_THREAD = 256
FOREACH_CHUNK = 65536
FOREACH_THREADS = 512
FOREACH_TENSORS_PER_LAUNCH = 48
FOREACH_BLOCKS_PER_LAUNCH = 320
SOFTMAX_PERSISTENT_MAX = 1024
SOFTMAX_ILP = 4
NORM_THREADS = 512
LAYER_NORM_THREADS = 128
POOL_THREADS = 256


def _div_up(a: float, b: float) -> int:
    return max(math.ceil(a / max(b, 1)), 0)


def _last_pow2(n: int) -> int:
    return 1 << (max(int(n), 1).bit_length() - 1)


def _next_pow2(n: int) -> int:
    return 1 << max(int(n) - 1, 0).bit_length()


@dataclass
class OpView:
    """What a shape rule reads of one op."""

    flops: float
    work: float  # output elements (foreach: all elements)
    reduced: float  # reductions: input elements per output (0: not recorded)
    inner: bool
    tensors: float
    bytes: float


def matrix_launch(op: OpView, limits: SmLimits) -> Launch:
    work = max(op.work, 1.0)
    tile = TILES[-1]
    for candidate in TILES:  # the largest tile that still gives every SM a block
        if _div_up(work, candidate[0]) >= limits.sms:
            tile = candidate
            break
    tiles = _div_up(work, tile[0])
    depth = op.flops / (2 * work)
    split = int(np.clip(np.floor(depth / SPLIT_K_MIN), 1, _div_up(2 * limits.sms, tiles)))
    return Launch(tiles * split, tile[1], tile[2], tile[3])


def elementwise_launch(op: OpView, limits: SmLimits) -> Launch:
    per_block = ELEMENTWISE_THREADS * ELEMENTS_PER_THREAD
    return Launch(_div_up(max(op.work, 1), per_block), ELEMENTWISE_THREADS, 0, 32)


def reduce_config(num_outputs: int, inputs_per_output: int, inner: bool, limits: SmLimits) -> Launch:
    """ATen's setReduceConfig (Reduce.cuh) for a contiguous float input: grid and block."""
    num_outputs, inputs_per_output = max(int(num_outputs), 1), max(int(inputs_per_output), 1)
    if inner:  # block.x along the reduced dimension
        dim0, dim1 = inputs_per_output, num_outputs
        if dim0 > 128:
            dim0 //= REDUCE_VECTOR  # vectorize along the input
    else:  # block.x along the outputs (vectorised 4 wide)
        dim0, dim1 = _div_up(num_outputs, REDUCE_VECTOR), inputs_per_output
    output_vec = 1 if inner else REDUCE_VECTOR
    max_threads = MAX_REDUCE_THREADS // output_vec
    dim0_pow2 = _last_pow2(dim0) if dim0 < max_threads else max_threads
    dim1_pow2 = _last_pow2(dim1) if dim1 < max_threads else max_threads
    width = min(dim0_pow2, WARP)
    height = min(dim1_pow2, max_threads // width)
    width = min(dim0_pow2, max_threads // height)
    threads = width * height
    step_input, step_output = 1, 1
    if inner:
        step_input *= width  # split the input across lanes
    else:
        step_output *= width  # split the outputs across lanes
    split_warps = False
    values = _div_up(inputs_per_output, step_input)
    if values >= height * 16 or values >= MAX_VALUES_PER_THREAD:
        step_input *= height  # split the input across warps (shared-memory reduction)
        split_warps = True
    else:
        step_output *= height
    grid = _div_up(_div_up(num_outputs, output_vec), step_output)
    values = _div_up(inputs_per_output, step_input)
    target = limits.sms * max(limits.max_warps * WARP // threads, 1)
    ctas = 1
    if split_warps and values >= MAX_VALUES_PER_THREAD and grid <= target:
        ctas = max(min(_div_up(target, grid), _div_up(values, MIN_VALUES_PER_THREAD)),
                   _div_up(values, MAX_VALUES_PER_THREAD))
    shared = threads * 4 * output_vec if split_warps or inner else 0
    return Launch(grid * ctas, threads, shared, 32)


def reduce_launch(op: OpView, limits: SmLimits) -> Launch:
    outputs = max(op.work, 1)
    per_output = op.reduced if op.reduced > 0 else max(op.bytes / 4 / outputs - 1, 1)
    return reduce_config(int(outputs), int(per_output), op.inner, limits)


def softmax_launch(op: OpView, limits: SmLimits) -> Launch:
    """Softmax over rows of `reduced` elements (work = all elements)."""
    size = int(op.reduced) if op.reduced > 0 else 1
    rows = _div_up(max(op.work, 1), size)
    if size <= SOFTMAX_PERSISTENT_MAX and op.inner:
        width = min(_next_pow2(size), WARP)
        per_warp = 2 if _next_pow2(size) <= 128 else 1
        warps = 128 // width
        return Launch(_div_up(rows, warps * per_warp), 128, 0, 64)
    threads = 1
    while threads < min(size // SOFTMAX_ILP, 1024):
        threads *= 2
    threads = max(threads, WARP)
    return Launch(rows, threads, threads * 4 // WARP * 4, 32)


def layer_norm_launch(op: OpView, limits: SmLimits) -> Launch:
    size = int(op.reduced) if op.reduced > 0 else 1
    return Launch(_div_up(max(op.work, 1), size), LAYER_NORM_THREADS, 0, 40)


def batch_norm_launch(op: OpView, limits: SmLimits) -> Launch:
    size = int(op.reduced) if op.reduced > 0 else 1
    channels = _div_up(max(op.work, 1), size)
    return Launch(channels, NORM_THREADS, NORM_THREADS * 8, 32)


def pool_launch(op: OpView, limits: SmLimits) -> Launch:
    return Launch(_div_up(max(op.work, 1), POOL_THREADS), POOL_THREADS, 0, 32)


def foreach_launch(op: OpView, limits: SmLimits) -> Launch:
    chunks = op.tensors + np.floor(op.work / FOREACH_CHUNK)
    launches = max(_div_up(op.tensors, FOREACH_TENSORS_PER_LAUNCH),
                   _div_up(chunks, FOREACH_BLOCKS_PER_LAUNCH), 1)
    return Launch(chunks, FOREACH_THREADS, 0, 32, float(launches))


# kernel kinds (codes in utilization.model's arrays)
MATRIX, ELEMENTWISE, REDUCE, SOFTMAX, LAYER_NORM, BATCH_NORM, POOL, FOREACH = range(8)
RULES: dict[int, Callable[[OpView, SmLimits], Launch]] = {
    MATRIX: matrix_launch,
    ELEMENTWISE: elementwise_launch,
    REDUCE: reduce_launch,
    SOFTMAX: softmax_launch,
    LAYER_NORM: layer_norm_launch,
    BATCH_NORM: batch_norm_launch,
    POOL: pool_launch,
    FOREACH: foreach_launch,
}
_KIND_BY_NAME: dict[str, int] = {}


def register_kind(kind: int, *names: str) -> None:
    for name in names:
        _KIND_BY_NAME[name] = kind


register_kind(SOFTMAX, "_softmax", "_log_softmax", "_softmax_backward_data",
              "_log_softmax_backward_data")
register_kind(LAYER_NORM, "native_layer_norm", "native_layer_norm_backward", "_fused_rms_norm",
              "_fused_rms_norm_backward", "native_group_norm", "native_group_norm_backward")
register_kind(BATCH_NORM, "native_batch_norm", "native_batch_norm_backward",
              "_native_batch_norm_legit", "_native_batch_norm_legit_functional",
              "_native_batch_norm_legit_no_training", "cudnn_batch_norm",
              "cudnn_batch_norm_backward")
register_kind(POOL, "adaptive_avg_pool2d", "_adaptive_avg_pool2d", "_adaptive_avg_pool2d_backward",
              "avg_pool2d", "avg_pool2d_backward", "max_pool2d_with_indices",
              "max_pool2d_with_indices_backward", "embedding_dense_backward", "nll_loss_forward",
              "nll_loss_backward")
_KIND_BY_FAMILY = {"gemm": MATRIX, "conv": MATRIX, "attn": MATRIX, "elem": ELEMENTWISE,
                   "red": REDUCE, "foreach": FOREACH}


def kind_of(name: str, family: str) -> int:
    """The kernel kind of an op: by name for the kernels with their own launch rule, else by
    family."""
    if family == "red" and name in _KIND_BY_NAME:
        return _KIND_BY_NAME[name]
    return _KIND_BY_FAMILY.get(family, ELEMENTWISE)


def resident_blocks(launch: Launch, limits: SmLimits) -> int:
    """Blocks of this kernel resident on one SM at a time (>= 1)."""
    warps = _div_up(launch.threads, WARP)
    by_blocks = limits.max_blocks
    by_warps = limits.max_warps // max(warps, 1)
    by_shared = limits.shared_bytes // launch.shared_bytes if launch.shared_bytes else by_blocks
    per_warp = _div_up(launch.registers * WARP, REGISTER_GRANULE) * REGISTER_GRANULE
    by_registers = limits.registers // max(per_warp * warps, 1)
    return max(min(by_blocks, by_warps, by_shared, by_registers), 1)


@dataclass(frozen=True)
class Waves:
    """A kernel's execution in waves: their count, the time-weighted share of SMs with a block
    (SM activity while it runs), and the mean resident warps per SM / the SM's maximum
    (theoretical occupancy while it runs)."""

    waves: int
    sm_fill: float
    occupancy: float


def waves_of(launch: Launch, limits: SmLimits) -> Waves:
    """Wave quantisation: B blocks, k resident per SM, S SMs run ceil(B / (S k)) waves of equal
    time; the last holds the remaining blocks, spread over min(remaining, S) SMs."""
    per_launch = max(launch.blocks / max(launch.launches, 1.0), 1.0)
    k = resident_blocks(launch, limits)
    capacity = limits.sms * k
    waves = _div_up(per_launch, capacity)
    full = int(per_launch // capacity)
    rest = per_launch - full * capacity
    active = (full * limits.sms + min(rest, limits.sms)) / (waves * limits.sms)
    warps = _div_up(launch.threads, WARP)
    resident = (full * capacity + rest) * warps / (waves * limits.sms)
    return Waves(waves, float(active), float(min(resident / limits.max_warps, 1.0)))
