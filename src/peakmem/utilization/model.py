"""The timing model of one steady-state training iteration, and the utilization it implies.

Input: the per-op costs of one full training step (utilization.observer, in the trace's
metadata), a GPU's peak rates (profile `[throughput]`) and the fitted parameters (params.toml).

1. Each kernel's duration is a roofline: max(FLOPs / achieved FLOP/s, bytes / achieved
   bandwidth) + a fixed minimum, where the achieved rate is the unit's peak (FP32 SIMT for FP32
   matmuls, TF32 tensor cores for FP32 cuDNN convolutions, FP16/BF16 tensor cores) times a fitted
   efficiency times the fraction of SMs the kernel's grid can fill (small kernels).
2. Each kernel's launch shape (utilization.kernel_shapes: grid, block, shared memory and
   registers per kernel kind; Reduce.cuh's reduce config for reductions) and the GPU's per-SM
   limits give its occupancy and waves: the share of SMs it keeps active (SM activity, and the
   `fill` of step 1) and its resident warps (occupancy). After each kernel the GPU idles a
   fitted share of the profile's launch overhead. FP32 convolutions on TF32 tensor cores get
   memory-bound NCHW <-> NHWC conversion kernels beside them (a fitted hypothesis).
3. A host timeline launches the kernels: each op costs the host a fitted dispatch time per phase
   (forward ops through Python modules, backward ops from the autograd engine, optimizer foreach
   launches); the GPU runs a kernel when it was launched and the previous one ended. Host reads of
   device values (`.item()`) wait for the GPU. The DataLoader's work (host ops, random data) and
   the host-to-device copy of the batch come first, in the loop, or in parallel when the loader
   has worker processes.
4. From the timeline: iteration time T, GRACT = kernel time / T, SMACT = SM-time-weighted
   activity / T, SMOCC = resident warps / max warps / T, DRAMA = bytes / (bandwidth x T),
   FP32A = FP32-pipe time / T.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any

import numpy as np

from peakmem.utilization.kernel_families import (
    ATTENTION,
    CONV,
    ELEMENTWISE,
    FOREACH,
    GEMM,
    REDUCTION,
)
from peakmem.utilization.kernel_shapes import RULES as LAUNCH_RULES
from peakmem.utilization.kernel_shapes import (
    SATURATING_WARPS_PER_SM,
    Launch,
    OpView,
    SmLimits,
    elementwise_launch,
    kind_of,
    waves_of,
)

PARAMS_FILE = "params.toml"


@dataclass(frozen=True)
class ModelParams:
    """The model's free parameters (fitted on the declared split; utilization.fit)."""

    host_forward_us: float = 12.0
    """Host time per forward-phase op (Python module call + dispatch)."""
    host_backward_us: float = 6.0
    """Host time per backward op (the autograd engine's C++ thread)."""
    host_optimizer_us: float = 12.0
    """Host time per optimizer op (foreach launch, Python optimizer code)."""
    host_step_us: float = 150.0
    """Host time per iteration outside the ops (loop, zero_grad, optimizer bookkeeping)."""
    host_param_us: float = 1.0
    """Host time per parameter tensor per iteration (zero_grad, grouping tensors)."""
    loader_op_us: float = 3.0
    """DataLoader: host time per host-side op (indexing, collation)."""
    loader_random_ns_per_byte: float = 0.8
    """DataLoader: host time per byte of random data made per sample."""
    loader_ns_per_byte: float = 0.3
    """DataLoader: host time per byte of the other host tensors it makes (collation copies)."""
    loader_batch_us: float = 300.0
    """DataLoader with worker processes: the training loop's time to receive a batch (queue,
    unpickling shared-memory handles, the pin-memory thread's handoff)."""
    kernel_min_us: float = 2.0
    """GPU time of the smallest kernel (launch to completion)."""
    gemm_efficiency: float = 0.7
    """Achieved fraction of the unit's peak FLOP/s by a matmul that fills the GPU."""
    conv_efficiency: float = 0.5
    """The same for cuDNN convolutions (TF32 tensor cores for FP32 on Ampere and later)."""
    memory_efficiency: float = 0.8
    """Achieved fraction of peak DRAM bandwidth by a memory-bound kernel that fills the GPU."""
    achieved_occupancy: float = 0.7
    """Achieved / theoretical resident warps of a running kernel."""
    fp32_per_element: float = 2.0
    """FP32 pipe operations per element of an elementwise / reduction kernel."""
    tensor_fp32_share: float = 0.1
    """FP32 pipe time of a tensor-core kernel, per unit of its tensor time (epilogues)."""
    h2d_gbps: float = 10.0
    """Host-to-device copy rate of a batch (pageable memory)."""
    launch_gap_share: float = 0.5
    """Share of the GPU profile's per-kernel launch overhead during which the GPU idles between
    two dependent kernels (the launch term)."""
    conv_layout_share: float = 0.5
    """Hypothesis: cuDNN's NCHW <-> NHWC conversions around a tensor-core convolution move this
    many times the convolution's own bytes, in memory-bound kernels of their own."""
    steady_share: float = 1.0
    """Share of a run's sampled time that is steady-state training: a sampler's mean over a
    whole run (DCGM's non-zero 1 s samples of a ~60 s job) also covers start-up and teardown,
    which dilute every metric by this factor (1: the steady state alone)."""

    @classmethod
    def names(cls) -> list[str]:
        return list(cls.__dataclass_fields__)

    def vector(self) -> list[float]:
        return [float(getattr(self, name)) for name in self.names()]


