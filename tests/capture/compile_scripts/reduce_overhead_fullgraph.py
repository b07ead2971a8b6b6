"""gpt-fast style: torch.compile(model, mode="reduce-overhead", fullgraph=True) (CUDA graphs),
with `torch.compiler.cudagraph_mark_step_begin()` at each step (gpt-fast, torchtitan)."""

import torch
import torch.nn.functional as F
from _tiny import STEPS, batch, model

net = torch.compile(model(), mode="reduce-overhead", fullgraph=True)
optimizer = torch.optim.AdamW(net.parameters(), lr=1e-3)
for _ in range(STEPS):
    torch.compiler.cudagraph_mark_step_begin()
    x, y = batch()
    F.cross_entropy(net(x), y).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
