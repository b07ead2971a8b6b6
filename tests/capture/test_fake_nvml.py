"""NVML (pynvml, nvidia-ml-py) answers for the target GPU during a capture (capture.fake_nvml);
without it `nvmlInit()` raises NVMLError_LibraryNotFound on a machine without a driver."""

import pytest
import torch

from peakmem.capture import capture_callable
from peakmem.capture.memory_size_reads import NOTE_PREFIX

pynvml = pytest.importorskip("pynvml")


def test_nvml_reports_the_target_gpu_and_the_simulated_use(a100, stack24):
    seen = {}

    def job():
        pynvml.nvmlInit()
        seen["count"] = pynvml.nvmlDeviceGetCount()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        seen["name"] = pynvml.nvmlDeviceGetName(handle)
        before = pynvml.nvmlDeviceGetMemoryInfo(handle)
        x = torch.empty(256, 2**20, dtype=torch.uint8, device="cuda")  # 256 MiB
        after = pynvml.nvmlDeviceGetMemoryInfo(handle)
        seen["total"] = after.total
        seen["grew"] = after.used - before.used
        seen["free"] = after.free + after.used == after.total
        seen["reserved"] = torch.cuda.memory_reserved()
        seen["util"] = pynvml.nvmlDeviceGetUtilizationRates(handle).gpu
        seen["processes"] = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
        with pytest.raises(pynvml.NVMLError):
            pynvml.nvmlDeviceGetHandleByIndex(1)
        pynvml.nvmlShutdown()
        del x

    result = capture_callable(job, gpu=a100, stack=stack24)
    assert result.error is None, result.error_text
    assert seen == {"count": 1, "name": "NVIDIA A100-SXM4-40GB", "total": a100.total_memory_bytes,
                    "grew": seen["reserved"], "free": True, "reserved": seen["reserved"],
                    "util": 0, "processes": []}
    assert seen["reserved"] >= 256 * 2**20
    assert any(note.startswith(NOTE_PREFIX) and "pynvml" in note for note in result.notes)


def test_nvml_is_the_real_module_again_after_the_capture(a100, stack24):
    original = pynvml.nvmlInit
    result = capture_callable(lambda: pynvml.nvmlInit(), gpu=a100, stack=stack24)
    assert result.error is None, result.error_text
    assert pynvml.nvmlInit is original
