"""A compiled loss function and a compiled optimizer step (the PyTorch recipe "Compiling the
optimizer": `@torch.compile(fullgraph=False) def fn(): opt.step()`), the model eager."""

import torch
import torch.nn.functional as F
from _tiny import STEPS, batch, model

net = model()
optimizer = torch.optim.AdamW(net.parameters(), lr=torch.tensor(1e-3))


@torch.compile
def loss_fn(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float(), target)


@torch.compile(fullgraph=False)
def opt_step() -> None:
    optimizer.step()


for _ in range(STEPS):
    x, y = batch()
    loss_fn(net(x), y).backward()
    opt_step()
    optimizer.zero_grad(set_to_none=True)