@cache
def fitted_params() -> ModelParams:
    """The parameters in utilization/params.toml (the defaults where a key is missing)."""
    try:
        text = resources.files("peakmem.utilization").joinpath(PARAMS_FILE).read_text("utf-8")
    except FileNotFoundError:
        return ModelParams()
    table = tomllib.loads(text).get("params", {})
    known = {k: float(v) for k, v in table.items() if k in ModelParams.names()}
    return ModelParams(**known)


@dataclass(frozen=True)
class Utilization:
    """Predicted DCGM-style means over the steady-state iterations (0..1) and their period."""

    gract: float
    smact: float
    smocc: float
    drama: float
    fp32a: float
    iteration_seconds: float
    assumptions: list[str] = field(default_factory=list, compare=False)

    def to_json(self) -> dict[str, float]:
        return {
            "gract": round(self.gract, 4),
            "smact": round(self.smact, 4),
            "smocc": round(self.smocc, 4),
            "drama": round(self.drama, 4),
            "fp32a": round(self.fp32a, 4),
            "iteration_seconds": float(f"{self.iteration_seconds:.6g}"),
        }

    def line(self) -> str:
        return (
            f"GRACT {self.gract:.2f}  SMACT {self.smact:.2f}  SMOCC {self.smocc:.2f}  "
            f"DRAMA {self.drama:.2f}  FP32A {self.fp32a:.2f}  "
            f"iteration {1e3 * self.iteration_seconds:.3g} ms"
        )


@dataclass(frozen=True)
class GpuRates:
    sms: int
    fp32: float  # FLOP/s
    tf32: float
    fp16: float
    bf16: float
    bandwidth: float  # bytes/s
    max_warps: int
    max_blocks: int
    limits: SmLimits
    launch_overhead: float  # seconds per kernel launch

    @classmethod
    def of(cls, gpu: Any) -> GpuRates:
        t = gpu.throughput
        if not t:
            raise ValueError(f"GPU profile {gpu.name} has no [throughput] table")
        return cls(
            sms=int(gpu.sm_count.value),
            fp32=t["fp32_tflops"] * 1e12,
            tf32=t.get("tf32_tflops", t["fp32_tflops"]) * 1e12,
            fp16=t.get("fp16_tflops", t["fp32_tflops"]) * 1e12,
            bf16=t.get("bf16_tflops", t["fp32_tflops"]) * 1e12,
            bandwidth=t["memory_gbps"] * 1e9,
            max_warps=int(t.get("max_warps_per_sm", 64)),
            max_blocks=int(t.get("max_blocks_per_sm", 32)),
            limits=SmLimits.of(gpu),
            launch_overhead=t.get("launch_overhead_us", 2.5) * 1e-6,
        )


