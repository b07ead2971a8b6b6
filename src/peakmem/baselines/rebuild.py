"""Rebuild a bench row's job as (model, inputs) for the estimators that need a model.

GPUMemNet rows rebuild exactly (peakmem.datasets.gpumemnet_models). timm rows need the optional
`timm` package; other rows (xMem's torchvision / Hugging Face runs, ground-truth scripts) are not
rebuilt here: CannotEstimate.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from peakmem.baselines.base import CannotEstimate, MissingPackage
from peakmem.datasets.gpumemnet_jobs import CNNJob, MLPJob, TransformerJob
from peakmem.datasets.gpumemnet_models import CannotBuildJob, build_model, make_batch
from peakmem.datasets.rows import BenchRow


@dataclass
class RebuiltJob:
    model: nn.Module
    inputs: torch.Tensor
    targets: torch.Tensor
    batch_size: int


def _gpumemnet(row: BenchRow, device: str) -> RebuiltJob:
    try:
        model = build_model(row.job, device)
    except CannotBuildJob as exc:
        raise CannotEstimate(str(exc)) from exc
    inputs, targets = make_batch(row.job, device=device)
    return RebuiltJob(model, inputs, targets, row.job.batch_size)


def _timm(row: BenchRow, device: str) -> RebuiltJob:
    try:
        timm = importlib.import_module("timm")
    except ImportError as exc:
        raise MissingPackage("timm rows need the optional `timm` package") from exc
    with torch.device(device):
        model = timm.create_model(row.job["model"], pretrained=False)
    cfg = getattr(model, "pretrained_cfg", {}) or {}
    channels, height, width = cfg.get("input_size", (3, 224, 224))
    b = row.job["batch_size"]
    inputs = torch.randn(b, channels, height, width, device=device)
    targets = torch.randint(0, getattr(model, "num_classes", 1000), (b,), device=device)
    return RebuiltJob(model, inputs, targets, b)


def rebuild(row: BenchRow, device: str = "meta") -> RebuiltJob:
    """The row's model and one batch on `device` (meta by default: shapes only)."""
    if isinstance(row.job, MLPJob | CNNJob | TransformerJob):
        return _gpumemnet(row, device)
    builder: Callable[[BenchRow, str], RebuiltJob] | None = None
    if isinstance(row.job, dict) and row.job.get("library") == "timm":
        builder = _timm
    if builder is None:
        raise CannotEstimate(f"cannot rebuild {row.dataset} jobs ({row.family}) as a model")
    return builder(row, device)


def parameter_count(model: nn.Module) -> int:
    """Unique parameters (shared ones counted once, as DeepSpeed's model_to_params does)."""
    return sum({id(p): p.numel() for p in model.parameters()}.values())
