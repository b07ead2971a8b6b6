"""What a job observes of CUDA's state during a capture, as torch answers it on the target GPU
(capture/cuda_state.py)."""

from __future__ import annotations

import textwrap

import pytest
import torch

from peakmem.capture import capture_callable
from peakmem.profiles import load_gpu, load_stack
from tests.capture.capture_helpers import allocations

MIB = 2**20


def test_is_initialized_turns_true_at_the_first_initialising_call(a100, stack24):
    """torch/cuda/__init__.py: `_initialized` is set by `_lazy_init`; `is_available`,
    `device_count`, `memory_allocated` and `manual_seed` (queued) do not reach it,
    `get_device_name` does."""
    seen = []

    def job():
        seen.append(torch.cuda.is_initialized())
        torch.cuda.is_available()
        torch.cuda.device_count()
        torch.cuda.memory_allocated()
        torch.cuda.manual_seed(0)
        seen.append(torch.cuda.is_initialized())
        torch.cuda.get_device_name(0)
        seen.append(torch.cuda.is_initialized())

    result = capture_callable(job, gpu=a100, stack=stack24)
    assert result.error is None, result.error_text
    assert seen == [False, False, True]


@pytest.mark.parametrize("elements", [4, 0])
def test_is_initialized_turns_true_at_the_first_cuda_tensor(a100, stack24, elements):
    """Any CUDA tensor, an empty one included (its device guard initialises CUDA)."""
    seen = []

    def job():
        seen.append(torch.cuda.is_initialized())
        x = torch.ones(elements, device="cuda")
        seen.append(torch.cuda.is_initialized())
        if torch.cuda.is_initialized():  # the pattern scripts use before a synchronize
            torch.cuda.synchronize()
        del x

    result = capture_callable(job, gpu=a100, stack=stack24)
    assert result.error is None, result.error_text
    assert seen == [False, True]
    assert torch.cuda.is_initialized() is False  # this CPU process's torch again


def test_a_job_that_sets_its_allocator_config_while_cuda_is_not_initialised(tmp_path,
                                                                            monkeypatch):
    """`if not torch.cuda.is_initialized(): os.environ["PYTORCH_CUDA_ALLOC_CONF"] = ...` (the
    guard scripts put before setting it): on the GPU the setting is taken, so the 12 MiB then
    14 MiB job of tests/capture/test_job_alloc_conf.py reserves one 20 MiB expandable page, not
    two native segments (12 + 14 MiB). Before, `is_initialized()` was always True there and the
    job never set it."""
    from peakmem.estimate import estimate_command

    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "")
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF")
    monkeypatch.setenv("PYTORCH_ALLOC_CONF", "")
    monkeypatch.delenv("PYTORCH_ALLOC_CONF")
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent("""\
        import os
        import torch
        if not torch.cuda.is_initialized():
            os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
        x = torch.empty(12 * 2**20, dtype=torch.uint8, device="cuda")
        del x
        y = torch.empty(14 * 2**20, dtype=torch.uint8, device="cuda")
    """))
    result = estimate_command(["python", str(script)], gpu="h200", torch_version="2.13",
                              isolate=False, steps="all", mode="fake")
    assert result.alloc_conf == "expandable_segments:True"
    assert result.peak_reserved_bytes == 20 * MIB


@pytest.mark.parametrize("gpu, stack, emulation, supported, check_tensors", [
    ("a100-40gb", "2.4.1", True, True, 0),  # sm 8.0: native bf16, nothing allocated
    ("v100-32gb", "2.4.1", True, True, 1),  # sm 7.0: torch makes a bf16 tensor, which works
    ("v100-32gb", "2.4.1", False, False, 0),  # including_emulation=False: capability only
    ("v100-32gb", "1.10", True, False, 0),  # torch <= 2.1: no emulation fallback
    ("a100-40gb", "1.10", True, False, 0),  # ... and CUDA 10.2's build says False everywhere
])
def test_is_bf16_supported_as_torch_answers_on_the_target(gpu, stack, emulation, supported,
                                                          check_tensors):
    seen = []

    def job():
        if emulation:
            seen.append(torch.cuda.is_bf16_supported())
            seen.append(torch.cuda.is_bf16_supported())  # lru_cache: one tensor in all
        else:
            seen.append(torch.cuda.is_bf16_supported(including_emulation=False))

    result = capture_callable(job, gpu=load_gpu(gpu), stack=load_stack(stack))
    assert result.error is None, result.error_text
    assert set(seen) == {supported}
    # `torch.tensor([1.0], dtype=torch.bfloat16, device=device)`: 2 bytes
    assert [size for size, _ in allocations(result.trace)] == [2] * check_tensors


