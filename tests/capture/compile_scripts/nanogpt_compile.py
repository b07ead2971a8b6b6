"""nanoGPT train.py with compile=True: `model = torch.compile(model)` (default mode)."""

import torch
import torch.nn.functional as F
from _tiny import STEPS, batch, model

net = torch.compile(model())
optimizer = torch.optim.AdamW(net.parameters(), lr=1e-3)
for _ in range(STEPS):
    x, y = batch()
    F.cross_entropy(net(x), y).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
