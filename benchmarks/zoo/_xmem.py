"""What xMem's two training loops share (Stone-ResearchLife/xMem `exp/trainer/train_loop.py`):
the command line, and the step with its three `zero_grad` placements (mode 0: before the batch
moves to the GPU; 1: after the forward; 2: after the optimizer step). The loop breaks after
index `iterations` (3): 4 steps."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import torch


def xmem_parser(description: str, model_help: str, optimizers: tuple[str, ...]) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--model", required=True, help=model_help)
    p.add_argument("--batch-size", type=int, required=True)
    p.add_argument("--optimizer", choices=optimizers, default="AdamW")  # ModelPreparer's
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--steps", type=int, default=4,
                   help="optimizer steps (xMem: iterations=3, break after index 3: 4 steps)")
    p.add_argument("--zero-grad-mode", type=int, choices=(0, 1, 2), default=0)
    p.add_argument("--device", default="cuda")
    p.add_argument("--seed", type=int, default=0)
    return p


def xmem_main(parser: Callable[[], argparse.ArgumentParser],
              train: Callable[[argparse.Namespace], float]) -> None:
    """Parse the command line, train, print the final loss (both jobs' entry point)."""
    args = parser().parse_args()
    print(f"{args.model}: final loss {train(args):.4f}")


def run_steps(
    args: argparse.Namespace,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    make_batch: Callable[[], Any],
    forward: Callable[[torch.nn.Module, Any], tuple[torch.Tensor, Any]],
    after_step: Callable[[Any], Any] | None = None,
) -> float:
    """xMem's loop: the host batch moves to the device each step; `forward` returns (loss,
    outputs), and `outputs` stays alive into the next step as in xMem's loop."""
    device = torch.device(args.device)
    loss_value = float("nan")
    for _index in range(args.steps):
        batch = make_batch()
        if args.zero_grad_mode == 0:
            optimizer.zero_grad()
        batch = _to(batch, device)
        loss, outputs = forward(model, batch)
        if args.zero_grad_mode == 1:
            optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if after_step is not None:
            after_step(outputs)
        if args.zero_grad_mode == 2:
            optimizer.zero_grad()
        loss_value = loss.item()
    return loss_value


def _to(batch: Any, device: torch.device) -> Any:
    if isinstance(batch, dict):
        return {k: v.to(device) for k, v in batch.items()}
    if isinstance(batch, (tuple, list)):
        return type(batch)(v.to(device) for v in batch)
    return batch.to(device)
