from __future__ import annotations

import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest


@pytest.fixture
def write_script(tmp_path: Path) -> Callable[[str, str], Path]:
    """Write a tiny script into tmp_path and return its path."""

    def _write(body: str, name: str = "train.py") -> Path:
        path = tmp_path / name
        path.write_text(textwrap.dedent(body))
        return path

    return _write


TRAIN_LOOP = """
import sys
import torch

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 100
model = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
done = 0
for _ in range(steps):
    opt.zero_grad()
    model(torch.randn(3, 4)).sum().backward()
    opt.step()
    done += 1
print("DONE", done)
"""
