"""Checkpoint names made from device values read as zeros are reported (capture/value_names.py).

`torch.save(state, f"ckpt_{loss.item():.3f}.pt")` in fake mode writes every checkpoint to
`ckpt_0.000.pt`: the estimate says so instead of passing it silently."""

from __future__ import annotations

from pathlib import Path

import pytest

from peakmem.capture.value_names import ZeroNamedSaves, has_decimal_zero
from peakmem.estimate import estimate_command

NAMED_BY_LOSS = """\
import os, sys, torch
model = torch.nn.Linear(64, 64).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(3):
    loss = model(torch.randn(8, 64, device="cuda")).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    if sys.argv[1] == "loss":
        name = f"ckpt_{loss.item():.3f}.pt"
    else:
        name = f"ckpt_{epoch}.pt"
    print("exists" if os.path.exists(name) else "new", name)
    torch.save(model.state_dict(), name)
"""


@pytest.mark.parametrize("named_by", ["loss", "epoch"])
def test_checkpoints_named_by_a_device_value_are_noted(tmp_path: Path, monkeypatch, named_by):
    (tmp_path / "job.py").write_text(NAMED_BY_LOSS)
    monkeypatch.chdir(tmp_path)
    result = estimate_command(["python", "job.py", named_by], gpu="a100-40gb", mode="fake",
                              timeout=120)
    notes = "\n".join(result.notes)
    if named_by == "loss":
        assert "file name(s) holding a zero (ckpt_0.000.pt)" in notes, notes
        # the capture stops after its 3rd step, before the 3rd save
        assert "2 saves went to 1 name(s), 1 of them over an earlier one" in notes, notes
    else:
        assert "holding a zero" not in notes, notes
    # the diverted saves leave the user's folder as it was: the job saw no file of its own
    assert not list(tmp_path.glob("ckpt_*.pt"))


@pytest.mark.parametrize("name, zero", [
    ("ckpt_0.000.pt", True), ("out/epoch0.0", True), ("w_0.00e+00.bin", True), ("x_-0.0", True),
    ("ckpt_0.pt", False), ("epoch0", False), ("loss_0.001.pt", False), ("v1.0.0.pt", False),
    ("ckpt_10.000.pt", False), ("0.0/model.pt", False),
])
def test_decimal_zero_in_a_file_name(name: str, zero: bool):
    assert has_decimal_zero(name) is zero


def test_no_note_without_host_reads():
    saves = ZeroNamedSaves()
    saves.saw("ckpt_0.000.pt", host_reads=0)
    assert saves.note() is None
    saves.saw("ckpt_0.000.pt", host_reads=2)
    assert "ckpt_0.000.pt" in (saves.note() or "")