# -- the step's ops as arrays ------------------------------------------------------------------
_FAMILY_CODE = {GEMM: 0, CONV: 1, ATTENTION: 2, ELEMENTWISE: 3, REDUCTION: 4, FOREACH: 5}
_PHASE_CODE = {"forward": 0, "backward": 1, "optimizer": 2}
MAX_OPS = 200_000
MAX_VALUE = 2.0**63


class StepFormatError(ValueError):
    """The trace's utilization record is missing or malformed."""


@dataclass(frozen=True)
class StepOps:
    """One training step's kernels, column-wise."""

    family: np.ndarray
    flops: np.ndarray
    bytes: np.ndarray
    work: np.ndarray
    dtype: np.ndarray  # 0 f32, 1 f16, 2 bf16, 3 other
    tensors: np.ndarray
    kind: np.ndarray  # kernel kind (utilization.kernel_shapes)
    reduced: np.ndarray  # reductions: input elements folded per output (1 otherwise)
    inner: np.ndarray  # reductions: folded along the contiguous dimension (bool)
    phase: np.ndarray  # 0 forward/other, 1 backward, 2 optimizer
    syncs: np.ndarray  # host reads (syncs) before each op
    host_ops: int
    host_bytes: int
    host_random_bytes: int
    input_bytes: int
    steady: bool

    @classmethod
    def from_meta(cls, record: Any) -> StepOps:
        """Parse the (untrusted) record a capture wrote; StepFormatError when malformed."""
        if not isinstance(record, dict) or record.get("version") != 1:
            raise StepFormatError("no per-op cost record of a training step in the trace")
        ops, phases, syncs = record.get("ops"), record.get("phases"), record.get("syncs_before")
        if not (isinstance(ops, list) and isinstance(phases, list) and isinstance(syncs, list)):
            raise StepFormatError("malformed per-op cost record")
        if not len(ops) == len(phases) == len(syncs) or len(ops) > MAX_OPS:
            raise StepFormatError("malformed per-op cost record")
        columns: list[list[float]] = [[] for _ in range(9)]
        for op in ops:
            if (
                not isinstance(op, list)
                or len(op) not in (7, 9)
                or (len(op) == 9 and not all(_number(v) for v in op[7:]))
                or not isinstance(op[1], str)
                or op[1] not in _FAMILY_CODE
                or not isinstance(op[5], str)
                or not all(_number(v) for v in (op[2], op[3], op[4], op[6]))
            ):
                raise StepFormatError("malformed per-op cost entry")
            columns[0].append(_FAMILY_CODE[op[1]])
            columns[1].append(float(op[2]))
            columns[2].append(float(op[3]))
            columns[3].append(float(op[4]))
            columns[4].append({"f32": 0, "f16": 1, "bf16": 2}.get(op[5], 3))
            columns[5].append(float(max(op[6], 1)))
            columns[6].append(float(max(op[7], 1)) if len(op) == 9 else 0.0)  # 0: not recorded
            columns[7].append(float(op[8] != 0) if len(op) == 9 else 1.0)
            columns[8].append(kind_of(str(op[0]), op[1]))
        if not all(isinstance(p, str) for p in phases) or not all(_number(s) for s in syncs):
            raise StepFormatError("malformed per-op cost record")
        counts = [
            record.get(k, 0) for k in ("host_ops", "host_bytes", "host_random_bytes", "input_bytes")
        ]
        if not all(_number(c) for c in counts):
            raise StepFormatError("malformed per-op cost record")
        return cls(
            family=np.array(columns[0], dtype=np.int64),
            flops=np.array(columns[1]),
            bytes=np.array(columns[2]),
            work=np.array(columns[3]),
            dtype=np.array(columns[4], dtype=np.int64),
            tensors=np.array(columns[5]),
            kind=np.array(columns[8], dtype=np.int64),
            reduced=np.array(columns[6]),
            inner=np.array(columns[7], dtype=bool),
            phase=np.array([_PHASE_CODE.get(p, 0) for p in phases], dtype=np.int64),
            syncs=np.array(syncs, dtype=float),
            host_ops=int(counts[0]),
            host_bytes=int(counts[1]),
            host_random_bytes=int(counts[2]),
            input_bytes=int(counts[3]),
            steady=bool(record.get("steady", True)),
        )


