"""capture.collective_buffers.made_during: the allocations a call makes are `communication`,
kept or freed, unless already classified; nothing outside a capture."""

from collections import Counter

import torch

from peakmem.capture import capture_callable
from peakmem.capture.collective_buffers import communicating, made_during
from tests.capture.capture_helpers import allocations


def test_made_during_tags_what_the_block_allocated(a100, stack24):
    kept = {}

    def job():
        before = torch.empty(1000, device="cuda")  # noqa: F841 - made before the block
        with made_during():
            kept["buffer"] = torch.empty(2000, device="cuda")
            freed = torch.empty(3000, device="cuda")
            del freed
        after = torch.empty(4000, device="cuda")  # noqa: F841 - made after it

    result = capture_callable(job, gpu=a100, stack=stack24, steps="all")
    assert result.error is None, result.error_text
    sizes = {size: tag.category for size, tag in allocations(result.trace)}
    assert sizes == {4000: "other", 8000: "communication", 12000: "communication",
                     16000: "other"}


def test_made_during_keeps_what_the_tracker_classified(a100, stack24):
    def job():
        model = torch.nn.Linear(8, 8).cuda()
        loss = model(torch.randn(4, 8, device="cuda")).sum()
        with made_during():
            # the gradients are made and classified `gradient` (the backward's end) in the block
            loss.backward()

    result = capture_callable(job, gpu=a100, stack=stack24, steps="all")
    assert result.error is None, result.error_text
    grads = Counter(size for size, _ in allocations(result.trace, "gradient"))
    assert grads == Counter({8 * 8 * 4: 1, 8 * 4: 1})
    # the backward's own temporaries (made in the block, freed there) moved
    assert allocations(result.trace, "communication")
    assert not allocations(result.trace, "temporary", phase="backward")


def test_made_during_outside_a_capture_does_nothing():
    with made_during():
        tensor = torch.ones(3)
    assert communicating(torch.add)(tensor, 1).tolist() == [2.0, 2.0, 2.0]
