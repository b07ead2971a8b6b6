"""A boolean mask read on the host selects there: fake mode reads it all True.

TRL's GRPOTrainer cuts each generated completion after its first EOS on the host:
`[c[m].tolist() for c, m in zip(ids.cpu(), mask.bool().cpu())]`. Read as zeros, every mask
selected nothing, the completions were empty and `ids[-1]` failed: auto mode fell back to an
eager run. A mask (one dimension or more) now reads all True, the bound fake mode already uses
for selections on the device (every element selected); a 0-d boolean (a condition) still reads
False (capture/device_map.py `placeholder`)."""

from __future__ import annotations

from pathlib import Path

from peakmem.estimate import estimate_command

CUT_ON_THE_HOST = """\
import torch
model = torch.nn.Embedding(32, 16).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    ids = torch.randint(0, 32, (2, 6), device="cuda")
    is_eos = ids == 3
    eos_idx = torch.full((2,), 6, dtype=torch.long, device="cuda")
    eos_idx[is_eos.any(dim=1)] = is_eos.int().argmax(dim=1)[is_eos.any(dim=1)]
    mask = torch.arange(6, device="cuda").expand(2, -1) <= eos_idx.unsqueeze(1)
    kept = [c[m].tolist() for c, m in zip(ids.cpu(), mask.cpu())]
    truncated = torch.tensor([k[-1] != 3 for k in kept], device="cuda")  # fails on an empty one
    lengths = [len(k) for k in kept]
    assert lengths == [6, 6], lengths  # every token kept: the most a GPU run keeps
    loss = model(ids).square().mean()
    if torch.isnan(loss):  # a 0-d condition still reads False
        raise SystemExit("nan loss")
    loss.backward()
    opt.step()
    opt.zero_grad()
"""


def test_a_mask_read_on_the_host_keeps_every_element(tmp_path: Path, monkeypatch):
    (tmp_path / "cut.py").write_text(CUT_ON_THE_HOST)
    monkeypatch.chdir(tmp_path)
    result = estimate_command(["python", "cut.py"], gpu="a100-40gb", mode="fake", timeout=120)
    assert result.capture.steps == 3
    assert result.capture.host_reads >= 6