def _number(value: Any) -> bool:
    return (
        type(value) in (int, float) and math.isfinite(value) and 0 <= value < MAX_VALUE
    )


# -- kernel shapes ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Shapes:
    """Per op: launches, the time-weighted share of SMs its kernel keeps active (waves
    included), its theoretical occupancy (resident warps / the SM's maximum) and the share of
    DRAM bandwidth its resident warps can draw."""

    launches: np.ndarray
    sm_fill: np.ndarray
    occupancy: np.ndarray
    memory_parallel: np.ndarray
    layout_fill: np.ndarray  # convolutions: SM fill and occupancy of their layout conversions
    layout_occupancy: np.ndarray


MAX_REMEMBERED_SHAPES = 200_000
_LAUNCH_SHAPES: dict[tuple, tuple[float, float, float, float]] = {}
"""(launches, SM fill, occupancy, loads in flight) by (kernel kind, OpView fields, limits): the
rules are pure functions of those, and a step (and the rows of a bench worker) launch the
same kernels again and again."""


def _launch_shape(kind: int, view: OpView, limits: SmLimits) -> tuple[float, float, float, float]:
    launch: Launch = LAUNCH_RULES[kind](view, limits)
    waves = waves_of(launch, limits)
    return launch.launches, waves.sm_fill, waves.occupancy, launch.loads_in_flight


def shapes_of(ops: StepOps, limits: SmLimits) -> Shapes:
    """The launch shapes of every op (kernel_shapes' rules), cached on `ops` per GPU (they do
    not depend on the fitted parameters)."""
    cache = ops.__dict__.setdefault("_shapes", {})
    if limits in cache:
        return cache[limits]
    n = len(ops.family)
    launches, fill, occupancy, loads = np.ones(n), np.ones(n), np.ones(n), np.ones(n)
    remembered = _LAUNCH_SHAPES
    columns = zip(ops.kind.tolist(), ops.flops.tolist(), ops.work.tolist(),
                  ops.reduced.tolist(), ops.inner.tolist(), ops.tensors.tolist(),
                  ops.bytes.tolist(), strict=True)
    for i, (kind, flops, work, reduced, inner, tensors, moved) in enumerate(columns):
        key = (kind, flops, work, reduced, inner, tensors, moved, limits)
        shape = remembered.get(key)
        if shape is None:
            shape = _launch_shape(kind, OpView(flops, work, reduced, inner, tensors, moved),
                                  limits)
            if len(remembered) < MAX_REMEMBERED_SHAPES:
                remembered[key] = shape
        launches[i], fill[i], occupancy[i], loads[i] = shape
    parallel = np.minimum(1.0, occupancy * limits.max_warps * loads / SATURATING_WARPS_PER_SM)
    layout_fill, layout_occupancy = np.ones(n), np.zeros(n)
    for i in np.flatnonzero(ops.family == 1):
        layout_fill[i], layout_occupancy[i] = layout_conversion(float(ops.bytes[i]), limits)
    cache[limits] = Shapes(launches, fill, occupancy, parallel, layout_fill, layout_occupancy)
    return cache[limits]


