"""The model and data every script here trains: two 256x256 Linear layers, a batch of 64."""

import torch

WIDTH, BATCH, STEPS = 256, 64, 3


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(WIDTH, WIDTH), torch.nn.GELU(), torch.nn.Linear(WIDTH, WIDTH)
    ).cuda()


def batch(size: int = BATCH) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(size, WIDTH, device="cuda"), torch.randint(0, WIDTH, (size,), device="cuda")
