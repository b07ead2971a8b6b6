"""Environment variables the CUDA rules read, each at the moment torch reads it.

ATen reads most of its tuning variables once per process, into a C++ function-local static, at
the first call that reaches it; a job that sets one in `os.environ` (which `putenv`s it) before
that call changes what the GPU run does, and one that sets it after changes nothing. The capture
runs in the job's own process, so `os.environ` is the job's environment: each rule asks
`environment_value(ctx, NAME)` where the CUDA code reaches its static, and the first answer of
the capture is kept (`RuleContext.read_once`) for the rest of it.

`READ_ONCE` names every such variable with where torch reads it; rules read no other variable
(tests/cuda_rules/test_environment.py checks that no rule module reads `os.environ` itself).
Variables torch reads at every use (not once) are in `READ_EACH_USE`, read with `environment_now`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from peakmem.cuda_rules.registry import RuleContext


@dataclass(frozen=True)
class EnvironmentRead:
    """One environment variable a rule reads: when torch reads it, and where in its source."""

    name: str
    when: str
    source: str


READ_ONCE: dict[str, EnvironmentRead] = {}
READ_EACH_USE: dict[str, EnvironmentRead] = {}


def _register(registry: dict[str, EnvironmentRead], read: EnvironmentRead) -> None:
    if read.name in READ_ONCE or read.name in READ_EACH_USE:
        raise ValueError(f"{read.name} is already registered")
    registry[read.name] = read


for _read in (
    EnvironmentRead(
        "DISABLE_ADDMM_CUDA_LT",
        "the first addmm / mm / _addmm_activation on the GPU (any shape, Lt path or not)",
        "aten/src/ATen/native/cuda/Blas.cpp addmm_out_cuda_impl: `static bool "
        "disable_addmm_cuda_lt = getDisableAddmmCudaLt();` (mm_out_cuda calls "
        "addmm_out_cuda_impl), torch 2.1 to 2.13",
    ),
    EnvironmentRead(
        "TORCH_LINEAR_FLATTEN_3D",
        "the first `linear` with a bias whose input is not 2-D and takes neither contiguous "
        "flattening branch (a non-contiguous input)",
        "aten/src/ATen/native/Linear.cpp parseLinearFlatten3d (`static int value = -1`, "
        "std::getenv on the first call), reached from `linear` as `parseLinearFlatten3d() && "
        "input_dim == 3` after the contiguous branches, torch 2.4 to 2.13",
    ),
    EnvironmentRead(
        "TORCH_CUDNN_SDPA_PREFERRED",
        "the first scaled_dot_product_attention backend choice on the GPU (torch 2.9, 2.10)",
        "aten/src/ATen/native/transformers/cuda/sdp_utils.cpp check_prefer_cudnn_attention: "
        "`static const bool prefer_cudnn = c10::utils::check_env(...) != false`, called once "
        "from priority_order (`priority_order_init_`)",
    ),
    EnvironmentRead(
        "TORCH_CUDNN_SDPA_DEPRIORITIZED",
        "the first scaled_dot_product_attention backend choice on the GPU (torch 2.11 on)",
        "sdp_utils.cpp check_prefer_cudnn_attention: `static const bool prefer_cudnn = "
        "c10::utils::check_env(\"TORCH_CUDNN_SDPA_DEPRIORITIZED\") != true`, once from "
        "priority_order",
    ),
    EnvironmentRead(
        "CUBLAS_WORKSPACE_CONFIG",
        "the determinism check: the first cuBLAS gemm (with deterministic algorithms on or off)",
        "aten/src/ATen/Context.cpp alertCuBLASConfigNotDeterministic: `static bool "
        "cublas_config_deterministic = checkCuBLASConfigDeterministic();`",
    ),
):
    _register(READ_ONCE, _read)

_register(READ_EACH_USE, EnvironmentRead(
    "CUBLAS_WORKSPACE_CONFIG:workspace",
    "the workspace size: each new cuBLAS handle's workspace (peakmem's two: the main thread's "
    "and autograd's)",
    "aten/src/ATen/cuda/CublasHandlePool.cpp getChosenWorkspaceSize -> parseChosenWorkspaceSize "
    "(no static in the 2.x releases peakmem has stack profiles for)",
))


def environment_value(ctx: RuleContext, name: str) -> str | None:
    """The value of `name` torch holds now: the job's environment at the rule's first read of it
    in this capture (its static), the same value ever after."""
    if name not in READ_ONCE:
        raise KeyError(f"{name} is not a registered read-once variable")
    return ctx.read_once(("environ", name), lambda: os.environ.get(name))


def environment_now(key: str) -> str | None:
    """A variable torch reads at every use (`READ_EACH_USE`, keyed `NAME[:what]`): its value in
    the job's environment now."""
    if key not in READ_EACH_USE:
        raise KeyError(f"{key} is not a registered read-each-use variable")
    return os.environ.get(key.split(":", 1)[0])


def value_outside_a_capture(name: str) -> str | None:
    """This process's value of `name` now: for a rule's helpers called outside a capture (tests,
    benchmarks), where no job has a first read."""
    return os.environ.get(name)
