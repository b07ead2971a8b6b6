"""A Lightning project as it is commonly written: a LightningDataModule, a LightningModule with
train / validation / test / predict steps and a OneCycleLR scheduler, `Trainer(strategy="ddp",
devices=2, precision="bf16-mixed", accumulate_grad_batches=2)` with ModelCheckpoint,
EarlyStopping and LearningRateMonitor callbacks, then `trainer.validate`, `trainer.test` and
`trainer.predict` from the best checkpoint. Lightning starts the second process itself."""

import argparse

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import EarlyStopping, LearningRateMonitor, ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class RandomDataModule(L.LightningDataModule):
    def __init__(self, batch_size: int = 16, features: int = 64, samples: int = 256):
        super().__init__()
        self.batch_size, self.features, self.samples = batch_size, features, samples

    def setup(self, stage=None):
        generator = torch.Generator().manual_seed(0)
        x = torch.randn(self.samples, self.features, generator=generator)
        y = torch.randint(0, 4, (self.samples,), generator=generator)
        self.train_set = TensorDataset(x[:192], y[:192])
        self.val_set = TensorDataset(x[192:], y[192:])

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self):
        return DataLoader(self.val_set, batch_size=self.batch_size)

    def test_dataloader(self):
        return DataLoader(self.val_set, batch_size=self.batch_size)

    def predict_dataloader(self):
        return DataLoader(self.val_set, batch_size=self.batch_size)


class LitMLP(L.LightningModule):
    def __init__(self, features: int = 64, hidden: int = 256, classes: int = 4, lr: float = 1e-3):
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(features, hidden), nn.GELU(), nn.Dropout(0.1),
                                 nn.Linear(hidden, hidden), nn.GELU(), nn.Linear(hidden, classes))

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss, prog_bar=True, sync_dist=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        self.log("val_loss", F.cross_entropy(logits, y), sync_dist=True)
        self.log("val_acc", (logits.argmax(-1) == y).float().mean(), sync_dist=True)

    def test_step(self, batch, batch_idx):
        x, y = batch
        self.log("test_loss", F.cross_entropy(self(x), y), sync_dist=True)

    def predict_step(self, batch, batch_idx, dataloader_idx=0):
        return self(batch[0]).softmax(-1)

    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr, weight_decay=0.01)
        scheduler = torch.optim.lr_scheduler.OneCycleLR(
            optimizer, max_lr=self.hparams.lr, total_steps=self.trainer.estimated_stepping_batches)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--strategy", default="ddp")
    parser.add_argument("--precision", default="bf16-mixed")
    parser.add_argument("--max-epochs", type=int, default=2)
    parser.add_argument("--accumulate", type=int, default=2)
    parser.add_argument("--out", default="runs")
    parser.add_argument("--clip", type=float, default=1.0, help="0: no clipping (fsdp: norm clipping is not supported)")
    args = parser.parse_args()

    L.seed_everything(42)
    datamodule = RandomDataModule()
    model = LitMLP()
    checkpoint = ModelCheckpoint(monitor="val_loss", mode="min", save_top_k=1, save_last=True)
    trainer = L.Trainer(
        accelerator="gpu",
        devices=args.devices,
        strategy=args.strategy,
        precision=args.precision,
        max_epochs=args.max_epochs,
        accumulate_grad_batches=args.accumulate,
        gradient_clip_val=args.clip or None,
        callbacks=[checkpoint, EarlyStopping(monitor="val_loss", patience=3),
                   LearningRateMonitor(logging_interval="step")],
        logger=CSVLogger(args.out),
        log_every_n_steps=1,
        enable_progress_bar=False,
    )
    trainer.fit(model, datamodule=datamodule)
    trainer.validate(model, datamodule=datamodule, ckpt_path="best")
    trainer.test(model, datamodule=datamodule, ckpt_path="best")
    predictions = trainer.predict(model, datamodule=datamodule, ckpt_path="best")
    if trainer.is_global_zero:
        print(f"best checkpoint: {checkpoint.best_model_path}")
        print(f"predicted {sum(len(p) for p in predictions)} rows")


if __name__ == "__main__":
    main()
