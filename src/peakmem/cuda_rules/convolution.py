"""cuDNN convolutions: the per-call workspace and the library memory loaded on first use.

On CUDA, `aten.convolution` and `aten.convolution_backward` on 4-D/5-D float inputs run through
cuDNN (aten/src/ATen/native/Convolution.cpp `select_conv_backend`; 3-D inputs are unsqueezed to
2-D). With the v8 API (torch >= 2.0, aten/src/ATen/native/cudnn/Conv_v8.cpp) every call takes
an execution plan from cuDNN's heuristics (or from `cudnn.benchmark`'s search) and
`run_conv_plan` allocates `plan.getWorkspaceSize()` bytes from the caching allocator, runs the
kernel, and frees them: a transient allocation next to the op's output, once per direction
(forward, backward-data for grad_input, backward-weight for grad_weight).

Which plan the heuristics pick, and so the workspace, depends on the shape, dtype, layout, GPU
architecture and cuDNN version and cannot be derived on a CPU. The stack profile carries a model
per GPU (`[cudnn_conv_workspace.<gpu>]`): bytes = factor[direction] x the bytes of the tensor
the direction reads most (its input activation for forward and backward-weight, its
grad_output for backward-data), which is where the workspace of the implicit-GEMM and
FFT/Winograd engines scales. The factors are measured (issue 6 tables) or calibrated on a
declared split; see docs/cnn.md.

With `torch.backends.cudnn.benchmark = True` the first call of each new shape (per thread: the
plan cache is thread-local) searches instead: `get_plans_from_find` allocates one workspace for
timing the candidate plans (the largest any candidate needs, halved while it does not fit), and
then, as PyTorch's v7 path did, empties the caching allocator's cache
(`_cudnn_get_conv_benchmark_empty_cache()`, default true) before running the chosen plan. The
search workspace comes from the model's `benchmark` factor.

cuDNN also loads device memory outside the caching allocator the first time a job convolves:
the handle (one per thread: forward on the main thread, backward on autograd's device thread)
and the engines' kernel images. It is charged once per capture as library memory
(`[library_bytes.<gpu>] cudnn_convolution`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from peakmem.cuda_rules.registry import RuleContext, register_fused_kernel, register_op_rule
from peakmem.profiles.conv_workspace_table import ConvShape, load_table

aten = torch.ops.aten

DIRECTIONS = ("forward", "backward_data", "backward_weight")
_CUDNN_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


@dataclass(frozen=True)
class ConvCall:
    """What a workspace model may look at for one cuDNN call."""

    direction: str
    input_bytes: int  # the activation the convolution reads (x), whatever the direction
    weight_bytes: int
    output_bytes: int  # the convolution's output y (= grad_output's size)
    dtype: torch.dtype
    kernel: tuple[int, ...]
    stride: tuple[int, ...]
    groups: int
    input_shape: tuple[int, ...] = ()  # x's shape (N, C, *spatial)
    weight_shape: tuple[int, ...] = ()  # (C_out, C_in / groups, *kernel)
    padding: tuple[int, ...] = ()
    dilation: tuple[int, ...] = ()
    channels_last: bool = False  # cuDNN convolves in channels-last (cudnn_channels_last)
    tf32: bool = True  # torch.backends.cudnn.allow_tf32 when the call was made
    transposed: bool = False

    @property
    def dtype_mode(self) -> str | None:
        """The grid's dtype mode (fp32 with TF32 off, tf32, bf16, fp16), None for others."""
        if self.dtype == torch.float32:
            return "tf32" if self.tf32 else "fp32"
        return {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(self.dtype)

    def grid_shape(self) -> ConvShape | None:
        """The call as a workspace table's shape: 2-D, not transposed, at a grid dtype mode; a
        non-square kernel, stride, padding or dilation takes its largest (a "same" 1x7 with
        padding 0x3 keeps its output size as 7x7 with padding 3)."""
        mode = self.dtype_mode
        if mode is None or self.transposed or len(self.input_shape) != 4 or len(self.weight_shape) != 4:
            return None
        n, cin, h, w = self.input_shape
        return ConvShape(
            n=n, cin=cin, h=h, w=w, cout=self.weight_shape[0], kernel=max(self.kernel),
            stride=max(self.stride), padding=max(self.padding or (0,)),
            dilation=max(self.dilation or (1,)), groups=self.groups, dtype_mode=mode,
            layout="channels_last" if self.channels_last else "nchw",
        )

    @property
    def basis_bytes(self) -> int:
        """The tensor the direction reads most: grad_output for backward-data, x otherwise."""
        return self.output_bytes if self.direction == "backward_data" else self.input_bytes

    @property
    def input_channels(self) -> int:
        return self.input_shape[1] if len(self.input_shape) > 1 else 0

    @property
    def lowered_bytes(self) -> int:
        """x lowered to a GEMM operand (im2col): one row per output position (N x spatial
        out), one column per weight tap (C_in / groups x prod(kernel)), in x's dtype; what an
        engine that materialises the lowered input would take."""
        if len(self.weight_shape) < 3 or not self.weight_shape[0]:
            return 0
        positions = self.output_bytes // self.weight_shape[0]  # N x spatial out x element size
        return positions * self.weight_shape[1] * math.prod(self.kernel)


def uses_cudnn(x: torch.Tensor, weight: torch.Tensor, groups: int, transposed: bool) -> bool:
    """Convolution.cpp `select_conv_backend` for a CUDA input: cuDNN unless cuDNN is off, the
    dtype is not one cuDNN takes, or a depthwise 2-D convolution goes to PyTorch's own kernel."""
    if not torch.backends.cudnn.enabled or x.dtype not in _CUDNN_DTYPES:
        return False
    if x.dim() not in (3, 4, 5):
        return False
    in_channels = x.shape[1] if x.dim() > 1 else 0
    depthwise = (
        not transposed and groups > 1 and groups == in_channels and weight.shape[0] % in_channels == 0
    )
    # Depthwise: `use_cudnn_depthwise` takes cuDNN for every channels-last input or weight
    # ("always use cudnn_depthwise for channels_last format", torch 2.4-2.11), else only for
    # fp16 in the shapes it accepts (bf16 and fp32 NCHW depthwise ran on CudaDepthwise2d in
    # every case of the H200 grid, benchmarks/groundtruth/h200_cudnn_grid.csv.gz); the native
    # depthwise kernels allocate no workspace.
    if depthwise and x.dtype != torch.float16:
        return cudnn_channels_last(x, weight)
    return True


def cudnn_channels_last(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """ConvUtils.h `cudnn_conv_suggest_memory_format(input, weight)` == ChannelsLast: a 4-D
    weight with a channels-last input or weight (not float64). cuDNN then convolves in
    channels-last and its output (and the gradients, `determine_backend_memory_format`) are
    channels-last; the weight is made channels-last for the call."""
    if x.dtype == torch.float64 or weight.dim() != 4 or x.dim() != 4:
        return False
    from torch._prims_common import suggest_memory_format

    return torch.channels_last in (suggest_memory_format(x), suggest_memory_format(weight))


STEM_MAX_CHANNELS = 4
"""Input channels up to which a convolution is an image stem (RGB / RGBA input)."""

CONV_CLASSES: tuple[tuple[str, Callable[[ConvCall], bool]], ...] = (
    ("stem", lambda call: 0 < call.input_channels <= STEM_MAX_CHANNELS),
    ("pointwise", lambda call: bool(call.kernel) and all(k == 1 for k in call.kernel)),
)
"""Kinds of convolution a workspace model may give factors of their own, first match wins:
key `<class>_<direction>[_per_weight|_per_lowered]`. cuDNN's heuristics pick different engines
for them (a 3-channel stem cannot use the tensor-core implicit-GEMM tiles, a 1x1 convolution
is a plain GEMM); a class without keys for a direction takes the plain `<direction>` keys."""

TERMS = {"": "basis_bytes", "_per_weight": "weight_bytes", "_per_lowered": "lowered_bytes"}
"""A model's terms: key suffix -> the ConvCall bytes its factor multiplies."""

def conv_class(call: ConvCall) -> str:
    """The first class of CONV_CLASSES `call` belongs to, or "" (none)."""
    return next((name for name, test in CONV_CLASSES if test(call)), "")


def model_bytes(model: dict[str, float], call: ConvCall, factor: str, per_weight: str = "") -> int:
    """The profile model's bytes: factor x what the direction reads (+ per_weight x the
    weight's bytes). Also what benchmarks/calibrate_cnn.py replays its candidates with."""
    size = float(model.get(factor, 0.0)) * call.basis_bytes
    size += float(model.get(per_weight, 0.0)) * call.weight_bytes
    return max(0, int(size))


def classed_bytes(model: dict[str, float], call: ConvCall) -> int:
    """The model's bytes for `call`: the factors of its class where the model has any for the
    direction, the plain ones otherwise; each term's factor x the bytes it scales with."""
    name = conv_class(call)
    prefix = f"{name}_" if name and any(
        f"{name}_{call.direction}{suffix}" in model for suffix in TERMS) else ""
    size = sum(float(model.get(f"{prefix}{call.direction}{suffix}", 0.0)) * getattr(call, attr)
               for suffix, attr in TERMS.items())
    return max(0, int(size))


def workspace_bytes(ctx: RuleContext, call: ConvCall) -> int:
    """The workspace cuDNN's chosen plan takes for `call`: the stack's measured per-shape table
    for the GPU where it has one and the call is a 2-D convolution at a grid dtype mode (exact,
    else the table's nearest neighbours), the stack profile's factor model otherwise."""
    table = ctx.stack.conv_workspace_table_for(ctx.gpu)
    shape = call.grid_shape() if table is not None else None
    if table is not None and shape is not None:
        return load_table(table.value).lookup(shape, call.direction).bytes
    return classed_bytes(ctx.stack.conv_workspace_for(ctx.gpu).value, call)


def benchmark_workspace_bytes(ctx: RuleContext, call: ConvCall) -> int:
    """The workspace `cudnn.benchmark`'s plan search takes for `call`: never less than the
    heuristic plan's own workspace (`workspace_bytes`), the model's `benchmark` factor above it.

    Conv_v8.cpp `get_plans_from_find` times the plans of the heuristics (instant mode, the same
    list `benchmark = False` runs the first of) and of the fallback list, and
    `generate_and_filter_plans` allocates the largest workspace among those whose size is at most
    `get_available_workspace()`: `cacheInfo` starting from 0 begins at cudaMemGetInfo's free
    bytes, so on an idle GPU every candidate counts. The heuristic choice is a candidate, so the
    search's workspace is at least its workspace; how far above (the other engines') is not
    measured on any GPU yet (docs/BENCHMARKS.md "Misses explained (branch a8)")."""
    model = ctx.stack.conv_workspace_for(ctx.gpu).value
    searched = model_bytes(model, call, "benchmark" if "benchmark" in model else call.direction)
    return max(searched, workspace_bytes(ctx, call))


def _searched_before(ctx: RuleContext, call: ConvCall, key: tuple) -> bool:
    """True if this thread already searched plans for `key` (Conv_v8.cpp benchmark_cache)."""
    thread = "autograd" if ctx.in_backward else "main"
    return not ctx.first_time(("cudnn_benchmark", thread, call.direction, key))


def _record(ctx: RuleContext, call: ConvCall, key: tuple) -> None:
    ctx.load_library("cudnn_convolution")
    if torch.backends.cudnn.benchmark and not _searched_before(ctx, call, key):
        search = benchmark_workspace_bytes(ctx, call)
        if search > 0:
            ctx.transient(search, category="workspace",
                          op=f"cudnn_benchmark_workspace[{call.direction}]", or_smaller=True)
        ctx.empty_cache()
    size = workspace_bytes(ctx, call)
    if size > 0:
        ctx.transient(
            size,
            category="workspace",
            op=f"cudnn_conv_workspace[{call.direction}]",
            or_smaller=True,  # Conv_v8.cpp: a plan whose workspace OOMs gives way to the next
        )


def _key(args: tuple) -> tuple:
    """What Conv_v8.cpp's plan cache keys on: shapes, strides, dtypes and the conv parameters."""
    parts = []
    for arg in args:
        if isinstance(arg, torch.Tensor):
            parts.append((tuple(arg.shape), tuple(arg.stride()), arg.dtype))
        elif isinstance(arg, (list, tuple)):
            parts.append(tuple(int(a) if isinstance(a, int) else str(a) for a in arg))
        else:
            parts.append(arg if isinstance(arg, (int, float, bool, type(None))) else str(arg))
    return (tuple(parts), torch.backends.cudnn.deterministic, cudnn_conv_tf32())


def cudnn_conv_tf32() -> bool:
    """Whether cuDNN convolutions may use TF32, as torch's convolution asks it (for the CONV
    operator: `allowTF32CuDNN(Float32Op::CONV)`). The bare `cudnn.allow_tf32` raises "a mix of
    the legacy and new APIs" once a job set the two APIs to values that disagree; the
    convolution's own `cudnn.conv.fp32_precision` answers then, as torch's kernel reads it."""
    cudnn = torch.backends.cudnn
    try:
        return bool(cudnn.allow_tf32)
    except RuntimeError:
        return getattr(getattr(cudnn, "conv", None), "fp32_precision", "tf32") == "tf32"


def _tuple(value, dims: int) -> tuple[int, ...]:
    if isinstance(value, int):
        return (value,) * dims
    return tuple(int(v) for v in value)


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def _call(direction: str, x, weight, output_bytes: int, stride, groups: int,
          padding=0, dilation=1, transposed: bool = False) -> ConvCall:
    dims = max(weight.dim() - 2, 1)
    return ConvCall(
        direction=direction,
        input_bytes=_nbytes(x),
        weight_bytes=_nbytes(weight),
        output_bytes=output_bytes,
        dtype=x.dtype,
        kernel=tuple(int(k) for k in weight.shape[2:]),
        stride=_tuple(stride, dims),
        groups=int(groups),
        input_shape=tuple(int(d) for d in x.shape),
        weight_shape=tuple(int(d) for d in weight.shape),
        padding=_tuple(padding, dims),
        dilation=_tuple(dilation, dims),
        channels_last=cudnn_channels_last(x, weight),
        tf32=cudnn_conv_tf32(),
        transposed=transposed,
    )


@register_op_rule(aten.convolution)
def convolution(ctx: RuleContext, op, args, kwargs, out) -> None:
    """convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding,
    groups): cudnn_convolution allocates the output, then the plan's workspace."""
    x, weight = args[0], args[1]
    stride = args[3] if len(args) > 3 else kwargs.get("stride", 1)
    padding = args[4] if len(args) > 4 else kwargs.get("padding", 0)
    dilation = args[5] if len(args) > 5 else kwargs.get("dilation", 1)
    transposed = bool(args[6] if len(args) > 6 else kwargs.get("transposed", False))
    groups = int(args[8] if len(args) > 8 else kwargs.get("groups", 1))
    if not uses_cudnn(x, weight, groups, transposed):
        return
    _record(ctx, _call("forward", x, weight, _nbytes(out), stride, groups, padding, dilation,
                       transposed), _key(args))


def _same_padding(weight, dilation, dims: int) -> list[int]:
    """conv*d(padding="same")'s symmetric part: dilation x (kernel - 1) // 2 per side (torch
    pads the odd remainder of an even kernel with a separate `constant_pad_nd`)."""
    dil = _tuple(dilation, dims)
    return [d * (int(k) - 1) // 2 for d, k in zip(dil, weight.shape[2:], strict=False)]


def _as_convolution_args(args, kwargs, transposed: bool) -> tuple:
    """conv1d/2d/3d(input, weight, bias, stride, padding, dilation, groups) or
    conv_transpose1d/2d/3d(input, weight, bias, stride, padding, output_padding, groups,
    dilation) as the `aten.convolution` call they make (Convolution.cpp), lists normalized, so
    the workspace and `cudnn.benchmark`'s plan cache key are the same either way."""
    names = (("input", "weight", "bias", "stride", "padding", "output_padding", "groups",
              "dilation") if transposed else
             ("input", "weight", "bias", "stride", "padding", "dilation", "groups"))
    defaults = {"bias": None, "stride": 1, "padding": 0, "dilation": 1, "groups": 1,
                "output_padding": 0}
    given = dict(zip(names, args, strict=False))
    value = {name: given.get(name, kwargs.get(name, defaults.get(name))) for name in names}
    x, weight = value["input"], value["weight"]
    dims = max(weight.dim() - 2, 1)
    padding = value["padding"]
    if isinstance(padding, str):
        padding = [0] * dims if padding == "valid" else _same_padding(weight, value["dilation"], dims)
    return (x, weight, value["bias"], list(_tuple(value["stride"], dims)),
            list(_tuple(padding, dims)), list(_tuple(value["dilation"], dims)), transposed,
            list(_tuple(value["output_padding"] if transposed else 0, dims)), int(value["groups"]))


@register_op_rule([aten.conv1d, aten.conv2d, aten.conv3d])
def conv_nd(ctx: RuleContext, op, args, kwargs, out) -> None:
    """conv1d/2d/3d reach the capture whole (not as `aten.convolution`) where autograd's keys
    are off, i.e. under `torch.inference_mode()` (CompositeImplicitAutograd kernels then run
    below the dispatch mode): on CUDA they run the same cuDNN convolution, workspace and
    `cudnn.benchmark` search included (torchvision's reference `evaluate`, Lightning's
    validate / test / predict)."""
    convolution(ctx, op, _as_convolution_args(args, kwargs, transposed=False), {}, out)


@register_op_rule([aten.conv_transpose1d, aten.conv_transpose2d, aten.conv_transpose3d])
def conv_transpose_nd(ctx: RuleContext, op, args, kwargs, out) -> None:
    """conv_transpose1d/2d/3d under `torch.inference_mode()`: as `conv_nd`."""
    convolution(ctx, op, _as_convolution_args(args, kwargs, transposed=True), {}, out)


@register_op_rule(aten.convolution_backward)
def convolution_backward(ctx: RuleContext, op, args, kwargs, out) -> None:
    """convolution_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation,
    transposed, output_padding, groups, output_mask): cudnn_convolution_backward runs
    backward-data (if grad_input is wanted) then backward-weight, each with its own workspace."""
    grad_output, x, weight = args[0], args[1], args[2]
    stride = args[4] if len(args) > 4 else kwargs.get("stride", 1)
    padding = args[5] if len(args) > 5 else kwargs.get("padding", 0)
    dilation = args[6] if len(args) > 6 else kwargs.get("dilation", 1)
    transposed = bool(args[7] if len(args) > 7 else kwargs.get("transposed", False))
    groups = int(args[9] if len(args) > 9 else kwargs.get("groups", 1))
    mask = args[10] if len(args) > 10 else kwargs.get("output_mask", (True, True, True))
    if not uses_cudnn(x, weight, groups, transposed):
        return
    out_bytes = _nbytes(grad_output)
    key = _key(args[1:3] + args[4:])
    if mask[0]:
        _record(ctx, _call("backward_data", x, weight, out_bytes, stride, groups, padding,
                           dilation, transposed), key)
    if mask[1]:
        _record(ctx, _call("backward_weight", x, weight, out_bytes, stride, groups, padding,
                           dilation, transposed), key)


@register_fused_kernel("convolution", layout_pure=True)
def convolution_output(
    input: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    transposed: bool,
    output_padding: list[int],
    groups: int,
) -> torch.Tensor:
    """`aten.convolution`'s output as CUDA lays it out. torch's meta kernel always returns a
    contiguous output (it cannot tell the backend); on CUDA, cuDNN convolves a channels-last
    input or weight in channels-last (Convolution.cpp `_convolution`:
    `cudnn_convolution(input.contiguous(backend_memory_format), ...)`), so its output is
    channels-last. The layout decides what later kernels copy: ConvNeXt's blocks hand their
    channels-last outputs to a depthwise convolution whose output, permuted, is then a
    contiguous input to LayerNorm (no copy), where a contiguous output would make it one."""
    from torch._meta_registrations import meta_conv

    out = meta_conv(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups)
    if uses_cudnn(input, weight, groups, transposed) and cudnn_channels_last(input, weight):
        return out.contiguous(memory_format=torch.channels_last)
    return out
