"""Parameterless modules run on host data (torchvision's transforms are nn.Modules, applied by a
dataset while the DataLoader fetches a batch) start no forward phase (capture/phases.py): before,
the transform's forward marked the phase, the model's own forward was no longer the top-level
one, and an evaluation after training was not recognised (transformers'
run_image_classification_no_trainer.py)."""

import torch
from torch import nn

from peakmem.capture import capture_callable


class HostScale(nn.Module):
    """Like torchvision's Normalize: no parameters, called on a host tensor."""

    def forward(self, x):
        return (x - 0.5) / 0.25


class Images(torch.utils.data.Dataset):
    def __init__(self, n):
        self.transform = HostScale()
        self.images = torch.rand(n, 16)

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        return self.transform(self.images[i]), i % 2


def test_a_host_transform_module_does_not_hide_the_evaluation(a100, stack24):
    def job():
        model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2)).cuda()
        opt = torch.optim.AdamW(model.parameters())
        for x, y in torch.utils.data.DataLoader(Images(16), batch_size=4):
            loss = nn.functional.cross_entropy(model(x.cuda()), y.cuda())
            loss.backward()
            opt.step()
            opt.zero_grad()
        model.eval()
        for x, _y in torch.utils.data.DataLoader(Images(8), batch_size=4):
            with torch.no_grad():
                model(x.cuda()).argmax(-1)

    result = capture_callable(job, gpu=a100, stack=stack24, steps="all")
    assert result.error is None, result.error_text
    assert result.trace.meta["phases_ran"] == ["training", "eval"]
    assert result.steps == 4
