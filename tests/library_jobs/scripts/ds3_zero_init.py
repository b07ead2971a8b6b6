"""DeepSpeed's ZeRO-3 docs (docs/code-docs/source/zero3.rst, "Constructing Massive Models" and
"Offloading to CPU"), re-created: the model is built inside `deepspeed.zero.Init(config_dict_or_path=
ds_config)`, so each parameter is partitioned as it is made (never whole on one rank), then
`deepspeed.initialize(model=..., model_parameters=model.parameters(), config=ds_config)`;
`model_engine(batch)`, `model_engine.backward(loss)`, `model_engine.step()`.

Run as `deepspeed ds3_zero_init.py --deepspeed_config ds_config.json [--steps N]`. Changes for an
offline test: a small MLP (the docs' `MyLargeModel`) on random batches.
"""

import argparse
import json

import deepspeed
import torch
from torch import nn


class MyLargeModel(nn.Module):
    def __init__(self, width: int, depth: int, classes: int):
        super().__init__()
        self.embed = nn.Linear(64, width)
        self.blocks = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))
        self.head = nn.Linear(width, classes)

    def forward(self, x):
        x = torch.relu(self.embed(x))
        for block in self.blocks:
            x = torch.relu(block(x))
        return self.head(x)


parser = argparse.ArgumentParser()
parser.add_argument("--local_rank", type=int, default=-1)
parser.add_argument("--steps", type=int, default=4)
parser.add_argument("--width", type=int, default=256)
parser.add_argument("--depth", type=int, default=3)
parser = deepspeed.add_config_arguments(parser)
args = parser.parse_args()

deepspeed.init_distributed()
with open(args.deepspeed_config) as f:
    ds_config = json.load(f)

with deepspeed.zero.Init(config_dict_or_path=ds_config):
    model = MyLargeModel(args.width, args.depth, 10)

print("partitioned:", all(hasattr(p, "ds_id") for p in model.parameters()),
      "local elements:", sum(p.ds_tensor.numel() for p in model.parameters()))

model_engine, optimizer, _, _ = deepspeed.initialize(
    model=model, model_parameters=model.parameters(), config=ds_config)
print("optimizer:", type(model_engine.optimizer).__name__)

dtype = torch.bfloat16 if model_engine.bfloat16_enabled() else torch.half if model_engine.fp16_enabled() else torch.float
micro = model_engine.train_micro_batch_size_per_gpu()
for step in range(args.steps):
    x = torch.randn(micro, 64, device=model_engine.device, dtype=dtype)
    y = torch.randint(0, 10, (micro,), device=model_engine.device)
    loss = nn.functional.cross_entropy(model_engine(x).float(), y)
    model_engine.backward(loss)
    model_engine.step()
    if model_engine.global_rank == 0:
        print(f"step {step} loss {loss.item():.4f}")
print("done")
