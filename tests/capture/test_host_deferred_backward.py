"""Code that autograd runs in backward (hooks, custom Functions) sees host-deferred tensors as the
job's forward does: moved to the device there, one is a device tensor and a device allocation
(DeepSpeed ZeRO-3 with `offload_param` fetches each layer's host partition in backward hooks)."""

import torch
from torch import nn

from peakmem.capture import capture_callable
from tests.capture.capture_helpers import allocations

WEIGHT_BYTES = 128 * 128 * 2
"""nn.Linear(128, 128)'s weight in fp16: 16384 elements, enough to be kept fake when built."""


class _FetchInBackward(torch.autograd.Function):
    """ZeRO-3's pre-backward hook in small: backward moves a host partition to the device."""

    @staticmethod
    def forward(ctx, x, host, seen):
        ctx.host, ctx.seen = host, seen
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        moved = ctx.host.to(device="cuda:0", non_blocking=True).view(128, 128)
        ctx.seen.append((moved.device.type, torch.empty(0, device=moved.device).device.type))
        return grad * 2, None, None


def _job(seen: list) -> None:
    host = nn.Linear(128, 128).weight.detach().half().view(-1)  # built on the host: kept fake
    x = torch.randn(4, 128, device="cuda", requires_grad=True)
    _FetchInBackward.apply(x, host, seen).sum().backward()


def test_host_deferred_tensor_moved_in_backward_is_a_device_tensor(a100, stack24):
    seen: list = []
    result = capture_callable(lambda: _job(seen), gpu=a100, stack=stack24, steps=1)
    assert result.error is None, result.error_text
    assert any("kept fake" in note for note in result.notes)
    # without the deferral mode in backward, the move returned a host tensor and
    # `torch.empty(0, device=param.device)` a real host tensor (ZeRO-3's free_param then failed)
    assert seen == [("cuda", "cuda")]
    moved = [size for size, _tag in allocations(result.trace, phase="backward", op="_to_copy")]
    assert moved == [WEIGHT_BYTES]
