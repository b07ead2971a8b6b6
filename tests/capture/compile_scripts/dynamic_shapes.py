"""torch.compile(model, dynamic=True) with a batch that changes size (a short last batch)."""

import torch
import torch.nn.functional as F
from _tiny import BATCH, STEPS, batch, model

net = torch.compile(model(), dynamic=True)
optimizer = torch.optim.AdamW(net.parameters(), lr=1e-3)
for step in range(STEPS):
    x, y = batch(BATCH if step < STEPS - 1 else BATCH // 2)
    F.cross_entropy(net(x), y).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