def layout_conversion(conv_bytes: float, limits: SmLimits) -> tuple[float, float]:
    """(SM fill, occupancy) of the elementwise kernels that convert a convolution's tensors
    between NCHW and NHWC (`conv_bytes` moved by the convolution itself)."""
    waves = waves_of(elementwise_launch(OpView(0.0, conv_bytes / 8, 0, True, 1, conv_bytes), limits),
                     limits)
    return waves.sm_fill, waves.occupancy


@dataclass(frozen=True)
class Timeline:
    iteration_seconds: float
    busy: float
    sm_busy: float
    warp_busy: float
    dram_busy: float
    fp32_busy: float


def _peak_flops(ops: StepOps, gpu: GpuRates) -> np.ndarray:
    """The unit each op's FLOPs run on: FP32 SIMT for FP32 matmuls (PyTorch's default
    `allow_tf32 = False` for matmul), TF32 tensor cores for FP32 convolutions (cuDNN's default
    `allow_tf32 = True`), FP16/BF16 tensor cores, FP32 SIMT for everything else."""
    peak = np.full(len(ops.family), gpu.fp32)
    conv = ops.family == 1
    peak[conv & (ops.dtype == 0)] = gpu.tf32
    tensor = (ops.family <= 2) & (ops.dtype == 1)
    peak[tensor] = gpu.fp16
    peak[(ops.family <= 2) & (ops.dtype == 2)] = gpu.bf16
    return peak


def simulate(
    ops: StepOps,
    gpu: GpuRates,
    params: ModelParams,
    *,
    loader_workers: int = 0,
    pinned: bool = False,
) -> Timeline:
    shapes = shapes_of(ops, gpu.limits)
    launches, fill = shapes.launches, shapes.sm_fill
    matrix = ops.family <= 2
    efficiency = np.where(ops.family == 1, params.conv_efficiency, params.gemm_efficiency)
    peak = _peak_flops(ops, gpu)
    compute = np.where(matrix, ops.flops / (peak * efficiency * np.maximum(fill, 1e-6)), 0.0)
    memory = ops.bytes / (
        gpu.bandwidth * params.memory_efficiency * np.maximum(shapes.memory_parallel, 1e-3)
    )
    minimum = params.kernel_min_us * 1e-6 * launches
    duration = np.maximum(compute, memory) + minimum
    sm_busy = duration * fill
    warp_busy = duration * shapes.occupancy * params.achieved_occupancy
    # hypothesis: cuDNN's NCHW <-> NHWC conversions around tensor-core convolutions
    conv = (ops.family == 1) & (peak > gpu.fp32)
    layout_bytes = np.where(conv, params.conv_layout_share * ops.bytes, 0.0)
    if conv.any() and params.conv_layout_share > 0:
        layout = layout_bytes / (gpu.bandwidth * params.memory_efficiency)
        layout = np.where(conv, layout + params.kernel_min_us * 1e-6, 0.0)
        duration = duration + layout
        sm_busy = sm_busy + layout * shapes.layout_fill
        warp_busy = warp_busy + layout * shapes.layout_occupancy * params.achieved_occupancy
    # the launch term: the GPU idles between dependent kernels for part of a launch
    gap = params.launch_gap_share * gpu.launch_overhead * (launches + conv)

    host_per_op = np.array(
        [params.host_forward_us, params.host_backward_us, params.host_optimizer_us]
    )[ops.phase] * 1e-6
    host_per_op = host_per_op * np.where(ops.family == 5, launches, 1.0)
    params_tensors = float(ops.tensors[ops.family == 5].max(initial=0.0))
    loader = (
        params.loader_op_us * 1e-6 * ops.host_ops
        + params.loader_random_ns_per_byte * 1e-9 * ops.host_random_bytes
        + params.loader_ns_per_byte * 1e-9 * max(ops.host_bytes - ops.host_random_bytes, 0)
    )
    h2d = ops.input_bytes / (params.h2d_gbps * 1e9 * (2.0 if pinned else 1.0))
    fixed = params.host_step_us * 1e-6 + params.host_param_us * 1e-6 * params_tensors
    start = h2d + fixed + (loader if loader_workers <= 0 else params.loader_batch_us * 1e-6)
    end = _gpu_end(host_per_op, duration + gap, ops.syncs, start)
    loop = max(end[1], end[0])  # the step's `.item()` waits for the GPU
    period = max(loop, loader / loader_workers) if loader_workers > 0 else loop
    period = max(period, 1e-9)

    fp32_flops = np.where(
        matrix & (peak == gpu.fp32),
        ops.flops,
        np.where(matrix, params.tensor_fp32_share * compute * gpu.fp32, params.fp32_per_element * ops.work),
    )
    return Timeline(
        iteration_seconds=period,
        busy=float(duration.sum()),
        sm_busy=float(sm_busy.sum()),
        warp_busy=float(warp_busy.sum()),
        dram_busy=float((ops.bytes.sum() + layout_bytes.sum()) / gpu.bandwidth),
        fp32_busy=float(np.minimum(fp32_flops / gpu.fp32, duration).sum()),
    )


