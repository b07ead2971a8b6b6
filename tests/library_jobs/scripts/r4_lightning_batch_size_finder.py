"""Lightning's batch size finder as its docs show it (`Tuner(trainer).scale_batch_size(model,
mode="power")`, then `trainer.fit`): the LightningModule keeps `batch_size` as a hyperparameter
its `train_dataloader` reads; the finder doubles it from 2, three steps a trial, until CUDA runs
out of memory, then halves it. A small convolutional net whose activations grow with the batch
(64 x 64 single-channel images drawn as they are read)."""

import argparse

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.tuner import Tuner
from torch import nn
from torch.utils.data import DataLoader, Dataset


class RandomImages(Dataset):
    def __init__(self, length, size=64, classes=10):
        self.length, self.size, self.classes = length, size, classes

    def __len__(self):
        return self.length

    def __getitem__(self, index):
        return torch.randn(1, self.size, self.size), index % self.classes


class LitConvNet(L.LightningModule):
    def __init__(self, batch_size: int = 2, channels: int = 256, lr: float = 1e-3):
        super().__init__()
        self.save_hyperparameters()
        self.batch_size = batch_size
        self.features = nn.Sequential(
            nn.Conv2d(1, channels, 3, padding=1), nn.ReLU(),
            nn.Conv2d(channels, channels, 3, padding=1), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        )
        self.head = nn.Linear(channels, 10)

    def forward(self, x):
        return self.head(self.features(x))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)

    def train_dataloader(self):
        return DataLoader(RandomImages(1 << 20), batch_size=self.batch_size)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", default="power", choices=["power", "binsearch"])
    parser.add_argument("--max-steps", type=int, default=3)
    args = parser.parse_args()

    model = LitConvNet()
    trainer = L.Trainer(accelerator="gpu", devices=1, max_steps=args.max_steps, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False)
    tuner = Tuner(trainer)
    found = tuner.scale_batch_size(model, mode=args.mode)
    print(f"batch size finder: {found}")
    trainer.fit(model)
    print(f"trained with batch size {model.batch_size}")


if __name__ == "__main__":
    main()
