"""Shared by the corpus: a tiny training loop on "cuda" (imported by scripts that train)."""
import torch


def train(steps: int = 2) -> None:
    model = torch.nn.Linear(32, 32).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        model(torch.randn(8, 32, device="cuda")).sum().backward()
        opt.step()
        opt.zero_grad()
