"""A job that sizes itself from the GPU's memory (`get_device_properties(0).total_memory`,
`mem_get_info()`) is answered for the target GPU, and the estimate says so."""

import pytest
import torch

from peakmem.capture import capture_callable
from peakmem.capture.memory_size_reads import NOTE_PREFIX
from peakmem.profiles import load_gpu


def sized_job(read):
    sizes = []

    def job():
        batch = 64 * int(read() // 2**30)
        sizes.append(batch)
        torch.zeros(batch, 256, device="cuda")

    return job, sizes


READS = {
    "properties": lambda: torch.cuda.get_device_properties(0).total_memory,
    "mem_get_info": lambda: torch.cuda.mem_get_info()[1],
    "cudart": lambda: torch.cuda.cudart().cudaMemGetInfo(0)[1],
}


@pytest.mark.parametrize("how", sorted(READS))
def test_memory_size_read_follows_the_gpu_and_is_noted(how, stack24):
    batches = {}
    for name in ("a100-40gb", "h100-80gb"):
        gpu = load_gpu(name)
        job, sizes = sized_job(READS[how])
        result = capture_callable(job, gpu=gpu, stack=stack24)
        assert result.error is None, result.error_text
        batches[name] = sizes[0]
        noted = [note for note in result.notes if note.startswith(NOTE_PREFIX)]
        assert len(noted) == 1, result.notes
        assert gpu.name in noted[0] and "--gpu" in noted[0]
    assert batches["a100-40gb"] == 64 * int(load_gpu("a100-40gb").total_memory_bytes // 2**30)
    assert batches["h100-80gb"] > batches["a100-40gb"]


def test_other_device_properties_are_not_a_memory_read(a100, stack24):
    def job():
        props = torch.cuda.get_device_properties(0)
        assert (props.major, props.minor) == (8, 0)
        assert "total_memory=" in repr(props)  # printing the properties is not sizing from them
        torch.zeros(4, device="cuda")

    result = capture_callable(job, gpu=a100, stack=stack24)
    assert result.error is None, result.error_text
    assert not any(note.startswith(NOTE_PREFIX) for note in result.notes), result.notes
