"""Lightning's sharded strategies as their docs show them (docs/source-pytorch/advanced/
model_parallel/fsdp.rst and deepspeed.rst): a LightningModule of transformer blocks, trained with
`Trainer(accelerator="cuda", devices=2, strategy=..., precision=...)` and a ModelCheckpoint that
saves the best and the last checkpoint (validation inside `fit`, each epoch).

--strategy: "fsdp" (FSDPStrategy with `auto_wrap_policy={Block}` and
`activation_checkpointing_policy={Block}`, as the docs' "Activation checkpointing" section),
"fsdp_plain" (the string "fsdp"), "deepspeed_stage_2", "deepspeed_stage_3", or
"deepspeed_stage_2_offload" (`DeepSpeedStrategy(stage=2, offload_optimizer=True)`, stepping
DeepSpeedCPUAdam as the docs' ZeRO-Offload section does).
Changes for an offline test: random tokens, a tiny model."""

import argparse

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Block(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        h = self.norm1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class LitTransformer(L.LightningModule):
    def __init__(self, vocab: int = 256, dim: int = 128, heads: int = 4, depth: int = 2, lr: float = 1e-3,
                 cpu_adam: bool = False):
        super().__init__()
        self.save_hyperparameters()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(depth))
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(x)

    def _loss(self, batch):
        tokens, targets = batch
        return F.cross_entropy(self(tokens).flatten(0, 1), targets.flatten())

    def training_step(self, batch, batch_idx):
        loss = self._loss(batch)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", self._loss(batch), sync_dist=True)

    def configure_optimizers(self):
        if self.hparams.cpu_adam:  # deepspeed.rst "DeepSpeed ZeRO Stage 2 Offload"
            from deepspeed.ops.adam import DeepSpeedCPUAdam

            return DeepSpeedCPUAdam(self.parameters(), lr=self.hparams.lr)
        return torch.optim.AdamW(self.trainer.model.parameters(), lr=self.hparams.lr)


class Tokens(L.LightningDataModule):
    def __init__(self, batch_size: int = 8, seq: int = 32, vocab: int = 256):
        super().__init__()
        self.batch_size, self.seq, self.vocab = batch_size, seq, vocab

    def setup(self, stage=None):
        generator = torch.Generator().manual_seed(0)
        data = torch.randint(0, self.vocab, (96, self.seq + 1), generator=generator)
        self.train_set = TensorDataset(data[:64, :-1], data[:64, 1:])
        self.val_set = TensorDataset(data[64:, :-1], data[64:, 1:])

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self):
        return DataLoader(self.val_set, batch_size=self.batch_size)


def make_strategy(name: str):
    if name == "fsdp":
        from lightning.pytorch.strategies import FSDPStrategy

        return FSDPStrategy(auto_wrap_policy={Block}, activation_checkpointing_policy={Block})
    if name == "fsdp_plain":
        return "fsdp"
    if name == "deepspeed_stage_2_offload":
        from lightning.pytorch.strategies import DeepSpeedStrategy

        return DeepSpeedStrategy(stage=2, offload_optimizer=True)
    return name


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--strategy", default="fsdp")
    parser.add_argument("--precision", default="bf16-mixed")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--max-epochs", type=int, default=1)
    args = parser.parse_args()

    L.seed_everything(0)
    model, data = LitTransformer(cpu_adam="offload" in args.strategy), Tokens()
    checkpoint = ModelCheckpoint(monitor="val_loss", save_top_k=1, save_last=True)
    trainer = L.Trainer(accelerator="cuda", devices=args.devices, strategy=make_strategy(args.strategy),
                        precision=args.precision, max_epochs=args.max_epochs, callbacks=[checkpoint],
                        enable_progress_bar=False, log_every_n_steps=1)
    trainer.fit(model, datamodule=data)
    if trainer.is_global_zero:
        print(f"strategy {type(trainer.strategy).__name__} world {trainer.world_size}")
        print(f"best checkpoint: {checkpoint.best_model_path}")


if __name__ == "__main__":
    main()
