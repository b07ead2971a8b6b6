"""torch._dynamo.config tweaks (torchtune / HF Trainer set these) and a torch.compiler.disable
region inside a compiled module; Module.compile() in place."""

import torch
import torch._dynamo
import torch.nn.functional as F
from _tiny import STEPS, batch, model

torch._dynamo.config.cache_size_limit = 64
torch._dynamo.config.suppress_errors = True
torch._dynamo.config.capture_scalar_outputs = True


class Head(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = model()

    @torch.compiler.disable
    def debug_stats(self, h: torch.Tensor) -> torch.Tensor:
        return h.detach().abs().mean()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.body(x)
        self.last = self.debug_stats(h)
        return h


net = Head()
net.compile()
optimizer = torch.optim.AdamW(net.parameters(), lr=1e-3)
for _ in range(STEPS):
    x, y = batch()
    F.cross_entropy(net(x), y).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
torch._dynamo.reset()
