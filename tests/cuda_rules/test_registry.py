import pytest
import torch

from peakmem.cuda_rules import (
    OP_RULES,
    DuplicateRuleError,
    iter_rules,
    op_rule_for,
    register_op_rule,
)

aten = torch.ops.aten


def test_duplicate_registration_is_an_error():
    with pytest.raises(DuplicateRuleError):

        @register_op_rule(aten.addmm)
        def again(ctx, op, args, kwargs, out):
            pass


def test_a_packet_rule_covers_its_overloads():
    assert op_rule_for(aten.mm.default) is OP_RULES[aten.mm]
    assert op_rule_for(aten.relu.default) is None


def test_every_rule_family_is_registered():
    kinds = {kind for kind, _ in iter_rules()}
    assert kinds == {"op", "function", "composite", "fused", "host_outputs", "output_order", "patch"}


def test_kernels_are_removed_after_the_capture():
    from peakmem.capture import capture_callable
    from peakmem.profiles import load_gpu, load_stack

    def backward():
        x = torch.randn(8, 16, device="meta", requires_grad=True)
        torch.nn.functional.mish(x).sum().backward()
        return x.grad

    capture_callable(lambda: None, gpu=load_gpu("l4"), stack=load_stack("2.4"))
    ops = []

    class Spy(torch.utils._python_dispatch.TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            ops.append(func.__name__)
            return func(*args, **(kwargs or {}))

    with Spy():
        backward()
        torch.nn.functional.dropout(torch.randn(8, device="meta"), 0.5, training=True)
    assert "mish_backward.default" not in ops  # decomposes again outside a capture
    assert "native_dropout.default" not in ops  # the composite rule is gone too
