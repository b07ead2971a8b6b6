"""cuBLAS / cuBLASLt workspaces.

- Every cuBLAS handle gets a workspace from the caching allocator at its first use on a stream
  (PyTorch CublasHandlePool.cpp). Handles are per thread: autograd runs backward on its own
  device thread, so the first backward matmul allocates a second workspace.
- The torch 2.4 cuBLASLt path of `addmm` (bias epilogue) allocates a per-call workspace and frees
  it when the call returns (CUDABlas.cpp `gemm_and_bias`).
- On the torch-2.11 stack the first cuBLASLt call of a thread allocates a 1 MiB workspace that
  stays (CUBLASLT_WORKSPACE_SIZE's default of 1024 KiB; measured in allocator snapshots on an
  H100: one per thread that ran an Lt `addmm`, none for threads that ran only `mm`).
Sizes come from the software-stack profile; `CUBLAS_WORKSPACE_CONFIG` overrides them like it
does on a GPU.
- With `torch.use_deterministic_algorithms(True)` and no deterministic CUBLAS_WORKSPACE_CONFIG
  (":4096:8" or ":16:8"), a cuBLAS gemm raises on CUDA (`warn_only=True`: warns), as
  `Context::alertCuBLASConfigNotDeterministic` does (aten/src/ATen/Context.cpp, called from
  CUDABlas.cpp's gemm family): `cublas_determinism_check`. ATen reads the variable for this
  check once, at the process's first gemm (peakmem reads it for the workspace size at each
  handle's first use).
- DISABLE_ADDMM_CUDA_LT=1 turns the Lt path off; ATen reads it once, at the process's first
  `addmm` or `mm` (cuda_rules/environment.py).
"""

from __future__ import annotations

import torch

from peakmem.cublas_workspace_config import (  # noqa: F401  (WorkspaceConfigError: re-exported)
    WorkspaceConfigError,
    workspace_config_bytes,
)
from peakmem.cuda_rules.environment import environment_now, environment_value
from peakmem.cuda_rules.registry import RuleContext, register_op_rule

aten = torch.ops.aten
_LT_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
_LT_MAX_DIM = 65535 * 32


def cublas_workspace_bytes(ctx: RuleContext) -> int:
    """The workspace torch hands a cuBLAS handle from the caching allocator; 0 where the stack
    gives none (before pytorch/pytorch#83461, torch 1.13, cuBLAS allocated its own and read
    CUBLAS_WORKSPACE_CONFIG itself)."""
    if int(ctx.stack.cublas_workspace_for(ctx.gpu.capability).value) == 0:
        return 0
    chosen = getattr(ctx, "blas_workspace_sizes", {}).get("cublas")
    if chosen is not None:  # torch.backends.cuda.cublas_workspace_size(n): before the variable
        return chosen
    override = environment_now("CUBLAS_WORKSPACE_CONFIG:workspace")
    if override:
        size = workspace_config_bytes(override)
        if size is not None:
            return size
    return int(ctx.stack.cublas_workspace_for(ctx.gpu.capability).value)


DETERMINISTIC_CONFIGS = (":4096:8", ":16:8")
NOT_DETERMINISTIC = (
    "Deterministic behavior was enabled with either `torch.use_deterministic_algorithms(True)` or "
    "`at::Context::setDeterministicAlgorithms(true)`, but this operation is not deterministic "
    "because it uses CuBLAS and you have CUDA >= 10.2. To enable deterministic behavior in this "
    "case, you must set an environment variable before running your PyTorch application: "
    "CUBLAS_WORKSPACE_CONFIG=:4096:8 or CUBLAS_WORKSPACE_CONFIG=:16:8. For more information, go "
    "to https://docs.nvidia.com/cuda/cublas/index.html#results-reproducibility"
)


def cublas_config_deterministic(ctx: RuleContext) -> bool:
    """ATen's `Context::checkCuBLASConfigDeterministic`: CUBLAS_WORKSPACE_CONFIG (`std::getenv`)
    is one of `DETERMINISTIC_CONFIGS` (CUDA >= 10.2, every stack peakmem has a profile for), as
    read at the first gemm."""
    return environment_value(ctx, "CUBLAS_WORKSPACE_CONFIG") in DETERMINISTIC_CONFIGS


