import pytest
import torch

from peakmem.capture import capture_callable
from peakmem.cuda_rules.blas import workspace_config_bytes
from peakmem.profiles import load_gpu, load_stack
from tests.capture.capture_helpers import allocations


def mlp_step():
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).cuda()
    model(torch.randn(8, 16, device="cuda")).sum().backward()


def workspaces(result, op):
    return [(size, tag.phase) for size, tag in allocations(result.trace, "workspace", op=op)]


@pytest.mark.parametrize("gpu, size", [("a100-40gb", 8519680), ("h100-80gb", 33554432)])
def test_one_cublas_workspace_per_thread_sized_by_architecture(gpu, size, stack24):
    result = capture_callable(mlp_step, gpu=load_gpu(gpu), stack=stack24)
    # forward on the main thread, backward on autograd's device thread: one each, never freed
    assert workspaces(result, "cublas_workspace") == [(size, "forward"), (size, "backward")]


def test_cublaslt_transient_per_addmm_in_torch_24_only(a100, stack24):
    result = capture_callable(mlp_step, gpu=a100, stack=stack24)
    assert workspaces(result, "cublaslt_workspace") == [(1048576, "forward")] * 2
    newer = capture_callable(mlp_step, gpu=a100, stack=load_stack("2.6.0"))
    assert workspaces(newer, "cublaslt_workspace") == []


def test_addmm_without_a_vector_bias_skips_the_lt_path(a100, stack24):
    def job():
        bias = torch.randn(8, 16, device="cuda")
        torch.addmm(bias, torch.randn(8, 16, device="cuda"), torch.randn(16, 16, device="cuda"))

    result = capture_callable(job, gpu=a100, stack=stack24)
    assert workspaces(result, "cublaslt_workspace") == []
    assert workspaces(result, "cublas_workspace") == [(8519680, "other")]


def test_cublas_workspace_config_overrides(a100, stack24, monkeypatch):
    assert workspace_config_bytes(":4096:8") == 4096 * 1024 * 8
    assert workspace_config_bytes(":4096:2:16:8") == 8519680
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")
    result = capture_callable(mlp_step, gpu=a100, stack=stack24)
    assert {size for size, _ in workspaces(result, "cublas_workspace")} == {16 * 1024 * 8}


@pytest.fixture
def deterministic():
    """`torch.use_deterministic_algorithms(True)` for one test (this process's switch)."""
    before = (torch.are_deterministic_algorithms_enabled(),
              torch.is_deterministic_algorithms_warn_only_enabled())
    yield lambda warn_only=False: torch.use_deterministic_algorithms(True, warn_only=warn_only)
    torch.use_deterministic_algorithms(before[0], warn_only=before[1])


def _deterministic_step(switch, **kwargs):
    def job():
        switch(**kwargs)
        mlp_step()
    return job


def test_deterministic_algorithms_without_cublas_config_raise_as_on_cuda(
        a100, stack24, monkeypatch, deterministic):
    """CUDA >= 10.2 refuses a cuBLAS gemm under deterministic algorithms unless
    CUBLAS_WORKSPACE_CONFIG is :4096:8 or :16:8 (ATen Context::alertCuBLASConfigNotDeterministic);
    the capture ran such a job to an estimate although it fails on the GPU."""
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    result = capture_callable(_deterministic_step(deterministic), gpu=a100, stack=stack24)
    assert result.error is not None and "CUBLAS_WORKSPACE_CONFIG=:4096:8" in result.error_text
    assert "Deterministic behavior was enabled" in result.error_text
    for config in (":4096:8", ":16:8"):
        monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", config)
        result = capture_callable(_deterministic_step(deterministic), gpu=a100, stack=stack24)
        assert result.error is None, result.error_text
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:2")  # not a deterministic setting
    result = capture_callable(_deterministic_step(deterministic), gpu=a100, stack=stack24)
    assert result.error is not None


def _matmul():
    a = torch.randn(8, 16, device="cuda")
    return a @ torch.randn(16, 4, device="cuda")  # aten.mm: a cuBLAS gemm


def test_cublas_config_set_after_the_first_matmul_is_not_read(
        a100, stack24, monkeypatch, deterministic):
    """ATen reads CUBLAS_WORKSPACE_CONFIG for the determinism check once per process, at the
    first gemm, with deterministic algorithms on or off (aten/src/ATen/Context.cpp):

        void Context::alertCuBLASConfigNotDeterministic() const {
          static bool cublas_config_deterministic = checkCuBLASConfigDeterministic();
          if (C10_LIKELY(!deterministicAlgorithms() || cublas_config_deterministic)) {
            return;
          }

    with `checkCuBLASConfigDeterministic` doing `std::getenv(cublas_config_var_name)`. A job that
    sets the variable after a matmul still fails its next gemm under deterministic algorithms."""
    import os

    # set, then deleted: monkeypatch records the undo (a bare `delenv(raising=False)` of an unset
    # variable records none, and the job's own setting leaked into the worker's later tests)
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", "")
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG")
    reached = []

    def job():
        _matmul()  # the static is set here: unset, not deterministic
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
        deterministic()
        reached.append("deterministic")
        _matmul()
        reached.append("second matmul")

    result = capture_callable(job, gpu=a100, stack=stack24)
    assert reached == ["deterministic"]
    assert result.error is not None and "Deterministic behavior was enabled" in result.error_text

    def job_setting_it_first():  # the same lines with the variable set before any gemm: fine
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
        _matmul()
        deterministic()
        _matmul()

    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    result = capture_callable(job_setting_it_first, gpu=a100, stack=stack24)
    assert result.error is None, result.error_text


def test_cublas_config_unset_after_the_first_matmul_still_counts(
        a100, stack24, monkeypatch, deterministic):
    """The reverse (same ATen lines): the variable read at the first gemm was deterministic, so
    unsetting it later leaves the gemms under deterministic algorithms allowed."""
    import os

    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")

    def job():
        _matmul()
        del os.environ["CUBLAS_WORKSPACE_CONFIG"]
        deterministic()
        _matmul()

    result = capture_callable(job, gpu=a100, stack=stack24)
    assert result.error is None, result.error_text

    def job_without_it():
        deterministic()
        _matmul()

    # the next capture in this process is a new process to the job: the variable is read anew
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    result = capture_callable(job_without_it, gpu=a100, stack=stack24)
    assert result.error is not None and "CUBLAS_WORKSPACE_CONFIG=:4096:8" in result.error_text


def test_deterministic_warn_only_warns_and_runs(a100, stack24, monkeypatch, deterministic):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    with pytest.warns(UserWarning, match="it uses CuBLAS"):
        result = capture_callable(_deterministic_step(deterministic, warn_only=True), gpu=a100,
                                  stack=stack24)
    assert result.error is None, result.error_text
    assert workspaces(result, "cublas_workspace")  # it ran its gemms
