"""Kernel launch shapes: per op, the grid (blocks), block (threads), shared memory and registers of
the CUDA kernel(s) it launches, and from the GPU profile's per-SM limits its occupancy (resident
blocks per SM), waves and SM fill.

A registry from kernel kind to a shape rule; the kind comes from the op's name (softmax, layer
norm, batch norm, pooling) or else from its family (utilization.op_costs):

- GEMM / convolution / attention: a cuBLAS/CUTLASS-style output tile per block (assumed tile
  attributes below), split-K for a small output with a long reduction; the largest tile unless
  a smaller one's waves keep clearly more SMs busy (wave quantisation, as cuBLAS's heuristics).
- Elementwise: TensorIterator's `gpu_kernel`, 128 threads x 4 elements per block.
- Reductions: ATen's `setReduceConfig` (aten/src/ATen/native/cuda/Reduce.cuh): at most 512
  threads (a thread vectorised along the outputs keeps vt0 = 4 loads in flight), a block of
  `block_width x block_height` from powers of two of the reduced and output sizes, 4-wide vector loads along a contiguous reduced dimension, the input split across warps
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
per SM on S SMs runs ceil(B / (S k)) waves. Blocks resident on one SM share its throughput once
they saturate it: a block alone draws a share s = min(1, warps x loads in flight /
SATURATING_WARPS_PER_SM) of it, so j co-resident blocks take max(1, j s) block-times. A short
last wave thus costs a fraction of a full one; SMs idle in it lower SM activity and occupancy.
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
SATURATING_WARPS_PER_SM = 16  # resident warps an SM needs to keep DRAM busy, one 16 B load
# in flight per thread (Little's law: fewer warps with more loads in flight each draw as much)
TILE_LOADS_IN_FLIGHT = 4  # a GEMM tile's thread: two double-buffered stages of 2 x 16 B loads


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
    registers per thread, the number of launches it takes (foreach), and the 16-byte loads each
    thread keeps in flight (memory-level parallelism: 1 for a vectorised elementwise thread)."""

    blocks: float
    threads: int
    shared_bytes: int = 0
    registers: int = 32
    launches: float = 1.0
    loads_in_flight: float = 1.0


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
FILL_MARGIN = 0.05  # SM fill a smaller tile must gain over a larger one to be chosen
ELEMENTWISE_THREADS = 128
ELEMENTS_PER_THREAD = 4
MAX_REDUCE_THREADS = 512
REDUCE_VECTOR = 4
REDUCE_UNROLL = 4  # Reduce.cuh's vt0: loads a thread issues before it reduces them
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
    """cuBLAS's heuristics weigh wave quantisation: for each output tile (largest first) with
    its split-K (a small output with a long reduction is split until about two blocks per SM),
    the SM fill of its waves (waves_of); the largest tile is kept unless a smaller one keeps at
    least FILL_MARGIN more of the SMs busy."""
    work = max(op.work, 1.0)
    depth = op.flops / (2 * work)
    best: tuple[float, Launch] | None = None
    for tile in TILES:
        tiles = _div_up(work, tile[0])
        split = int(np.clip(np.floor(depth / SPLIT_K_MIN), 1, _div_up(2 * limits.sms, tiles)))
        launch = Launch(tiles * split, tile[1], tile[2], tile[3], 1.0, TILE_LOADS_IN_FLIGHT)
        fill = waves_of(launch, limits).sm_fill
        if best is None or fill > best[0] + FILL_MARGIN:
            best = (fill, launch)
    assert best is not None
    return best[1]


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
    # "vectorize along output": a thread's unrolled loop issues vt0 = 4 loads of 4 outputs'
    # values before it adds any (thread_reduce_impl); along the input, one 4-wide load at a time
    loads = REDUCE_UNROLL if not inner else 1.0
    return Launch(grid * ctas, threads, shared, 32, 1.0, loads)


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


def block_share(launch: Launch) -> float:
    """The share of an SM's throughput one block of the kernel can draw alone."""
    warps = _div_up(launch.threads, WARP)
    return min(1.0, warps * launch.loads_in_flight / SATURATING_WARPS_PER_SM)


def waves_of(launch: Launch, limits: SmLimits) -> Waves:
    """Wave quantisation with shared SMs: B blocks, k resident per SM, S SMs; j blocks resident
    on one SM take u(j) = max(1, j s) block-times (s: block_share). `full` whole waves take
    u(k) each; the remaining blocks spread over the SMs (q + 1 on r of them, q on the others)
    take u(q + 1) (u(q) when r = 0). SM fill: the SMs' busy time over S x the kernel's time;
    occupancy: resident warps x their time over S x max warps x the kernel's time."""
    per_launch = max(launch.blocks / max(launch.launches, 1.0), 1.0)
    k = resident_blocks(launch, limits)
    sms = limits.sms
    capacity = sms * k
    waves = _div_up(per_launch, capacity)
    full = int(per_launch // capacity)
    rest = per_launch - full * capacity
    q, r = int(rest // sms), rest - int(rest // sms) * sms
    share = block_share(launch)

    def units(j: float) -> float:
        return max(1.0, j * share) if j > 0 else 0.0

    time = full * units(k) + units(q + 1 if r > 0 else q)
    busy = full * sms * units(k) + r * units(q + 1) + (sms - r) * units(q)
    warps = _div_up(launch.threads, WARP)
    resident = (full * capacity * units(k) + r * (q + 1) * units(q + 1)
                + (sms - r) * q * units(q)) * warps
    return Waves(
        waves,
        float(min(busy / (sms * time), 1.0)),
        float(min(resident / (sms * time * limits.max_warps), 1.0)),
    )
