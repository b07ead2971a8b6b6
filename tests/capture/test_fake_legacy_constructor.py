"""`torch.Tensor(...)` after `torch.set_default_tensor_type(torch.cuda.FloatTensor)`.

torch's legacy constructor makes tensors of the default tensor *type*: once a job sets a CUDA
one, `torch.Tensor([1e10])`, `torch.Tensor(ndarray)` and `torch.Tensor(3, 4)` are CUDA tensors
(nerf-pytorch's run_nerf.py concatenates `torch.Tensor([1e10]).expand(...)` with device
tensors). A default *device* does not reach that constructor, so before round 23b the capture
made host tensors there and `torch.cat` raised "Tensor on device cpu is not on the expected
device meta!" (capture/fake_legacy.py)."""

import numpy as np
import torch

from peakmem.capture import capture_callable
from tests.capture.capture_helpers import allocations


def _run(job, a100, stack24):
    result = capture_callable(job, gpu=a100, stack=stack24)
    assert result.error is None, result.error_text
    return result


def test_legacy_constructor_follows_a_cuda_default_tensor_type(a100, stack24):
    seen = {}

    def job():
        seen["before"] = torch.Tensor([1.0, 2.0]).device.type  # no CUDA type set yet: host
        torch.set_default_tensor_type("torch.cuda.FloatTensor")
        dists = torch.rand(16, 7)  # a factory function: on the device already
        big = torch.Tensor([1e10]).expand(dists[..., :1].shape)
        seen["cat"] = torch.cat([dists, big], -1)
        seen["array"] = torch.Tensor(np.zeros((5, 3), dtype=np.float64))
        seen["sized"] = torch.Tensor(6, 4)
        seen["empty"] = torch.Tensor()
        seen["param"] = torch.nn.Parameter(torch.Tensor(10))  # a subclass built from one
        seen["explicit"] = torch.Tensor([1.0], device="cpu")
        torch.set_default_tensor_type(torch.FloatTensor)  # back to a CPU type
        seen["after"] = (torch.Tensor([1.0]).device.type, torch.zeros(2).device.type)

    result = _run(job, a100, stack24)
    assert seen["before"] == "cpu"
    described = {k: (tuple(v.shape), v.dtype, v.device.type)
                 for k, v in seen.items() if isinstance(v, torch.Tensor)}
    assert described == {
        "cat": ((16, 8), torch.float32, "meta"),
        "array": ((5, 3), torch.float32, "meta"),  # converted to the default dtype, as CUDA does
        "sized": ((6, 4), torch.float32, "meta"),
        "empty": ((0,), torch.float32, "meta"),
        "param": ((10,), torch.float32, "meta"),
        "explicit": ((1,), torch.float32, "cpu"),  # a device named in the call is kept
    }
    assert seen["after"] == ("cpu", "cpu")
    sizes = [size for size, _ in allocations(result.trace)]
    # the (1,) fp32 constant, the (5, 3) array and the (6, 4) block, each on the device
    assert 4 in sizes and 5 * 3 * 4 in sizes and 6 * 4 * 4 in sizes and 16 * 8 * 4 in sizes
    # the constructor is torch's own again after the capture
    assert "__new__" not in vars(torch.Tensor)
    assert torch.Tensor([1.0]).device.type == "cpu" and torch.zeros(1).device.type == "cpu"


def test_a_job_that_keeps_the_cuda_type_gets_the_constructor_back_after_the_capture(a100, stack24):
    seen = {}

    def job():
        torch.set_default_tensor_type(torch.cuda.HalfTensor)
        seen["half"] = torch.Tensor([1.0, 2.0, 3.0])

    result = _run(job, a100, stack24)
    assert (seen["half"].dtype, seen["half"].device.type) == (torch.float16, "meta")
    assert 3 * 2 in [size for size, _ in allocations(result.trace)]
    assert "__new__" not in vars(torch.Tensor)
    assert torch.Tensor([1.0]).dtype == torch.float32 and torch.Tensor([1.0]).device.type == "cpu"
