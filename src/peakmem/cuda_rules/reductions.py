"""Global-memory scratch of CUDA reductions (`sum`, `mean`): aten/src/ATen/native/cuda/Reduce.cuh,
torch 2.4-2.6.

`gpu_reduce_kernel` picks a launch configuration (`setReduceConfig`). When one output's inputs
are split over several thread blocks (`config.should_global_reduce()`: many inputs per output,
few outputs, e.g. a bias gradient summed over batch x sequence rows, or the mean over a
sequence), `launch_reduce_kernel` takes two buffers from the caching allocator:

    buffer     = allocator.allocate(config.global_memory_size());
    semaphores = allocator.allocate(config.semaphore_size());

after the output exists, and frees them when the launch returns (the `DataPtr`s go out of scope:
`semaphores` first, then `buffer`). The meta kernel allocates only the output. The buffer of a
column reduction is `sizeof(arg_t) * num_outputs * ctas_per_output * block.x * output_vec_size`
bytes: a 1-10 MiB request on large layers, which needs a fresh 20 MiB segment when no cached
block fits (FACTS.md section 8: "misses often multiples of 20 MiB: a missing short-lived 1-10 MiB
allocation"; docs/capture.md: the 2 MiB small-pool misses of the MLP rows).

The configuration is ported from `setReduceConfig` / `ReduceConfig` (`set_block_dimension`,
`split_input`, `split_output`, `values_per_thread`, `global_memory_size`, `semaphore_size`,
`get_output_vec_size`), with TensorIterator's reduction layout (`reorder_dimensions`: reduced
dimensions first, then by stride; `coalesce_dimensions`). Assumed, not ported: a storage offset
that breaks 16-byte alignment of the input is read from `storage_offset()` (base pointers are
aligned); reductions over more than 2**31 elements (split into 32-bit-indexable pieces) are left
out.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from peakmem.cuda_rules.registry import RuleContext, register_op_rule

aten = torch.ops.aten

MAX_NUM_THREADS = 512  # Reduce.cuh mnt_wrapper<T>::MAX_NUM_THREADS (256 only for complex double)
WARP_SIZE = 32
INPUT_VEC_SIZE = 4  # ReduceConfig::input_vec_size (vt0 = 4 for sum/mean)
VT0 = 4
MIN_VALUES_PER_THREAD = 16
MAX_VALUES_PER_THREAD = 256
_BLOCK_X, _BLOCK_Y, _CTA = 0, 1, 2
INT32_MAX = 2**31 - 1

# cudaDeviceProp::maxThreadsPerMultiProcessor by compute capability (CUDA C++ Programming Guide,
# "Technical Specifications per Compute Capability")
_MAX_THREADS_PER_SM = {(7, 5): 1024, (8, 6): 1536, (8, 9): 1536, (12, 0): 1536}


def max_threads_per_sm(capability: tuple[int, int]) -> int:
    return _MAX_THREADS_PER_SM.get(capability, 2048)


def _div_up(a: int, b: int) -> int:
    return (a + b - 1) // b


def _last_pow2(n: int) -> int:
    return 1 << (max(int(n), 1).bit_length() - 1)


@dataclass(frozen=True)
class ReduceLayout:
    """A reduction as TensorIterator lays it out: dimensions fastest first, the reduced ones
    before the kept ones (after coalescing), strides in elements."""

    shape: tuple[int, ...]
    input_strides: tuple[int, ...]
    output_strides: tuple[int, ...]
    num_reduce_dims: int

    @property
    def numel(self) -> int:
        total = 1
        for size in self.shape:
            total *= size
        return total

    @property
    def num_outputs(self) -> int:
        total = 1
        for size, stride in zip(self.shape, self.output_strides, strict=True):
            if stride != 0:
                total *= size
        return total


def reduce_layout(shape: tuple[int, ...], strides: tuple[int, ...], dims: set[int]) -> ReduceLayout:
    """TensorIterator's layout of reducing a tensor of `shape`/`strides` over `dims`."""
    kept = [d for d in range(len(shape)) if d not in dims]
    out_strides = [0] * len(shape)
    step = 1
    for d in reversed(kept):  # the output is contiguous over the kept dimensions
        out_strides[d] = step
        step *= shape[d]
    live = [d for d in range(len(shape)) if shape[d] != 1]  # size-1 dimensions coalesce away

    def key(d: int) -> tuple[int, int, int]:
        reduced = out_strides[d] == 0
        # outputs first: reduced dims to the front, kept ones by output stride; the reduced
        # ones tie on the output and are ordered by the input's stride, then size
        return (0, strides[d], shape[d]) if reduced else (1, out_strides[d], strides[d])

    order = sorted(reversed(live), key=key)
    merged: list[list[int]] = []  # [size, input stride, output stride]
    for d in order:
        size, s_in, s_out = shape[d], strides[d], out_strides[d]
        if merged:
            prev = merged[-1]
            if prev[0] * prev[1] == s_in and prev[0] * prev[2] == s_out:
                prev[0] *= size
                continue
        merged.append([size, s_in, s_out])
    return ReduceLayout(
        shape=tuple(m[0] for m in merged),
        input_strides=tuple(m[1] for m in merged),
        output_strides=tuple(m[2] for m in merged),
        num_reduce_dims=sum(1 for m in merged if m[2] == 0),
    )