def cublas_determinism_check(ctx: RuleContext) -> None:
    """What a cuBLAS gemm does first, `Context::alertCuBLASConfigNotDeterministic`
    (aten/src/ATen/Context.cpp, the same in every torch release since the check came):

        static bool cublas_config_deterministic = checkCuBLASConfigDeterministic();
        if (C10_LIKELY(!deterministicAlgorithms() || cublas_config_deterministic)) {
          return;
        }

    The variable is read once per process, at the first gemm, whether or not deterministic
    algorithms are on then (the static is set before the test): a job that sets or unsets it
    after its first matmul changes nothing. Later, under `torch.use_deterministic_algorithms(
    True)` and a value read that was not deterministic, the gemm raises RuntimeError (warns with
    `warn_only=True`). Lightning's `Trainer(deterministic=True)` and HF's
    `enable_full_determinism` set the variable themselves; a script that calls
    `torch.use_deterministic_algorithms(True)` alone and runs a matmul fails on the GPU."""
    deterministic_config = cublas_config_deterministic(ctx)
    if not torch.are_deterministic_algorithms_enabled() or deterministic_config:
        return
    if torch.is_deterministic_algorithms_warn_only_enabled():
        import warnings

        warnings.warn(NOT_DETERMINISTIC, UserWarning, stacklevel=2)
        return
    raise RuntimeError(NOT_DETERMINISTIC)


def use_cublas_handle(ctx: RuleContext) -> None:
    """The current thread's cuBLAS handle is used: allocate its workspace on first use."""
    thread = "autograd" if ctx.in_backward else "main"
    size = cublas_workspace_bytes(ctx)
    if size == 0:
        return
    ctx.persistent(
        ("cublas_workspace", thread),
        size,
        category="workspace",
        op=f"cublas_workspace[{thread}]",
    )


@register_op_rule(
    [aten.mm, aten.bmm, aten.baddbmm, aten.addbmm, aten.addmv, aten.mv, aten.dot, aten.vdot]
)
def cublas_gemm(ctx: RuleContext, op, args, kwargs, out) -> None:
    if getattr(op, "overloadpacket", op) is aten.mm:
        addmm_lt_disabled(ctx)  # mm_out_cuda runs addmm_out_cuda_impl, which reads the variable
    use_cublas_handle(ctx)
    cublas_determinism_check(ctx)


def addmm_lt_disabled(ctx: RuleContext) -> bool:
    """DISABLE_ADDMM_CUDA_LT=1 as read at the process's first `addmm_out_cuda_impl` (the first
    addmm or mm): `static bool disable_addmm_cuda_lt = getDisableAddmmCudaLt();`."""
    return environment_value(ctx, "DISABLE_ADDMM_CUDA_LT") == "1"


def takes_lt_path(args: tuple, kwargs: dict, disabled: bool = False) -> bool:
    """torch 2.4 `addmm_out_cuda_impl`'s `useLtInterface` condition (`disabled`: the
    DISABLE_ADDMM_CUDA_LT value the process read, `addmm_lt_disabled`)."""
    bias, mat1, mat2 = args[:3]
    beta = kwargs.get("beta", args[3] if len(args) > 3 else 1)
    if disabled:
        return False
    return (
        beta == 1
        and bias.dim() == 1
        and mat1.dim() == 2
        and mat2.dim() == 2
        and bias.shape[0] == mat2.shape[1]
        and bias.is_contiguous()
        and bias.dtype in _LT_DTYPES
        and mat2.shape[0] > 1
        and mat2.shape[1] > 1
        and mat1.shape[0] > 1
        and mat1.shape[1] > 1
        and max(mat1.shape[0], mat1.shape[1], mat2.shape[0], mat2.shape[1]) < _LT_MAX_DIM
    )


def use_cublaslt_handle(ctx: RuleContext) -> None:
    """The current thread's cuBLASLt handle is used: on stacks that give it a workspace of its
    own (`cublaslt_workspace_bytes`), allocate it on first use; it stays for the process."""
    workspace = ctx.stack.cublaslt_workspace
    if workspace is None or not int(workspace.value):
        return
    size = getattr(ctx, "blas_workspace_sizes", {}).get("cublaslt", int(workspace.value))
    if not size:
        return
    thread = "autograd" if ctx.in_backward else "main"
    ctx.persistent(
        ("cublaslt_workspace", thread),
        size,
        category="workspace",
        op=f"cublaslt_workspace[{thread}]",
    )


@register_op_rule(aten.addmm)
def addmm(ctx: RuleContext, op, args, kwargs, out) -> None:
    lt_path = takes_lt_path(args, kwargs, addmm_lt_disabled(ctx))
    use_cublas_handle(ctx)
    if not lt_path:
        cublas_determinism_check(ctx)  # a plain gemm (the Lt epilogue path is `gemm_and_bias`)
    if lt_path:
        use_cublaslt_handle(ctx)
        transient = int(ctx.stack.cublaslt_transient.value)
        if transient:
            ctx.transient(transient, category="workspace", op="cublaslt_workspace")
