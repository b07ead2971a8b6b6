"""Frozen weights on the device are parameters in the breakdown (capture/frozen_weights.py): a
DiT-style sin-cos `pos_embed` (requires_grad=False, filled in place from numpy) in an EMA copy
made with `copy.deepcopy` on the device, and a module frozen on the device that never runs."""

import copy

import numpy as np
import torch
from torch import nn

from peakmem.capture import capture_callable
from tests.capture.capture_helpers import allocations

POS_EMBED = 64 * 256 * 4


class DiTLike(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.pos_embed = nn.Parameter(torch.zeros(1, 64, 256), requires_grad=False)
        self.proj = nn.Linear(256, 256)
        grid = np.ones((64, 256))
        self.pos_embed.data.copy_(torch.from_numpy(grid).float().unsqueeze(0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x + self.pos_embed)


def run(job, a100, stack24):
    result = capture_callable(job, gpu=a100, stack=stack24, steps="all", mode="fake")
    assert result.error is None, result.error_text
    return result


def test_an_ema_copy_of_a_frozen_pos_embed_is_a_parameter(a100, stack24):
    def job():
        model = DiTLike().cuda()
        ema = copy.deepcopy(model)  # on the device: clones
        opt = torch.optim.AdamW(p for p in model.parameters() if p.requires_grad)
        for _ in range(2):
            model(torch.randn(2, 64, 256, device="cuda")).sum().backward()
            opt.step()
            opt.zero_grad()
            with torch.no_grad():
                for mine, theirs in zip(ema.parameters(), model.parameters(), strict=True):
                    mine.mul_(0.99).add_(theirs, alpha=0.01)

    result = run(job, a100, stack24)
    copies = [tag.category for size, tag in allocations(result.trace)
              if size == POS_EMBED and tag.op.startswith("clone")]
    assert copies == ["parameter"]  # the model's own pos_embed: moved, a parameter already
    proj = [tag.category for size, tag in allocations(result.trace)
            if size == 256 * 256 * 4 and tag.op.startswith("clone")]
    assert proj == ["ema"]  # a trained weight's copy synced with it stays `ema`


def test_a_module_frozen_on_the_device_that_never_runs_is_a_parameter(a100, stack24):
    def job():
        with torch.device("cuda"):
            teacher = nn.Linear(384, 384)
        teacher.requires_grad_(False)  # never called: no forward hook claims its weights
        student = nn.Linear(384, 384).cuda()
        student(torch.randn(4, 384, device="cuda")).sum().backward()

    result = run(job, a100, stack24)
    weights = [tag.category for size, tag in allocations(result.trace) if size == 384 * 384 * 4
               and tag.category != "gradient"]
    assert weights == ["parameter", "parameter"], weights
