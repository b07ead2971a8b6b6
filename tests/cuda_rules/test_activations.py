import pytest
import torch

from peakmem.capture import capture_callable
from tests.capture.capture_helpers import allocations


@pytest.mark.parametrize("activation, op", [(torch.nn.Mish, "mish_backward"), (torch.nn.SiLU, "silu_backward")])
def test_fused_activation_backward_allocates_only_the_gradient(a100, stack24, activation, op):
    def job():
        x = torch.randn(256, 512, device="cuda", requires_grad=True)
        activation().cuda()(x).sum().backward()

    result = capture_callable(job, gpu=a100, stack=stack24)
    backward = [(size, tag.op) for size, tag in allocations(result.trace, phase="backward")]
    activation_ops = [entry for entry in backward if entry[1].startswith(op)]
    assert activation_ops == [(256 * 512 * 4, f"{op}.default")]
    # no decomposed temporaries (softplus/tanh/sigmoid/mul) in backward
    assert not any(name.startswith(("softplus", "tanh", "sigmoid", "mul")) for _, name in backward)
