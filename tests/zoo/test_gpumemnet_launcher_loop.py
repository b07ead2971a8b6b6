"""The GPUMemNet Transformer launcher's `train_model` as the zoo job runs it: the previous
batch's outputs stay alive through the next forward, and epochs repeat until `steps`."""

from __future__ import annotations

import importlib
import sys
import weakref
from pathlib import Path

import torch
from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.utils.data import DataLoader, TensorDataset

ZOO = Path(__file__).resolve().parents[2] / "benchmarks" / "zoo"


def zoo_gpumemnet():
    sys.path.insert(0, str(ZOO))
    try:
        return importlib.import_module("gpumemnet")
    finally:
        sys.path.remove(str(ZOO))


class Recorder(nn.Module):
    """A classifier that notes, at each forward, whether its previous output is still alive."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)
        self.previous: weakref.ref | None = None
        self.previous_alive: list[bool] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.previous_alive.append(self.previous is not None and self.previous() is not None)
        out = self.fc(x)
        self.previous = weakref.ref(out)
        return out


def test_previous_outputs_live_into_the_next_forward_and_epochs_repeat():
    gpumemnet = zoo_gpumemnet()
    data = TensorDataset(torch.randn(10, 4), torch.randint(0, 3, (10,)))
    loader = DataLoader(data, batch_size=4)  # 3 batches per epoch, the last of 2
    model = Recorder()
    steps: list[int] = []
    handle = register_optimizer_step_post_hook(
        lambda *_: steps.append(1))
    try:
        gpumemnet.launcher_train_model(model, loader, torch.device("cpu"), 5)
    finally:
        handle.remove()
    assert len(steps) == 5  # a second epoch ran
    assert model.previous_alive == [False, True, True, True, True]
