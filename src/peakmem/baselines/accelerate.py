"""`accelerate estimate-memory`, as its source computes it (accelerate/commands/estimate.py).

Total size = bytes of all parameters and buffers (calculate_maximum_sizes). For float32 training
with Adam, estimate_training_usage gives model = size, gradients = size, optimizer = 2*size,
step = 4*size, and the command prints the largest: 4 x the model size. No activations.
"""

from __future__ import annotations

from torch import nn

from peakmem.baselines.base import Estimator
from peakmem.baselines.rebuild import rebuild
from peakmem.datasets.rows import BenchRow


def model_bytes(model: nn.Module) -> int:
    tensors = list(model.parameters()) + list(model.buffers())
    return sum({id(t): t.numel() * t.element_size() for t in tensors}.values())


def training_bytes_fp32_adam(size_bytes: int) -> int:
    """max(model, gradients, optimizer, step) for mixed_precision float32."""
    usage = {
        "model": size_bytes,
        "gradients": size_bytes,
        "optimizer": 2 * size_bytes,
        "step": 4 * size_bytes,
    }
    return max(usage.values())


class AccelerateEstimator(Estimator):
    name = "accelerate"

    def estimate_bytes(self, row: BenchRow) -> int:
        return training_bytes_fp32_adam(model_bytes(rebuild(row, "meta").model))
