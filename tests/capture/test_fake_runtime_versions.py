"""What the fake runtime says about the build and the driver (the stack profile's data, not
the GPU's own arch or a fixed driver), and torch 2.13's cuBLAS workspace size API."""

import subprocess

import pytest
import torch

from peakmem.capture import capture_callable
from peakmem.capture.fake_nvidia_smi import install
from peakmem.capture.fake_nvidia_smi import main as nvidia_smi
from peakmem.profiles import load_gpu, load_stack
from tests.capture.capture_helpers import allocations

MIB = 2**20


def _capture(job, gpu, stack):
    result = capture_callable(job, gpu=gpu, stack=stack)
    assert result.error is None, result.error_text
    return result


def test_arch_list_is_the_wheels_not_the_gpus(a100, stack24):
    seen = {}
    h200, stack211 = load_gpu("h200"), load_stack("2.11")
    _capture(lambda: seen.setdefault("2.4", torch.cuda.get_arch_list()), a100, stack24)
    _capture(lambda: seen.setdefault("2.11", torch.cuda.get_arch_list()), h200, stack211)
    # the cu121 wheel was built for 5.0 to 9.0; the A100's sm_80 is one of them
    assert seen["2.4"] == ["sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90"]
    # CUDA 13 wheels start at Turing and reach Blackwell; the H200's sm_90 among them
    assert seen["2.11"][0] == "sm_75" and "sm_90" in seen["2.11"] and "sm_120" in seen["2.11"]
    assert "sm_50" not in seen["2.11"]


@pytest.mark.skipif(not hasattr(torch.backends.cuda, "cublas_workspace_size"),
                    reason="torch.backends.cuda.cublas_workspace_size is torch 2.13's")
def test_cublas_workspace_size_queries_and_sets_the_handles_workspace(a100, stack24, monkeypatch):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    seen = {}
    x = None

    def job():
        nonlocal x
        seen["default"] = torch.backends.cuda.cublas_workspace_size()
        seen["set"] = torch.backends.cuda.cublas_workspace_size(2 * MIB)
        seen["after"] = torch.backends.cuda.blas_workspace_size(backend="cublas")
        seen["lt"] = torch.backends.cuda.cublaslt_workspace_size()
        x = torch.randn(64, 64, device="cuda")
        x @ x  # the main thread's handle: first used now, with the size set

    result = _capture(job, a100, stack24)
    # torch 2.4's default for an sm_80 card: ":4096:2:16:8" = 4 MiB * 2 + 16 KiB * 8
    assert seen["default"] == 4096 * 1024 * 2 + 16 * 1024 * 8 == 8519680
    assert seen["set"] == seen["after"] == 2 * MIB
    assert seen["lt"] == MIB  # CUBLASLT_WORKSPACE_SIZE's default, 1024 KiB
    workspaces = [size for size, tag in allocations(result.trace) if "cublas_workspace" in tag.op]
    assert workspaces == [2 * MIB]


def test_cublas_workspace_size_refuses_a_negative_size(a100, stack24):
    if not hasattr(torch.backends.cuda, "cublas_workspace_size"):
        pytest.skip("torch 2.13's API")

    def job():
        torch.backends.cuda.cublas_workspace_size(-1)

    result = capture_callable(job, gpu=a100, stack=stack24)
    assert result.error_type == "RuntimeError" and "non-negative" in result.error_text


def test_nvidia_smi_prints_the_stack_drivers_cuda_version(tmp_path, monkeypatch):
    stack = load_stack("2.11")
    code, text = nvidia_smi([], "NVIDIA H200", 143771, 1, "9.0", stack.driver_version, "13.0")
    assert code == 0 and "Driver Version: 580.159.04" in text and "CUDA Version: 13.0" in text
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    executable = install(tmp_path, "NVIDIA H200", 143771 * MIB, (9, 0), stack.driver_version,
                         stack.driver_cuda_version)
    out = subprocess.run([str(executable), "-q"], capture_output=True, text=True, check=True)
    assert "Driver Version                            : 580.159.04" in out.stdout
    assert "CUDA Version                              : 13.0" in out.stdout
    csv = subprocess.run([str(executable), "--query-gpu=driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True, check=True)
    assert csv.stdout == "580.159.04\n"
    # a stack without a measured driver keeps the default one (R550, CUDA 12.4)
    older = load_stack("2.4.1")
    assert (older.driver_version, older.driver_cuda_version) == ("550.54.15", (12, 4))


def test_nvml_driver_versions_follow_the_stack(a100):
    from peakmem.capture.fake_nvml import driver

    seen = {}
    _capture(lambda: seen.setdefault("v", driver()), a100, load_stack("2.11"))
    assert seen["v"] == ("580.159.04", 13000)
