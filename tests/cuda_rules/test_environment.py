"""Environment variables ATen reads once per process: the capture reads each from the job's
environment at the call where torch reaches its static (cuda_rules/environment.py)."""

import os
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import peakmem.cuda_rules as cuda_rules
from peakmem.capture import capture_callable
from peakmem.cuda_rules.environment import READ_EACH_USE, READ_ONCE
from peakmem.profiles import load_gpu, load_stack
from tests.capture.capture_helpers import allocations


@pytest.fixture
def unset(monkeypatch):
    """Unset `name` for one test, with the undo recorded even when the job sets it (a bare
    `delenv(raising=False)` of an unset variable records none)."""

    def unset_variable(name: str) -> None:
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)

    return unset_variable


def ops(result, op=None):
    """(op, size) of every allocation the capture recorded, in order."""
    return [((tag.op or "").split(".")[0], size) for size, tag in allocations(result.trace, op=op)]


def test_rules_read_the_environment_only_through_the_registry():
    """No rule module reads `os.environ` / `os.getenv` itself: each variable goes through
    environment.py, which says when torch reads it."""
    folder = Path(cuda_rules.__file__).parent
    readers = [path.name for path in folder.glob("*.py") if path.name != "environment.py"
               and re.search(r"os\.environ|os\.getenv|posix\.environ", path.read_text())]
    assert readers == []
    assert set(READ_ONCE) == {"DISABLE_ADDMM_CUDA_LT", "TORCH_LINEAR_FLATTEN_3D",
                              "TORCH_CUDNN_SDPA_PREFERRED", "TORCH_CUDNN_SDPA_DEPRIORITIZED",
                              "CUBLAS_WORKSPACE_CONFIG"}
    assert set(READ_EACH_USE) == {"CUBLAS_WORKSPACE_CONFIG:workspace"}


# -- DISABLE_ADDMM_CUDA_LT: Blas.cpp addmm_out_cuda_impl's static, first addmm or mm ------------

def _linear_pair():
    """Two 2-D linear layers with a bias: two addmm calls that take the Lt path on torch 2.4, each
    with its 1 MiB cuBLASLt workspace allocated and freed around it (CUDABlas.cpp
    gemm_and_bias)."""
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Linear(16, 4)).cuda()
    with torch.no_grad():
        model(torch.randn(8, 16, device="cuda"))


def _lt_workspaces(result):
    return [size for size, _ in allocations(result.trace, "workspace", op="cublaslt_workspace")]


@pytest.mark.parametrize("first, lt_workspaces", [
    (None, []),  # set before any gemm: no Lt path
    ("mm", [2**20, 2**20]),  # an mm read it (unset) first: the Lt path stays
    ("addmm", [2**20] * 3),  # the same for an addmm (its own Lt workspace, then the two)
    ("bmm", []),  # bmm runs baddbmm_out_cuda_impl: the variable is not read there
])
def test_disable_addmm_cuda_lt_is_read_at_the_first_addmm_or_mm(a100, stack24, unset, first,
                                                                lt_workspaces):
    unset("DISABLE_ADDMM_CUDA_LT")

    def job():
        a = torch.randn(8, 16, device="cuda")
        if first == "mm":
            a @ torch.randn(16, 16, device="cuda")
        elif first == "addmm":
            torch.addmm(torch.randn(16, device="cuda"), a, torch.randn(16, 16, device="cuda"))
        elif first == "bmm":
            torch.bmm(a[None], torch.randn(1, 16, 16, device="cuda"))
        os.environ["DISABLE_ADDMM_CUDA_LT"] = "1"
        _linear_pair()

    result = capture_callable(job, gpu=a100, stack=stack24)
    assert result.error is None, result.error_text
    assert _lt_workspaces(result) == lt_workspaces


# -- TORCH_LINEAR_FLATTEN_3D: Linear.cpp parseLinearFlatten3d, first linear that reaches it -----

