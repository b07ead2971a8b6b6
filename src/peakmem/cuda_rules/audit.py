"""Audit of ops whose capture (meta) allocations differ from the CUDA kernel's.

Each case runs one aten op (or a composite function) on capture-device tensors inside a real
capture, with and without the CUDA rules installed, and compares what was recorded:
- `meta_bytes` / `meta_ops`: allocations the bare meta path records (no CUDA rules);
- `rule_bytes` / `rule_ops`: allocations with the rules (what peakmem records now);
- `cuda`: what the CUDA kernel allocates, worked out from its source (outputs + scratch), as
  (bytes, what) entries, and the source citation.
A case is a finding when the bare meta path differs from the CUDA kernel; it is covered when the
capture with the rules matches it byte for byte (sizes in allocation order).

Used by benchmarks/audit_decompositions.py, which writes docs/audit.md. Not imported by the
package's __init__ (it imports the capture, which imports the rules)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from peakmem.trace.events import EventKind

aten = torch.ops.aten
F32 = 4


@dataclass
class Case:
    name: str
    make: Callable[[], tuple]  # inputs on "cuda" (the capture device)
    call: Callable[..., Any]
    cuda: list[tuple[int, str]]  # (bytes, what) in allocation order; transients included
    source: str
    rule: str = "-"
    note: str = ""


@dataclass
class CaseResult:
    case: Case
    meta: list[tuple[int, str]] = field(default_factory=list)
    with_rules: list[tuple[int, str]] = field(default_factory=list)
    error: str | None = None

    @property
    def cuda_sizes(self) -> list[int]:
        return [size for size, _ in self.case.cuda if size > 0]

    @property
    def finding(self) -> bool:
        return [s for s, _ in self.meta] != self.cuda_sizes

    @property
    def covered(self) -> bool:
        return [s for s, _ in self.with_rules] == self.cuda_sizes


def _randn(*shape: int, requires_grad: bool = False, dtype: torch.dtype = torch.float32):
    return torch.randn(*shape, device="cuda", dtype=dtype, requires_grad=requires_grad)


N, C, H, W = 32, 64, 28, 28  # the reference activation: 6.1 MiB in fp32
X = N * C * H * W * F32
NC = N * C * F32
B, K = 256, 1000  # the reference classifier batch / classes
# a full sum/mean of the reference activation on an A100 (Reduce.cuh setReduceConfig: 1605632
# values, 512 threads along x, ceil(3136 / 16) = 196 blocks -> 4 x 196 bytes; cuda_rules/reductions.py)
REDUCE_X = [(4 * 196, "reduce kernel staging buffer, freed"), (4, "reduce kernel semaphores, freed")]
L = B * K * F32


def cases() -> list[Case]:
    act = (lambda: (_randn(N, C, H, W),))  # noqa: E731
    act2 = (lambda: (_randn(N, C, H, W), _randn(N, C, H, W)))  # noqa: E731
    out_only = "outputs only"
    acts = [
        ("gelu", act, aten.gelu.default, "ActivationGeluKernel.cu"),
        ("gelu_backward (none)", act2, aten.gelu_backward.default, "ActivationGeluKernel.cu"),
        ("gelu_backward (tanh)", act2, lambda g, x: aten.gelu_backward(g, x, approximate="tanh"), "ActivationGeluKernel.cu"),
        ("silu", act, aten.silu.default, "ActivationSiluKernel.cu"),
        ("silu_backward", act2, aten.silu_backward.default, "ActivationSiluKernel.cu"),
        ("mish", act, aten.mish.default, "ActivationMishKernel.cu"),
        ("mish_backward", act2, aten.mish_backward.default, "ActivationMishKernel.cu"),
        ("hardswish", act, aten.hardswish.default, "ActivationHardswishKernel.cu"),
        ("hardswish_backward", act2, aten.hardswish_backward.default, "ActivationHardswishKernel.cu"),
        ("hardsigmoid", act, aten.hardsigmoid.default, "ActivationHardsigmoidKernel.cu"),
        ("hardsigmoid_backward", act2, aten.hardsigmoid_backward.default, "ActivationHardsigmoidKernel.cu"),
        ("elu", act, aten.elu.default, "ActivationEluKernel.cu"),
        ("elu_backward", act2, lambda g, x: aten.elu_backward(g, 1.0, 1.0, 1.0, False, x), "ActivationEluKernel.cu"),
        ("selu (elu)", act, F.selu, "Activation.cpp selu -> elu"),
        ("celu (elu)", act, F.celu, "Activation.cpp celu -> elu"),
        ("softplus", act, aten.softplus.default, "ActivationSoftplusKernel.cu"),
        ("softplus_backward", act2, lambda g, x: aten.softplus_backward(g, x, 1.0, 20.0), "ActivationSoftplusKernel.cu"),
        ("leaky_relu", act, aten.leaky_relu.default, "ActivationLeakyReluKernel.cu"),
        ("leaky_relu_backward", act2, lambda g, x: aten.leaky_relu_backward(g, x, 0.01, False), "ActivationLeakyReluKernel.cu"),
        ("tanh_backward", act2, aten.tanh_backward.default, "UnaryOps / BinaryMiscBackwardOpsKernels.cu"),
        ("sigmoid_backward", act2, aten.sigmoid_backward.default, "BinaryMiscBackwardOpsKernels.cu"),
        ("threshold_backward", act2, lambda g, x: aten.threshold_backward(g, x, 0.0), "ActivationThresholdKernel.cu"),
        ("softshrink", act, aten.softshrink.default, "ActivationSoftshrinkKernel.cu"),
        ("hardtanh", act, aten.hardtanh.default, "Activation.cpp hardtanh -> clamp"),
        ("hardtanh_backward", act2, lambda g, x: aten.hardtanh_backward(g, x, -1.0, 1.0), "ActivationHardtanhKernel.cu"),
        ("relu6", act, F.relu6, "Activation.cpp relu6 -> hardtanh"),
    ]
    found = [
        Case(name, make, call, [(X, "output")], f"aten/src/ATen/native/cuda/{src}", note=out_only)
        for name, make, call, src in acts
    ]
    found[6].rule = found[4].rule = "fused kernel (activations.py)"
    found += [
        Case("log_sigmoid_forward", act, aten.log_sigmoid_forward.default,
             [(X, "output"), (0, "buffer: empty on CUDA")],
             "aten/src/ATen/native/cuda/LogSigmoid.cu log_sigmoid_forward_cuda",
             "fused kernel (activations.py)", "meta/CPU keep an input-size buffer for backward"),
        Case("prelu", lambda: (_randn(N, C, H, W), _randn(C)), F.prelu, [(X, "output")],
             "aten/src/ATen/native/Activation.cpp prelu -> _prelu_kernel"),
        Case("_prelu_kernel_backward", lambda: (_randn(N, C, H, W), _randn(N, C, H, W), _randn(C)),
             lambda g, x, w: aten._prelu_kernel_backward(g, x, w.view(1, C, 1, 1)),
             [(X, "grad_input"), (X, "grad_weight before its reduction")],
             "aten/src/ATen/native/Activation.cpp _prelu_kernel_backward (TensorIterator, two outputs)"),
        Case("glu", lambda: (_randn(N, C, H, W),), lambda x: aten.glu(x, 1), [(X // 2, "output")],
             "aten/src/ATen/native/cuda/ActivationGluKernel.cu"),
        Case("glu_backward", lambda: (_randn(N, C // 2, H, W), _randn(N, C, H, W)),
             lambda g, x: aten.glu_backward(g, x, 1), [(X, "grad_input")],
             "aten/src/ATen/native/cuda/ActivationGluKernel.cu"),
    ]
    found += _norm_cases() + _loss_cases() + _other_cases()
    return found


def _bn_inputs(requires_grad: bool = False):
    return (_randn(N, C, H, W, requires_grad=requires_grad), _randn(C), _randn(C), _randn(C), _randn(C))


def _norm_cases() -> list[Case]:
    bn_src = ("aten/src/ATen/native/Normalization.cpp _batch_norm_impl_index -> "
              "aten/src/ATen/native/cudnn/BatchNorm.cpp cudnn_batch_norm")
    g = 8
    return [
        Case("batch_norm (training, cuDNN)", _bn_inputs,
             lambda x, w, b, rm, rv: torch.batch_norm(x, w, b, rm, rv, True, 0.1, 1e-5, True),
             [(X, "output"), (0, "workspace (assumed 0)"), (0, "reserve (assumed 0)"),
              (C * F32, "save_mean"), (C * F32, "save_var")],
             bn_src, "op rule (norms.py)", "workspace/reserve sizes need a GPU: stack profile"),
        Case("native_batch_norm_backward (cuDNN, no grad_input wanted)",
             lambda: (_randn(N, C, H, W), _randn(N, C, H, W), _randn(C), _randn(C), _randn(C),
                      _randn(C), _randn(C)),
             lambda go, x, w, rm, rv, sm, si: aten.native_batch_norm_backward(
                 go, x, w, rm, rv, sm, si, True, 1e-5, [False, True, True]),
             [(X, "grad_input (always written)"), (C * F32, "grad_weight"), (C * F32, "grad_bias"),
              (0, "workspace (assumed 0)")],
             "aten/src/ATen/native/cudnn/BatchNorm.cpp cudnn_batch_norm_backward",
             "op rule (norms.py)", "meta also returns all three gradients"),
        Case("native_layer_norm", lambda: (_randn(N * H * W, C), _randn(C), _randn(C)),
             lambda x, w, b: aten.native_layer_norm(x, [C], w, b, 1e-5),
             [(X, "Y"), (N * H * W * F32, "mean"), (N * H * W * F32, "rstd")],
             "aten/src/ATen/native/cuda/layer_norm_kernel.cu"),
        Case("native_layer_norm_backward",
             lambda: (_randn(N * H * W, C), _randn(N * H * W, C), _randn(N * H * W, 1),
                      _randn(N * H * W, 1), _randn(C), _randn(C)),
             lambda go, x, m, r, w, b: aten.native_layer_norm_backward(go, x, [C], m, r, w, b, [True, True, True]),
             [(X, "dX"), (C * F32, "dgamma"), (C * F32, "dbeta")],
             "aten/src/ATen/native/cuda/layer_norm_kernel.cu (2.4-2.6: no partial buffers)"),
        Case("native_group_norm", lambda: (_randn(N, C, H, W), _randn(C), _randn(C)),
             lambda x, w, b: aten.native_group_norm(x, w, b, N, C, H * W, g, 1e-5),
             [(X, "Y"), (N * g * F32, "mean"), (N * g * F32, "rstd"), (NC, "a"), (NC, "b")],
             "aten/src/ATen/native/cuda/group_norm_kernel.cu GroupNormKernelImplInternal",
             "op rule (norms.py)"),
        Case("native_group_norm_backward",
             lambda: (_randn(N, C, H, W), _randn(N, C, H, W), _randn(N, g), _randn(N, g), _randn(C)),
             lambda go, x, m, r, w: aten.native_group_norm_backward(go, x, m, r, w, N, C, H * W, g, [True, True, True]),
             [(X, "dX"), (C * F32, "dgamma"), (C * F32, "dbeta"), (NC, "ds"), (NC, "db"),
              (N * g * F32, "c2"), (N * g * F32, "c3"), (NC, "c1")],
             "aten/src/ATen/native/cuda/group_norm_kernel.cu GroupNormBackwardKernelImplInternal",
             "op rule (norms.py)"),
        Case("instance_norm (training)", lambda: (_randn(N, C, H, W), _randn(C), _randn(C)),
             lambda x, w, b: F.instance_norm(x, weight=w, bias=b),
             [(N * C * F32, "weight.repeat"), (N * C * F32, "bias.repeat"), (X, "output"),
              (N * C * F32, "save_mean"), (N * C * F32, "save_var")],
             "aten/src/ATen/native/Normalization.cpp instance_norm -> batch_norm (cuDNN)",
             "op rule (norms.py, via batch norm)", "composite on both"),
    ]


def _loss_cases() -> list[Case]:
    target = lambda: (_randn(N, C, H, W), _randn(N, C, H, W))  # noqa: E731
    prob = lambda: (torch.rand(N, C, H, W, device="cuda"), torch.rand(N, C, H, W, device="cuda"))  # noqa: E731
    cls = lambda: (_randn(B, K), torch.randint(0, K, (B,), device="cuda"))  # noqa: E731
    loss_src = "aten/src/ATen/native/Loss.cpp"
    return [
        Case("mse_loss (mean)", target, F.mse_loss, [(F32, "output"), (X, "loss, freed"), *REDUCE_X],
             f"{loss_src} TORCH_IMPL_FUNC(mse_loss_out)", "op rule (losses.py)"),
        Case("mse_loss_backward", lambda: (torch.ones((), device="cuda"),) + target(),
             lambda g, x, t: aten.mse_loss_backward(g, x, t, 1), [(X, "grad_input")],
             f"{loss_src} mse_loss_backward (in place)"),
        Case("smooth_l1_loss (mean)", target, F.smooth_l1_loss,
             [(F32, "output"), (X, "loss, freed"), *REDUCE_X],
             f"{loss_src} TORCH_IMPL_FUNC(smooth_l1_loss_out)", "op rule (losses.py)"),
        Case("huber_loss (mean)", target, F.huber_loss, [(X, "loss"), (F32, "output"), *REDUCE_X],
             f"{loss_src} huber_loss", "op rule (losses.py)"),
        Case("l1_loss (mean)", target, F.l1_loss,
             [(X, "input - target"), (X, "abs"), (F32, "mean"), *REDUCE_X],
             f"{loss_src} l1_loss (composite on both)"),
        Case("binary_cross_entropy (mean)", prob, F.binary_cross_entropy,
             [(X, "loss, resized to the scalar in place (storage kept)"), (F32, "loss.mean(), freed"),
              *REDUCE_X],
             "aten/src/ATen/native/cuda/Loss.cu binary_cross_entropy_out_cuda",
             "fused kernel + op rule (losses.py)"),
        Case("binary_cross_entropy_backward", lambda: (torch.ones((), device="cuda"),) + prob(),
             lambda g, x, t: aten.binary_cross_entropy_backward(g, x, t), [(X, "grad_input")],
             "aten/src/ATen/native/cuda/Loss.cu binary_cross_entropy_backward_cuda"),
        Case("binary_cross_entropy_with_logits (mean)", prob, F.binary_cross_entropy_with_logits,
             [(X, "log_sigmoid"), (X, "1 - target"), (F32, "output"), *REDUCE_X],
             f"{loss_src} binary_cross_entropy_with_logits (CompositeExplicitAutograd)",
             "op rule (losses.py)", "meta ran the composite below the recorder"),
        Case("kl_div (batchmean)", target, lambda x, t: F.kl_div(x, t, reduction="batchmean"),
             [(X, "xlogy(target, target)"), (X, "target * input"), (X, "sub"), (F32, "sum"), *REDUCE_X,
              (F32, "/ batch")],
             f"{loss_src} kl_div (composite on both)"),
        Case("cross_entropy", cls, F.cross_entropy,
             [(L, "log_softmax"), (F32, "loss"), (F32, "total_weight")],
             "aten/src/ATen/native/cuda/SoftMax.cu, Loss.cu nll_loss_forward"),
        Case("nll_loss_backward", lambda: (torch.ones((), device="cuda"), _randn(B, K),
                                           torch.randint(0, K, (B,), device="cuda"), torch.ones((), device="cuda")),
             lambda g, x, t, tw: aten.nll_loss_backward(g, x, t, None, 1, -100, tw),
             [(L, "grad_input (zeroed)")], "aten/src/ATen/native/cuda/Loss.cu nll_loss_backward"),
        Case("_log_softmax_backward_data", lambda: (_randn(B, K), _randn(B, K)),
             lambda g, y: aten._log_softmax_backward_data(g, y, 1, torch.float32), [(L, "grad_input")],
             "aten/src/ATen/native/cuda/SoftMax.cu"),
        Case("_softmax_backward_data", lambda: (_randn(B, K), _randn(B, K)),
             lambda g, y: aten._softmax_backward_data(g, y, 1, torch.float32),
             [(L, "grad_input"), (L, "tmp = grad * output, freed")],
             "aten/src/ATen/native/cuda/SoftMax.cu softmax_backward_cuda_out", "cuda_rules/softmax.py"),
        Case("nll_loss2d", lambda: (_randn(N, C, H, W), torch.randint(0, C, (N, H, W), device="cuda")),
             lambda x, t: F.nll_loss(x, t), [(F32, "output"), (F32, "total_weight")],
             "aten/src/ATen/native/cuda/NLLLoss2d.cu"),
    ]


def _other_cases() -> list[Case]:
    act = lambda: (_randn(N, C, H, W),)  # noqa: E731
    half = N * C * (H // 2) * (W // 2) * F32
    return [
        Case("max_pool2d_with_indices", act, lambda x: aten.max_pool2d_with_indices(x, [2, 2], [2, 2]),
             [(half, "output"), (half * 2, "indices (int64)")],
             "aten/src/ATen/native/cuda/DilatedMaxPool2d.cu"),
        Case("max_pool2d_with_indices_backward",
             lambda: (_randn(N, C, H // 2, W // 2), _randn(N, C, H, W),
                      torch.zeros(N, C, H // 2, W // 2, dtype=torch.int64, device="cuda")),
             lambda g, x, i: aten.max_pool2d_with_indices_backward(g, x, [2, 2], [2, 2], [0, 0], [1, 1], False, i),
             [(X, "grad_input")], "aten/src/ATen/native/cuda/DilatedMaxPool2d.cu"),
        Case("avg_pool2d", act, lambda x: aten.avg_pool2d(x, [2, 2], [2, 2]), [(half, "output")],
             "aten/src/ATen/native/cuda/AveragePool2d.cu"),
        Case("avg_pool2d_backward", lambda: (_randn(N, C, H // 2, W // 2), _randn(N, C, H, W)),
             lambda g, x: aten.avg_pool2d_backward(g, x, [2, 2], [2, 2], [0, 0], False, True, None),
             [(X, "grad_input")], "aten/src/ATen/native/cuda/AveragePool2d.cu"),
        Case("adaptive_avg_pool2d (1x1)", act, lambda x: F.adaptive_avg_pool2d(x, 1), [(NC, "mean")],
             "aten/src/ATen/native/AdaptiveAveragePooling.cpp (mean for 1x1, on both)"),
        Case("_adaptive_avg_pool2d_backward", lambda: (_randn(N, C, 7, 7), _randn(N, C, H, W)),
             aten._adaptive_avg_pool2d_backward.default, [(X, "grad_input")],
             "aten/src/ATen/native/cuda/AdaptiveAveragePooling.cu"),
        Case("adaptive_max_pool2d", act, lambda x: aten.adaptive_max_pool2d(x, [7, 7]),
             [(N * C * 49 * F32, "output"), (N * C * 49 * 8, "indices")],
             "aten/src/ATen/native/cuda/AdaptiveMaxPooling2d.cu"),
        Case("upsample_nearest2d", act, lambda x: aten.upsample_nearest2d(x, [2 * H, 2 * W]),
             [(4 * X, "output")], "aten/src/ATen/native/cuda/UpSampleNearest2d.cu"),
        Case("upsample_bilinear2d", act, lambda x: aten.upsample_bilinear2d(x, [2 * H, 2 * W], False),
             [(4 * X, "output")], "aten/src/ATen/native/cuda/UpSampleBilinear2d.cu"),
        Case("cumsum", act, lambda x: torch.cumsum(x, 1), [(X, "output")],
             "aten/src/ATen/native/cuda/ScanKernels.cpp", note="cub scan temp storage for a "
             "1-d scan over the innermost dim is not modelled (small)"),
    ]


@contextmanager
def _rules_disabled() -> Iterator[None]:
    """The capture without any CUDA rule: what the bare meta path records."""
    from peakmem.cuda_rules import registry

    saved = {name: dict(getattr(registry, name)) for name in (
        "OP_RULES", "FUSED_KERNELS", "COMPOSITE_RULES", "FUNCTION_RULES")}
    try:
        for name in saved:
            getattr(registry, name).clear()
        yield
    finally:
        for name, content in saved.items():
            getattr(registry, name).update(content)


def _allocations_after_inputs(case: Case) -> list[tuple[int, str]]:
    from peakmem.capture import capture_callable
    from peakmem.profiles import load_gpu, load_stack

    gpu, stack = load_gpu("a100-40gb"), load_stack("2.4.1")
    keep: list[Any] = []

    def inputs_only() -> None:
        keep.append(case.make())

    def with_op() -> None:
        inputs = case.make()
        keep.append((inputs, case.call(*inputs)))

    def allocs(trace) -> list[tuple[int, str]]:
        return [
            (size, trace.tag_of(index).op)
            for index, (kind, _i, size, _s, _t) in enumerate(trace.events())
            if kind == EventKind.ALLOC
        ]

    with torch.no_grad():
        before = capture_callable(inputs_only, gpu=gpu, stack=stack, steps=0)
        after = capture_callable(with_op, gpu=gpu, stack=stack, steps=0)
    for result in (before, after):
        if result.error is not None:
            raise RuntimeError(result.error_text)
    keep.clear()
    return allocs(after.trace)[len(allocs(before.trace)):]


def run_case(case: Case) -> CaseResult:
    result = CaseResult(case)
    try:
        with _rules_disabled():
            result.meta = _allocations_after_inputs(case)
        result.with_rules = _allocations_after_inputs(case)
    except Exception as exc:  # reported in the table
        result.error = f"{type(exc).__name__}: {exc}".splitlines()[0][:120]
    return result


def run_audit() -> list[CaseResult]:
    return [run_case(case) for case in cases()]