def _gpu_end(host: np.ndarray, duration: np.ndarray, syncs: np.ndarray, start: float) -> tuple[float, float]:
    """(host time, GPU time) at the end of the step. The host launches op i at
    start + sum(host[:i+1]) (after waiting for the GPU at a sync); the GPU runs it from
    max(launch, end of op i-1). A max-plus scan per stretch between syncs."""
    t_host, t_gpu = start, 0.0
    cuts = [0, *np.flatnonzero(syncs[1:] > 0) + 1, len(host)] if len(host) else [0, 0]
    for a, b in zip(cuts[:-1], cuts[1:], strict=True):
        if b <= a:
            continue
        if a > 0 or syncs[0] > 0:
            t_host = max(t_host, t_gpu)
        launch = t_host + np.cumsum(host[a:b])
        d = duration[a:b]
        c = np.cumsum(d)
        # end_i = max(t_gpu + c_i, max_{j<=i} (launch_j + c_i - c_{j-1}))
        prev = np.concatenate(([0.0], c[:-1]))
        best = np.maximum.accumulate(launch - prev)
        end = c + np.maximum(best, t_gpu)
        t_host, t_gpu = float(launch[-1]), float(end[-1])
    return t_host, t_gpu


def utilization(
    ops: StepOps,
    gpu: Any,
    params: ModelParams | None = None,
    *,
    loader_workers: int = 0,
    pinned: bool = False,
) -> Utilization:
    """The predicted utilization of the step's GPU `gpu` (a GpuProfile)."""
    params = params or fitted_params()
    rates = GpuRates.of(gpu)
    line = simulate(ops, rates, params, loader_workers=loader_workers, pinned=pinned)
    t = line.iteration_seconds
    share = params.steady_share
    assumptions = [
        "utilization: a timing model of one steady-state iteration from the trace's per-op "
        "costs and the GPU's datasheet rates; the job alone on the GPU (utilization of jobs "
        "sharing a GPU does not add up)"
    ]
    if loader_workers <= 0:
        assumptions.append("utilization: the DataLoader's work runs in the training loop")
    if not ops.steady:
        assumptions.append("utilization: only the first training step was seen (not steady)")
    return Utilization(
        gract=share * min(1.0, line.busy / t),
        smact=share * min(1.0, line.sm_busy / t),
        smocc=share * min(1.0, line.warp_busy / t),
        drama=share * min(1.0, line.dram_busy / t),
        fp32a=share * min(1.0, line.fp32_busy / t),
        iteration_seconds=t,
        assumptions=assumptions,
    )
