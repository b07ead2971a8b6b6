"""Lightning validates at the end of each epoch the capture ended early (capture/
lightning_val_check.py). Once the training loop is ended, each later epoch yields its last
batch only; Lightning, knowing the loader's length, counted that batch as batch 0 and did not
validate, the epochs looked like bare repeats and the job was stopped after MAX_BARE_EPOCHS of
them: what a job does at a later epoch (Lightning's `computer_vision_fine_tuning.py` unfreezes
its backbone at epoch 10) was never traced."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from peakmem.estimate import estimate_command

pytestmark = pytest.mark.skipif(importlib.util.find_spec("lightning") is None,
                                reason="not installed: lightning")

JOB = """\
import torch
import lightning.pytorch as pl
from torch.utils.data import DataLoader, TensorDataset

class Model(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.small = torch.nn.Linear(32, 1)
        self.big = torch.nn.Linear(32, 32)
        self.big.requires_grad_(False)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.small(self.big(x)), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val", torch.nn.functional.mse_loss(self.small(self.big(x)), y))

    def on_validation_epoch_end(self):
        print("validated at epoch", self.current_epoch)

    def on_train_epoch_start(self):
        if self.current_epoch == 8:   # a finetuning milestone: the larger layer joins
            self.big.requires_grad_(True)
            self.trainer.optimizers[0].add_param_group({"params": self.big.parameters()})

    def configure_optimizers(self):
        return torch.optim.Adam(self.small.parameters())

def loader():
    return DataLoader(TensorDataset(torch.randn(64, 32), torch.randn(64, 1)), batch_size=8)

trainer = pl.Trainer(accelerator="gpu", devices=1, max_epochs=10, logger=False,
                     enable_checkpointing=False, enable_progress_bar=False,
                     enable_model_summary=False, num_sanity_val_steps=0)
trainer.fit(Model(), loader(), loader())
"""


def test_later_epochs_validate_and_reach_the_milestone(tmp_path: Path, monkeypatch, capsys):
    (tmp_path / "job.py").write_text(JOB)
    monkeypatch.chdir(tmp_path)
    result = estimate_command(["python", "job.py"], gpu="a100-40gb", mode="fake", timeout=120,
                              isolate=False).to_json()
    out = capsys.readouterr()
    text = out.out + out.err
    # 8 batches an epoch: the first epochs traced in part, each later one its last batch only,
    # and every epoch validated, as the uncut run does
    assert [f"validated at epoch {epoch}" in text for epoch in range(10)] == [True] * 10
    assert "training loop ended early" in "\n".join(result["notes"])
    # epoch 8 added `big` (32 x 32 + 32) to Adam: its two moments are traced
    small, big = 512 + 512, 32 * 32 * 4 + 512
    assert result["breakdown"]["optimizer_state"] == 2 * (small + big)
