"""r6_lightning_sharded.py's LightningModule and data, trained with `strategy="fsdp"` and then
validated from the best checkpoint in the same process, as Lightning's docs show
(`trainer.fit(model)` then `trainer.validate(model, ckpt_path="best")`,
docs/source-pytorch/common/evaluation_basic.rst). That second call fails in Lightning itself
(Lightning-AI/pytorch-lightning#20373)."""

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint
from r6_lightning_sharded import LitTransformer, Tokens, make_strategy

L.seed_everything(0)
model, data = LitTransformer(), Tokens()
checkpoint = ModelCheckpoint(monitor="val_loss", save_top_k=1)
trainer = L.Trainer(accelerator="cuda", devices=2, strategy=make_strategy("fsdp"), precision="bf16-mixed",
                    max_epochs=1, callbacks=[checkpoint], enable_progress_bar=False, log_every_n_steps=1)
trainer.fit(model, datamodule=data)
trainer.validate(model, datamodule=data, ckpt_path="best")
print("validated the best checkpoint")
