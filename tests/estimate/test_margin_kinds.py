"""Which calibrated margin an estimate states, by kind of job (estimate/margin_kinds.py)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from peakmem.capture import capture_callable
from peakmem.estimate.api import estimate_capture
from peakmem.estimate.margin_kinds import DEFAULT_KIND, margin_kind, op_packets
from peakmem.profiles.loader import Sourced


@pytest.mark.parametrize(
    ("libraries", "ops", "kind"),
    [
        ((), (), "default"),
        ((), ("addmm", "mm"), "default"),
        ((), ("_scaled_dot_product_efficient_attention",), "attention"),
        ((), ("_scaled_dot_product_flash_attention", "mm"), "attention"),
        ((), ("_flash_attention_forward",), "attention"),
        (("cudnn_convolution",), (), "cudnn_convolution"),
        # a job that convolves and attends (a ViT with a conv stem): the cuDNN fit, listed first
        (("cudnn_convolution",), ("_scaled_dot_product_efficient_attention",), "cudnn_convolution"),
        (("cudnn_batch_norm",), ("scaled_dot_product_attention",), DEFAULT_KIND),  # math path
    ],
)
def test_margin_kind(libraries, ops, kind):
    assert margin_kind(libraries, ops) == kind


def test_op_packets_strip_overloads():
    assert op_packets(["addmm.default", None, "add.Tensor", "backward", ""]) == {
        "addmm", "add", "backward"
    }


def encoder_job():
    layer = torch.nn.TransformerEncoderLayer(32, 4, 64, batch_first=True).cuda()
    optimizer = torch.optim.Adam(layer.parameters())
    for _ in range(2):
        optimizer.zero_grad()
        layer(torch.randn(2, 8, 32, device="cuda")).sum().backward()
        optimizer.step()


def mlp_job():
    torch.nn.Linear(8, 8).cuda()(torch.randn(4, 8, device="cuda")).sum().backward()


def test_an_encoder_states_the_attention_margin(a100, stack24):
    estimate = estimate_capture(capture_callable(encoder_job, gpu=a100, stack=stack24), a100,
                                stack24, torch_version="2.4.1")
    assert estimate.margin_kind == "attention" == estimate.to_json()["margin_kind"]
    assert estimate.safety_margin == stack24.safety_margin_for(a100, "attention").value
    assert estimate.safety_margin != stack24.safety_margin_for(a100, "default").value
    assert estimate.to_json()["peak_bytes_with_margin"] == int(
        estimate.peak_bytes * (1 + estimate.safety_margin)
    ) + estimate.margin_reserve_bytes
    plain = estimate_capture(capture_callable(mlp_job, gpu=a100, stack=stack24), a100, stack24,
                             torch_version="2.4.1")
    assert plain.margin_kind == "default"


def test_a_kind_without_a_figure_takes_the_stacks_default_margin(a100, stack24):
    default = stack24.safety_margin_for(a100, "default")
    only_default = dataclasses.replace(
        stack24, safety_margin={"default": {"default": Sourced(0.02, "test")}}
    )
    assert only_default.safety_margin_for(a100, "attention").value == 0.02
    assert stack24.safety_margin_for(a100, "no-such-kind") == default
    empty = dataclasses.replace(stack24, safety_margin={})
    margin = empty.safety_margin_for(a100, "attention")
    assert margin.value == 0.0 and margin.assumed


@pytest.mark.parametrize("version", ["2.4.1", "2.5.1", "2.6.0"])
def test_every_stack_states_an_attention_margin(version, a100):
    from peakmem.profiles import load_stack

    stack = load_stack(version)
    assert stack.safety_margin_for(a100, "attention").value > 0
