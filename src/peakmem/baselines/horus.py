"""Horus, as the GPUMemNet paper computed it.

    MiB = 4 * (A*B + P + B*P) / 2**20 + 800

A = per-sample sum of layer output elements (every leaf module's output, plus multi-head attention
blocks whose inner projection is not called as a module), P = parameters, B = batch size. A comes
from forward hooks on the rebuilt model on the meta device: no memory, no compute.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from peakmem.baselines.base import Estimator
from peakmem.baselines.rebuild import parameter_count, rebuild
from peakmem.datasets.rows import BenchRow, MiB

CONTEXT_MIB = 800


def horus_mib(activations_per_sample: int, params: int, batch: int) -> float:
    """The formula itself (MiB)."""
    a, p, b = activations_per_sample, params, batch
    return 4 * (a * b + p + b * p) / 2**20 + CONTEXT_MIB


def _hooked(module: nn.Module) -> bool:
    return not list(module.children()) or isinstance(module, nn.MultiheadAttention)


def per_sample_activations(model: nn.Module, inputs: torch.Tensor) -> int:
    """Sum over hooked modules of output elements per sample (first output of tuples)."""
    batch = inputs.shape[0]
    total = 0

    def hook(_module: nn.Module, _inputs: object, output: object) -> None:
        nonlocal total
        if isinstance(output, tuple):
            output = output[0]
        if isinstance(output, torch.Tensor) and output.dim() > 0:
            total += math.prod(output.shape) // batch

    handles = [m.register_forward_hook(hook) for m in model.modules() if _hooked(m)]
    try:
        with torch.no_grad():
            model(inputs)
    finally:
        for handle in handles:
            handle.remove()
    return total


class HorusEstimator(Estimator):
    name = "horus"

    def estimate_bytes(self, row: BenchRow) -> int:
        job = rebuild(row, "meta")
        a = per_sample_activations(job.model.train(), job.inputs)
        return int(horus_mib(a, parameter_count(job.model), job.batch_size) * MiB)