def _output_vec_size(layout: ReduceLayout, storage_offset: int) -> int:
    """`get_output_vec_size`: 4, halved until it divides the input's offset, the first kept
    size and every other input stride (in elements)."""
    vec = 4

    def update(n: int) -> None:
        nonlocal vec
        while n % vec:
            vec //= 2

    update(storage_offset)
    output_index = layout.num_reduce_dims
    update(layout.shape[output_index])
    for j, stride in enumerate(layout.input_strides):
        if j != output_index:
            update(stride)
    return vec


@dataclass
class ReduceConfig:
    element_size_bytes: int
    num_outputs: int
    num_inputs: int
    step_input: int = 1
    step_output: int = 1
    ctas_per_output: int = 1
    block_width: int = 1
    block_height: int = 1
    num_threads: int = 1
    output_vec_size: int = 1
    vectorize_input: bool = False

    def __post_init__(self) -> None:
        self.input_mult = [0, 0, 0]
        self.output_mult = [0, 0]

    def set_block_dimension(self, dim0: int, dim1: int) -> None:
        max_threads = MAX_NUM_THREADS // self.output_vec_size
        dim0_pow2 = _last_pow2(dim0) if dim0 < max_threads else max_threads
        dim1_pow2 = _last_pow2(dim1) if dim1 < max_threads else max_threads
        self.block_width = min(dim0_pow2, WARP_SIZE)
        self.block_height = min(dim1_pow2, max_threads // self.block_width)
        self.block_width = min(dim0_pow2, max_threads // self.block_height)
        self.num_threads = self.block_width * self.block_height

    def split_input(self, parallelism: int) -> int:
        step = self.step_input
        self.step_input *= parallelism
        return step

    def split_output(self, parallelism: int) -> int:
        step = self.step_output
        self.step_output *= parallelism
        return step

    def grid_x(self) -> int:
        return _div_up(self.num_outputs // self.output_vec_size, self.step_output)

    def values_per_thread(self) -> int:
        return _div_up(self.num_inputs, self.step_input)

    def should_global_reduce(self) -> bool:
        return self.input_mult[_CTA] != 0

    def global_memory_size(self) -> int:
        if not self.should_global_reduce():
            return 0
        size = self.element_size_bytes * self.num_outputs * self.ctas_per_output
        if self.input_mult[_BLOCK_X] == 0:  # not should_block_x_reduce()
            size *= self.block_width * self.output_vec_size
        return size

    def semaphore_size(self) -> int:
        return 4 * self.grid_x() if self.should_global_reduce() else 0


def set_reduce_config(
    layout: ReduceLayout, arg_size: int, scalar_size: int, storage_offset: int,
    sm_count: int, threads_per_sm: int,
) -> ReduceConfig:
    """`setReduceConfig<arg_t, scalar_t, vt0>` for a reduction laid out as `layout`."""
    num_outputs = layout.num_outputs
    config = ReduceConfig(arg_size, num_outputs, layout.numel // max(num_outputs, 1))
    ndim = len(layout.shape)
    strides_bytes = [s * scalar_size for s in layout.input_strides]
    if ndim > 0:
        on_fastest = layout.num_reduce_dims == ndim or (
            strides_bytes[0] < strides_bytes[layout.num_reduce_dims]
        )
        if on_fastest:
            dim0, dim1 = config.num_inputs, num_outputs
            fastest_stride = strides_bytes[0]
        else:
            dim0, dim1 = num_outputs, config.num_inputs
            fastest_stride = strides_bytes[layout.num_reduce_dims]
    else:
        on_fastest, fastest_stride, dim0, dim1 = True, scalar_size, 1, 1
    if fastest_stride == scalar_size:
        if on_fastest and dim0 > 128 and layout.num_reduce_dims == 1 and VT0 >= INPUT_VEC_SIZE:
            config.vectorize_input = True
            dim0 //= INPUT_VEC_SIZE
        elif not on_fastest:
            config.output_vec_size = _output_vec_size(layout, storage_offset)
            dim0 //= config.output_vec_size
    config.set_block_dimension(dim0, dim1)
    if ndim == 0 or on_fastest:
        config.input_mult[_BLOCK_X] = config.split_input(config.block_width)
    else:
        config.output_mult[0] = config.split_output(config.block_width)
    if (
        config.values_per_thread() >= config.block_height * 16
        or config.values_per_thread() >= MAX_VALUES_PER_THREAD
    ):
        config.input_mult[_BLOCK_Y] = config.split_input(config.block_height)
    else:
        config.output_mult[1] = config.split_output(config.block_height)
    target_grid = sm_count * (threads_per_sm // config.num_threads)
    grid = config.grid_x()
    values = config.values_per_thread()
    if config.input_mult[_BLOCK_Y] != 0 and values >= MAX_VALUES_PER_THREAD and grid <= target_grid:
        ctas1 = _div_up(target_grid, grid)
        ctas2 = _div_up(values, MIN_VALUES_PER_THREAD)
        ctas3 = _div_up(values, MAX_VALUES_PER_THREAD)
        config.ctas_per_output = max(min(ctas1, ctas2), ctas3)
        if config.ctas_per_output > 1:
            config.input_mult[_CTA] = config.split_input(config.ctas_per_output)
    return config


def _accumulator_size(dtype: torch.dtype) -> int:
    """sizeof(arg_t) of sum/mean: acc_type<scalar_t, is_cuda=true> (float for half/bf16/float,
    double for double, int64 for integers and bool)."""
    if dtype in (torch.float16, torch.bfloat16, torch.float32):
        return 4
    if dtype.is_complex:
        return 16 if dtype == torch.complex128 else 8
    return 8


def reduce_scratch_bytes(
    x: torch.Tensor, dims: set[int], sm_count: int, threads_per_sm: int
) -> tuple[int, int]:
    """(buffer, semaphores) bytes a CUDA sum/mean of `x` over `dims` takes (0, 0 when the
    reduction stays inside one block per output)."""
    call = (tuple(x.shape), tuple(x.stride()), tuple(sorted(dims)), _accumulator_size(x.dtype),
            x.element_size(), x.storage_offset(), x.is_complex(), sm_count, threads_per_sm)
    result = scratch_bytes(*call)
    if SCRATCH_CALLS is not None:
        SCRATCH_CALLS.append((call, result))
    return result


SCRATCH_CALLS: list | None = None
"""While a list (capture.repeated_forwards observing a call for capture.length_family), each
`reduce_scratch_bytes` call's numbers and answer are appended: the configuration's thresholds
are no polynomial in a sequence length, so a predicted call's reductions are asked again."""


def scratch_bytes(shape: tuple[int, ...], strides: tuple[int, ...], dims: tuple[int, ...],
                  accumulator_size: int, element_size: int, storage_offset: int,
                  is_complex: bool, sm_count: int, threads_per_sm: int) -> tuple[int, int]:
    """`reduce_scratch_bytes` from the input's numbers alone."""
    numel = 1
    for size in shape:
        numel *= size
    if numel == 0 or numel > INT32_MAX or is_complex:
        return 0, 0
    layout = reduce_layout(shape, strides, set(dims))
    config = set_reduce_config(layout, accumulator_size, element_size, storage_offset,
                               sm_count, threads_per_sm)
    return config.global_memory_size(), config.semaphore_size()


def _reduced_dims(x: torch.Tensor, dim) -> set[int]:
    if dim is None:
        return set(range(x.dim()))
    dims = [dim] if isinstance(dim, int) else list(dim)
    if not dims:  # sum(dim=[]) reduces everything
        return set(range(x.dim()))
    return {d % max(x.dim(), 1) for d in dims}


def add_reduction_scratch(
    ctx: RuleContext, x: torch.Tensor, dims: set[int] | None, op: str
) -> None:
    """The staging buffer and semaphores of a CUDA sum/mean of `x` over `dims` (None: all),
    allocated after the reduction's output and freed when the kernel returns; for kernels that
    reduce internally (a loss's `mean_out`) as for the aten ops."""
    buffer_bytes, semaphore_bytes = reduce_scratch_bytes(
        x, set(range(x.dim())) if dims is None else dims, int(ctx.gpu.sm_count.value),
        max_threads_per_sm(ctx.gpu.capability),
    )
    if not buffer_bytes:
        return
    name = f"{op}[reduce_global]"
    buffer = ctx.scratch(buffer_bytes, category="temporary", op=name)
    semaphores = ctx.scratch(semaphore_bytes, category="temporary", op=name)
    ctx.release(semaphores)
    ctx.release(buffer)


@register_op_rule([aten.sum.default, aten.sum.dim_IntList, aten.mean.default, aten.mean.dim,
                   aten.nansum.default])
def reduction_global_scratch(ctx: RuleContext, op, args: tuple, kwargs: dict, out) -> None:
    x = args[0]
    if not isinstance(x, torch.Tensor):
        return
    dim = args[1] if len(args) > 1 else kwargs.get("dim")
    if op in (aten.sum.default, aten.mean.default):  # nansum.default takes `dim`
        dim = None
    add_reduction_scratch(ctx, x, _reduced_dims(x, dim), op.overloadpacket.__name__)
