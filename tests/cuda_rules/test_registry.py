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
    assert kinds == {"op", "function", "composite", "fused", "host_outputs", "patch"}
