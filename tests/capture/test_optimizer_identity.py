"""Optimizer steps are counted per optimizer object, never per `id()`: a freed optimizer's id is
often the next one's (pytorch/examples' ddp main.py runs three demos one after another, each
with its own model and SGD taking one step; the estimate said 1 or 2 steps by chance)."""

import gc

import torch

from peakmem.capture import capture_callable


def _demos(*steps: int):
    def job():
        for steps_each in steps:
            model = torch.nn.Linear(10, 5).cuda()
            optimizer = torch.optim.SGD(model.parameters(), lr=0.001)
            for _ in range(steps_each):
                optimizer.zero_grad()
                model(torch.randn(20, 10, device="cuda")).square().mean().backward()
                optimizer.step()
            del model, optimizer
            gc.collect()  # the next optimizer is likely to get the freed one's id

    return job


def test_sequential_optimizers_are_not_merged_by_a_reused_id(a100, stack24):
    for _ in range(3):  # by chance before: each run the same answer now
        result = capture_callable(_demos(1, 1, 1), gpu=a100, stack=stack24)
        assert result.error is None, result.error_text
        assert result.steps == 1  # three optimizers of one step each
        assert result.backward_passes == 3


def test_a_later_optimizer_is_stopped_at_the_limit_of_its_own_steps(a100, stack24):
    """The step limit waits for the live optimizers only: a freed one (an earlier run's) no
    longer steps and does not hold the stop back; the later one's steps are counted from 0."""
    result = capture_callable(_demos(2, 50), gpu=a100, stack=stack24, steps=4)
    assert result.error is None, result.error_text
    assert result.stopped and result.steps == 4
    # 2 steps of the first, then 4 of the second (not 2 more, counted on with the first's
    # reused id; nor all 50, waiting for the freed first to reach 4)
    assert result.backward_passes == 2 + 4
