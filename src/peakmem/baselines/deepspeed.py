"""DeepSpeed's model-state estimators on one GPU, as its source computes them.

deepspeed/runtime/zero/stage_1_and_2.py, estimate_zero2_model_states_mem_needs without CPU offload:
    gpu_mem = 4*P + int(16*P / total_gpus)
deepspeed/runtime/zero/stage3.py, estimate_zero3_model_states_mem_needs without offload:
    gpu_mem = 4*largest_layer_params + int(18*P / total_gpus)
P counts shared parameters once (model_to_params). Model states only: no activations, no context.
The `deepspeed` bench estimator reports ZeRO-2 (the plain data-parallel layout on one GPU).
"""

from __future__ import annotations

from torch import nn

from peakmem.baselines.base import Estimator
from peakmem.baselines.rebuild import parameter_count, rebuild
from peakmem.datasets.rows import BenchRow


def zero2_gpu_bytes(total_params: int, total_gpus: int = 1) -> int:
    return 4 * total_params + int(16 * total_params / total_gpus)


def zero3_gpu_bytes(total_params: int, largest_layer_params: int, total_gpus: int = 1) -> int:
    return 4 * largest_layer_params + int(18 * total_params / total_gpus)


def largest_layer_params(model: nn.Module) -> int:
    return max(
        (sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules()), default=0
    )


class DeepSpeedEstimator(Estimator):
    name = "deepspeed"

    def estimate_bytes(self, row: BenchRow) -> int:
        return zero2_gpu_bytes(parameter_count(rebuild(row, "meta").model))
