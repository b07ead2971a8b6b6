"""Saved tensors offloaded to the host (`torch.autograd.graph.save_on_cpu`, also under
transformers' `activation_checkpointing_kwargs={"offload": True}`): the copies back to the
device in backward are the backward's own allocations, not the job's input data."""

from __future__ import annotations

import torch
from torch import nn

from peakmem.capture import capture_callable
from tests.capture.capture_helpers import allocations

WIDTH, BATCH = 256, 64


def _offloading_job() -> None:
    model = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh(), nn.Linear(WIDTH, WIDTH)).cuda()
    for _ in range(2):
        x = torch.randn(BATCH, WIDTH, device="cuda")
        with torch.autograd.graph.save_on_cpu(pin_memory=True):
            loss = model(x).sum()
        loss.backward()


def test_tensors_restored_from_the_host_in_backward_are_not_inputs(a100, stack24):
    capture = capture_callable(_offloading_job, gpu=a100, stack=stack24)
    assert capture.error is None, capture.error
    restored = allocations(capture.trace, op="_to_copy", phase="backward")
    # each step brings back each saved tensor, one copy per save: x (for the first weight's
    # gradient), tanh's output twice (saved by tanh and by the second addmm) (BATCH x WIDTH
    # fp32), and the second weight (WIDTH x WIDTH; x needs no gradient, so the first is not saved)
    activation, weight = BATCH * WIDTH * 4, WIDTH * WIDTH * 4
    assert sorted(size for size, _ in restored) == sorted(2 * (3 * [activation] + [weight]))
    assert {tag.category for _, tag in restored} == {"temporary"}, restored
    assert not allocations(capture.trace, category="input")
