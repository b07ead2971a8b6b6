"""A frozen module moved to the device holds parameters, even the parts of it no forward runs.

diffusers' text-to-image training moves its frozen VAE with `vae.to(device, dtype)` and calls
only `vae.encode(...)`: the decoder's weights are on the device for the whole job, but no module
forward hook registers the VAE itself (the first forward is its encoder's) and no optimizer steps
them, so they stayed tagged as the host copy that made them ("input", which is the batch)."""

from __future__ import annotations

from pathlib import Path

import pytest

from peakmem.estimate import estimate_command

FROZEN_SUBMODULE_USED = """\
import sys, torch

class AutoEncoder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = torch.nn.Linear(256, 256)
        self.decoder = torch.nn.Linear(256, 1024)

    def encode(self, x):
        return self.encoder(x)

vae = AutoEncoder()
vae.requires_grad_(False)
dtype = torch.float16 if "--half" in sys.argv else torch.float32
vae.to("cuda", dtype=dtype)
head = torch.nn.Linear(256, 256).cuda()
opt = torch.optim.SGD(head.parameters(), lr=0.1)
x = torch.randn(8, 256, device="cuda", dtype=dtype)
for _ in range(3):
    with torch.no_grad():
        z = vae.encode(x).float()
    loss = head(z).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
"""


@pytest.mark.parametrize("flags, itemsize", [([], 4), (["--half"], 2)], ids=["fp32", "fp16"])
def test_frozen_module_weights_are_parameters_when_only_a_submodule_runs(
        tmp_path: Path, monkeypatch, flags, itemsize):
    (tmp_path / "frozen.py").write_text(FROZEN_SUBMODULE_USED)
    monkeypatch.chdir(tmp_path)
    result = estimate_command(["python", "frozen.py", *flags], gpu="a100-40gb", mode="fake",
                              timeout=120)
    by_category = result.breakdown.by_category

    def block(nbytes: int) -> int:
        return max(512, -(-nbytes // 512) * 512)

    encoder = block(256 * 256 * itemsize) + block(256 * itemsize)
    decoder = block(1024 * 256 * itemsize) + block(1024 * itemsize)
    head = block(256 * 256 * 4) + block(256 * 4)
    assert by_category.get("parameter") == encoder + decoder + head, by_category
    # what is left as input is the batch (8 x 256), not the decoder's weights
    assert by_category.get("input", 0) < decoder, by_category
