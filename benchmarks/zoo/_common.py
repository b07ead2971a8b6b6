"""Knobs and the training loop shared by the zoo scripts (plain PyTorch; only gpumemnet.py imports peakmem, for its model builders).

Every zoo script is a plain training job: `python benchmarks/zoo/<job>.py [knobs]`. This module
sits next to them, so `python` finds it on sys.path[0]."""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

Batch = Any
LossFn = Callable[[nn.Module, Batch], torch.Tensor]


def base_parser(description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--optimizer", choices=["sgd", "adam", "adamw"], default="adamw")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument(
        "--precision",
        choices=["fp32", "bf16", "fp16"],
        default="fp32",
        help="bf16: autocast; fp16: autocast + GradScaler",
    )
    parser.add_argument("--grad-checkpointing", action="store_true")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model")
    parser.add_argument("--cudnn-benchmark", action="store_true")
    parser.add_argument("--steps", type=int, default=20, help="training steps the script runs")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--seed", type=int, default=0)
    return parser


def setup(args: argparse.Namespace) -> torch.device:
    torch.manual_seed(args.seed)
    if args.device == "cuda":
        torch.backends.cudnn.benchmark = bool(args.cudnn_benchmark)
    return torch.device(args.device)


def build_on(device: torch.device, factory: Callable[[], nn.Module]) -> nn.Module:
    """Construct the model directly on the device (fast init of large models, no CPU copy)."""
    with device:
        model = factory()
    return model.to(device)


def make_optimizer(name: str, params: Iterable[nn.Parameter], lr: float) -> torch.optim.Optimizer:
    params = [p for p in params if p.requires_grad]
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=0.9)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr)
    return torch.optim.AdamW(params, lr=lr)


class Checkpointed(nn.Module):
    """Recompute the wrapped module's forward in backward (activation checkpointing)."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return checkpoint(self.module, *args, use_reentrant=False, **kwargs)


def checkpoint_children(container: nn.Module, names: Iterable[str] | None = None) -> None:
    """Wrap each child of ``container`` (or only the named ones) in :class:`Checkpointed`."""
    wanted = set(names) if names is not None else None
    for name, child in list(container.named_children()):
        if wanted is None or name in wanted:
            setattr(container, name, Checkpointed(child))


@contextlib.contextmanager
def _no_autocast() -> Iterator[None]:
    yield


def autocast_for(args: argparse.Namespace) -> Callable[[], contextlib.AbstractContextManager]:
    if args.precision == "fp32":
        return _no_autocast
    dtype = torch.bfloat16 if args.precision == "bf16" else torch.float16
    return lambda: torch.autocast(device_type=args.device, dtype=dtype)


def train(
    model: nn.Module,
    make_batch: Callable[[], Batch],
    loss_fn: LossFn,
    args: argparse.Namespace,
    batches: Iterable[Batch] | None = None,
) -> float:
    """zero_grad -> forward+loss (autocast) -> backward -> step -> loss.item(), ``args.steps``
    times; a new batch each step (from ``batches`` if given, else ``make_batch()``)."""
    model.train()
    optimizer = make_optimizer(args.optimizer, model.parameters(), args.lr)
    runner = torch.compile(model) if args.compile else model
    autocast = autocast_for(args)
    scaler = torch.amp.GradScaler(args.device) if args.precision == "fp16" else None
    source = iter(batches) if batches is not None else None
    last = float("nan")
    for _ in range(args.steps):
        batch = next(source) if source is not None else make_batch()
        optimizer.zero_grad(set_to_none=True)
        with autocast():
            loss = loss_fn(runner, batch)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        else:
            loss.backward()
            optimizer.step()
        last = loss.item()
    return last


def report(name: str, loss: float) -> None:
    print(f"{name}: final loss {loss:.4f}")