def _transposed_linear():
    """`linear` of a non-contiguous (4, 8, 32) float32 input with a bias (96 outputs): on the GPU
    either `matmul` (the input folded to 32 x 32 by a copy, 4 KiB, then `mm`, 12 KiB) and
    `output.add_(bias)` in place, or, with TORCH_LINEAR_FLATTEN_3D=1, `input.contiguous()` (4 KiB)
    and the flattened `addmm` (12 KiB, its Lt workspace on torch 2.4)."""
    layer = torch.nn.Linear(32, 96).cuda()
    with torch.no_grad():
        layer(torch.randn(8, 4, 32, device="cuda").transpose(0, 1))


IN_PLACE = [("clone", 4096), ("mm", 12288)]
FLATTENED = [("clone", 4096), ("addmm", 12288), ("cublaslt_workspace", 2**20)]


@pytest.mark.parametrize("first, expected", [
    (None, FLATTENED),  # set before any linear
    ("3-D transposed", IN_PLACE),  # that linear reached parseLinearFlatten3d: read (unset) there
    ("4-D transposed", IN_PLACE),  # so does a 4-D one (`parseLinearFlatten3d() && input_dim == 3`)
    ("2-D", FLATTENED),  # a 2-D input returns addmm before it: not read
    ("contiguous 3-D", FLATTENED),  # flattened before it: not read
])
def test_linear_flatten_3d_is_read_where_linear_reaches_it(a100, stack24, unset, first, expected):
    unset("TORCH_LINEAR_FLATTEN_3D")
    shapes = {"3-D transposed": (8, 4, 32), "4-D transposed": (8, 4, 2, 32), "2-D": (8, 32),
              "contiguous 3-D": (4, 8, 32)}

    def job():
        if first is not None:
            x = torch.randn(*shapes[first], device="cuda")
            if "transposed" in first:
                x = x.transpose(0, 1)
            F.linear(x, torch.randn(96, 32, device="cuda"), torch.randn(96, device="cuda"))
        os.environ["TORCH_LINEAR_FLATTEN_3D"] = "1"
        _transposed_linear()

    result = capture_callable(job, gpu=a100, stack=stack24)
    assert result.error is None, result.error_text
    made = ops(result)
    bias = max(i for i, entry in enumerate(made) if entry == ("_to_copy", 96 * 4))
    # the layer's call: after its bias and its input (randn), the handle's workspace left out
    last = [entry for entry in made[bias + 2:] if not entry[0].startswith("cublas_workspace[")]
    assert last == expected


# -- TORCH_CUDNN_SDPA_*: sdp_utils.cpp check_prefer_cudnn_attention, first backend choice ------

def _attention(length=128, dims=4):
    shape = (2, 4, length, 64) if dims == 4 else (4, length, 64)
    q, k, v = (torch.randn(*shape, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    with torch.no_grad():
        F.scaled_dot_product_attention(q, k, v)


def _backends(result):
    """The fused backend of each 4-D call, from its output (2 x 4 x 128 x 64 bf16: 128 KiB; the
    3-D call runs the math path, no fused op)."""
    return [op.removeprefix("_scaled_dot_product_").removesuffix("_attention")
            for op, size in ops(result) if op.startswith("_scaled_dot_product_")
            and size == 2 * 4 * 128 * 64 * 2]


@pytest.mark.parametrize("release, variable, value", [
    ("2.9", "TORCH_CUDNN_SDPA_PREFERRED", "0"),
    ("2.11", "TORCH_CUDNN_SDPA_DEPRIORITIZED", "1"),
])
@pytest.mark.parametrize("first, backends", [
    (None, ["flash"]),  # set before the first attention: cuDNN is not preferred
    ("4-D", ["cudnn", "cudnn"]),  # read (unset) at the first call: cuDNN stays first
    ("3-D", ["cudnn"]),  # a 3-D call (math) still chose a backend: read there
])
def test_sdpa_preference_is_read_at_the_first_attention(unset, release, variable, value, first,
                                                        backends):
    from peakmem.capture.fake_memory import allocator_target

    unset(variable)

    def job():
        if first is not None:
            _attention(dims=int(first[0]))
        os.environ[variable] = value
        _attention()

    with allocator_target(None, {"2.9": "2.9.0", "2.11": "2.11.0"}[release]):
        result = capture_callable(job, gpu=load_gpu("h200"), stack=load_stack("2.11"))
    assert result.error is None, result.error_text
    assert _backends(result) == backends
