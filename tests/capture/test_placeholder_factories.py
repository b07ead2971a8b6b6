"""A device tensor read on the host in fake mode is a placeholder host tensor of zeros, made with
torch's own factory: the job may have replaced `torch.zeros` (deepspeed.zero.Init() wraps the
factories to make device tensors of its fp16 dtype while a model is built; ZeRO-3 then copies
each parameter's partition into a host buffer, `param.ds_tensor.copy_(src)`)."""

import torch

from peakmem.capture import capture_callable


def _zero_init_like_factories(dtype: torch.dtype):
    """deepspeed's zero_wrapper_for_fp_tensor_constructor, in small."""
    original = torch.zeros

    def zeros(*args, **kwargs):
        if kwargs.get("device") is None:
            kwargs["device"] = torch.device("cuda", 0)
        tensor = original(*args, **kwargs)
        if tensor.is_floating_point():
            tensor.data = tensor.data.to(dtype)
        return tensor

    return original, zeros


def _job(seen: list) -> None:
    weight = torch.randn(64, 64, device="cuda")
    original, wrapped = _zero_init_like_factories(torch.float16)
    torch.zeros = wrapped
    try:
        host = torch.empty(64 * 64, pin_memory=False)
        host.copy_(weight.view(-1))  # a device-to-host copy: the host gets placeholder values
        seen.append((host.device.type, host.dtype, float(host.sum())))
    finally:
        torch.zeros = original


def test_host_placeholder_ignores_the_jobs_factory_wrappers(a100, stack24):
    seen: list = []
    result = capture_callable(lambda: _job(seen), gpu=a100, stack=stack24, steps=1, mode="fake")
    assert result.error is None, result.error_text
    assert seen == [("cpu", torch.float32, 0.0)]
