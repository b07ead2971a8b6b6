"""Ray Train (`TorchTrainer(train_func, scaling_config=ScalingConfig(num_workers=N,
use_gpu=True)).fit()`): the training function runs in the job's own process.

Ray Train runs the function in Ray worker processes that a local Ray cluster starts through its
raylet: they are outside the capture, and the cluster has no GPU resource (the fake CUDA runtime
lives in the job's process only), so `fit()` waited for a GPU worker until the timeout. Ray
Train 2 has a local mode (`num_workers=0`: `DataParallelTrainer.fit` runs the function in the
driver process, `ray.train.torch.get_device()` and `prepare_model` as on one worker); during a
capture every trainer runs that way, with a note: the estimate is one worker's, on the GPU it
would get. With more than one worker the function runs once, without a process group
(`prepare_model` does not wrap the model in DDP), so DDP's gradient buckets are not counted.
Nothing happens before the job imports Ray Train.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from peakmem.capture.library_patches import register_library_patch
from peakmem.capture.on_import import Undo, patch_on_import

RAY_TRAINER_MODULE = "ray.train.v2.api.data_parallel_trainer"


def _current_session() -> Any:
    from torch.overrides import _get_current_function_mode_stack

    from peakmem.capture.session import CaptureSession

    for mode in reversed(_get_current_function_mode_stack()):
        session = getattr(mode, "session", None)
        if isinstance(session, CaptureSession):
            return session
    return None


def local_mode_note(workers: int, use_gpu: bool) -> str:
    text = (f"Ray Train: the training function ran in the job's process (Ray Train's local mode) "
            f"instead of on {workers} Ray worker(s){' with a GPU each' if use_gpu else ''}: the "
            "estimate is one worker's")
    if workers > 1:
        text += "; without a process group, so DDP's gradient buckets are not counted"
    return text


def _patch_fit(module: Any) -> Undo:
    trainer = getattr(module, "DataParallelTrainer", None)
    original = vars(trainer).get("fit") if trainer is not None else None
    if original is None:
        return lambda: None

    def fit(self: Any) -> Any:
        session = _current_session()
        if session is not None and not self.running_in_local_mode:
            scaling = self.scaling_config
            self.running_in_local_mode = True
            session.notes.append(local_mode_note(scaling.num_workers, bool(scaling.use_gpu)))
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
