"""Ray Train (`TorchTrainer(train_func, scaling_config=ScalingConfig(num_workers=N,
use_gpu=True)).fit()`): the training function runs in the job's own process.

Ray Train runs the function in Ray worker processes that a local Ray cluster starts through its
raylet: they are outside the capture, and the cluster has no GPU resource (the fake CUDA runtime
lives in the job's process only), so `fit()` waited for a GPU worker until the timeout. Ray
Train 2 has a local mode (`num_workers=0`: `DataParallelTrainer.fit` runs the function in the
driver process, `ray.train.torch.get_device()` and `prepare_model` as on one worker); during a
capture every trainer runs that way, with a note: the estimate is one worker's, on the GPU it
would get. With N > 1 workers it runs as rank 0 of N, as Ray's local mode runs under torchrun:
the torchrun variables (RANK, WORLD_SIZE, ...) are set for the call, so local mode starts a
process group of N (the capture's fake one) and `prepare_model` wraps the model in DDP, as on
the workers. Nothing happens before the job imports Ray Train.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from peakmem.capture.environment import environment_set
from peakmem.capture.library_patches import register_library_patch
from peakmem.capture.on_import import Undo, patch_on_import
from peakmem.capture.running_session import session_on_mode_stack

RAY_TRAINER_MODULE = "ray.train.v2.api.data_parallel_trainer"


TORCHRUN_RANK0 = {"RANK": "0", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                  "MASTER_PORT": "29500"}
"""With WORLD_SIZE and LOCAL_WORLD_SIZE: what `has_torchrun_env()` (ray/train/v2/_internal/
execution/local_mode/torch.py) looks for."""


def local_mode_note(workers: int, use_gpu: bool) -> str:
    text = (f"Ray Train: the training function ran in the job's process (Ray Train's local mode) "
            f"instead of on {workers} Ray worker(s){' with a GPU each' if use_gpu else ''}: the "
            "estimate is one worker's")
    if workers > 1:
        text += f" (rank 0 of {workers}, in a process group of {workers})"
    return text


@contextmanager
def _torchrun_variables(workers: int) -> Iterator[None]:
    """RANK=0 of WORLD_SIZE=`workers` for the call, unless the job was launched by torchrun."""
    names = {**TORCHRUN_RANK0, "WORLD_SIZE": str(workers), "LOCAL_WORLD_SIZE": str(workers)}
    if workers <= 1 or any(name in os.environ for name in ("RANK", "WORLD_SIZE")):
        yield
        return
    with environment_set(names):
        yield


def _patch_fit(module: Any) -> Undo:
    trainer = getattr(module, "DataParallelTrainer", None)
    original = vars(trainer).get("fit") if trainer is not None else None
    if original is None:
        return lambda: None

    def fit(self: Any) -> Any:
        session = session_on_mode_stack()
        if session is None or self.running_in_local_mode:
            return original(self)
        scaling = self.scaling_config
        self.running_in_local_mode = True
        session.notes.append(local_mode_note(scaling.num_workers, bool(scaling.use_gpu)))
        with _torchrun_variables(scaling.num_workers):
            return original(self)

    trainer.fit = fit

    def undo() -> None:
        trainer.fit = original

    return undo


@register_library_patch("ray_train_local_mode")
@contextmanager
def ray_train_local_mode() -> Iterator[None]:
    with patch_on_import(RAY_TRAINER_MODULE, _patch_fit):
        yield