@pytest.mark.parametrize("stack, version, cudnn", [
    ("2.4.1", "12.1", 90100),  # the cu121 wheels, cuDNN 9.1.0
    ("2.11", "13.0", 91900),  # measured: benchmarks/groundtruth/h200_versions.json
    ("1.10", "10.2", 90100),  # (no cuDNN figure in the torch-1.10 stack)
])
def test_torch_version_cuda_is_the_stack_build(a100, stack, version, cudnn):
    seen = []
    result = capture_callable(
        lambda: seen.append((torch.version.cuda, torch.backends.cudnn.version())), gpu=a100,
        stack=load_stack(stack))
    assert result.error is None, result.error_text
    assert seen == [(version, cudnn)]


def test_small_state_queries(a100, stack24):
    """`torch.cuda._is_in_bad_fork()` (no fork after initialisation), the current allocator (a
    `_CUDAAllocator` over the native one), the backend (native, also with expandable segments:
    `backend:` is the only option that changes it) and stream capture outside a graph."""
    from peakmem.capture.fake_memory import allocator_target

    seen = {}

    def job():
        seen["bad_fork"] = torch.cuda._is_in_bad_fork()
        current = torch.cuda.memory._get_current_allocator()
        seen["allocator"] = (type(current).__name__, current.allocator() is not None)
        seen["backend"] = torch.cuda.get_allocator_backend()
        seen["capturing"] = torch.cuda.is_current_stream_capturing()
        seen["built"] = torch.backends.cuda.is_built()

    with allocator_target("expandable_segments:True", "2.4.1"):
        result = capture_callable(job, gpu=a100, stack=stack24)
    assert result.error is None, result.error_text
    assert seen == {"bad_fork": False, "allocator": ("_CUDAAllocator", True),
                    "backend": "native", "capturing": False, "built": True}


@pytest.mark.parametrize("where, eager", [("top", True), ("after the first tensor", False)])
def test_cuda_module_loading_set_by_the_job_is_read_when_cuda_starts(tmp_path, monkeypatch,
                                                                     where, eager):
    """The CUDA driver reads CUDA_MODULE_LOADING at cuInit (CUDA's lazy initialisation): set at
    the job's top, EAGER gives the eager context (no first-use model); set after the first CUDA
    tensor, the lazy one stands (capture/job_module_loading.py)."""
    from peakmem.estimate import estimate_command

    monkeypatch.setenv("CUDA_MODULE_LOADING", "")
    monkeypatch.delenv("CUDA_MODULE_LOADING")
    setting = 'os.environ["CUDA_MODULE_LOADING"] = "EAGER"'
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent("""\
        import os
        import torch
        {top}
        x = torch.ones(1024, device="cuda")
        {after}
        y = x * 2
    """).format(top=setting if where == "top" else "",
                after=setting if where != "top" else ""))
    result = estimate_command(["python", str(script)], gpu="h200", torch_version="2.13",
                              isolate=False, steps="all", mode="fake")
    stack, gpu = load_stack("2.13"), load_gpu("h200")
    eager_context = int(stack.context_for(gpu, {"CUDA_MODULE_LOADING": "EAGER"}).value)
    lazy_context = int(stack.context_for(gpu, {}).value)
    assert eager_context != lazy_context
    assert result.context_bytes == (eager_context if eager else lazy_context)
    assert any("CUDA_MODULE_LOADING" in note for note in result.notes) is eager


@pytest.mark.parametrize("gpu, capability, sms", [
    ("v100-32gb", (7, 0), 80),  # Volta whitepaper: 80 SMs
    ("a100-40gb", (8, 0), 108),
    ("h200", (9, 0), 132),
    ("l4", (8, 9), 58),
])
def test_device_properties_follow_the_gpu_profile(stack24, gpu, capability, sms):
    profile = load_gpu(gpu)
    seen = {}

    def job():
        props = torch.cuda.get_device_properties(0)
        seen["props"] = (props.name, (props.major, props.minor), props.multi_processor_count,
                         props.total_memory)
        seen["capability"] = torch.cuda.get_device_capability()

    result = capture_callable(job, gpu=profile, stack=stack24)
    assert result.error is None, result.error_text
    assert seen == {"props": (profile.device_name, capability, sms, profile.total_memory_bytes),
                    "capability": capability}
