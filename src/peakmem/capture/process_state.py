"""Process-wide settings a job may change that outlive its capture when the capture runs in the
caller's process (`estimate_command(..., isolate=False)`: the bench's workers, `peakmem fit`'s
probes, tests): each is saved when the fake CUDA runtime starts and put back when it ends, so the
next job in the process starts from the same state (registry: one saver per kind of state).

- torch's float32 precision flags: a job that sets TF32 with the legacy API
  (`torch.backends.cuda.matmul.allow_tf32 = True`, nanoGPT) and another that reads it with the new
  one (`torch.get_float32_matmul_precision()`, Lightning) make torch raise "a mix of the legacy
  and new APIs";
- bitsandbytes' `GlobalOptimManager` singleton: the HF Trainer registers 32-bit overrides for
  embedding weights keyed by `id(param)`; a later job's parameters that reuse those ids would get
  32-bit optimizer states instead of 8-bit ones;
- accelerate's shared states (`PartialState`, `AcceleratorState`, `GradientState`: one dict per
  class that every instance shares): a job's `Accelerator(mixed_precision="no")` left them
  initialized, and the next job's `Accelerator(mixed_precision="bf16")` raised "AcceleratorState
  has already been initialized and cannot be changed";
- torch's deterministic-algorithms switch (and its `warn_only`);
- the root logger's handlers and every logger's level: Hydra's `@hydra.main` (and `logging.basicConfig`)
  configure them for the job, and later code in the process logged to the job's file and
  console at the job's level.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

Restore = Callable[[], None]
SAVERS: list[Callable[[], Restore | None]] = []


def _register(saver: Callable[[], Restore | None]) -> Callable[[], Restore | None]:
    SAVERS.append(saver)
    return saver


def precision_objects() -> list:
    """torch's objects with an `fp32_precision` setting (the new API), where this torch has them."""
    backends = torch.backends
    objects = [backends, getattr(backends.cuda, "matmul", None), backends.cudnn,
               getattr(backends.cudnn, "conv", None), getattr(backends.cudnn, "rnn", None),
               backends.mkldnn]
    objects += [getattr(backends.mkldnn, name, None) for name in ("matmul", "conv", "rnn")]
    return [obj for obj in objects if obj is not None and hasattr(obj, "fp32_precision")]


@_register
def _float32_precision() -> Restore | None:
    try:
        legacy = torch.get_float32_matmul_precision()
        values = [(obj, obj.fp32_precision) for obj in precision_objects()]
    except (RuntimeError, AttributeError):
        return None  # already mixed before the job: nothing consistent to put back

    def restore() -> None:
        try:
            torch.set_float32_matmul_precision(legacy)
            for obj, value in values:
                obj.fp32_precision = value
        except (RuntimeError, AttributeError, ValueError):
            pass

    return restore


@_register
def _deterministic_algorithms() -> Restore | None:
    """`torch.use_deterministic_algorithms(True)` (DCGAN tutorial): left on, the next job's
    cuBLAS calls would raise for want of CUBLAS_WORKSPACE_CONFIG (cuda_rules/blas.py)."""
    enabled = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()

    def restore() -> None:
        torch.use_deterministic_algorithms(enabled, warn_only=warn_only)

    return restore


@_register
def _bitsandbytes_overrides() -> Restore | None:
    module = sys.modules.get("bitsandbytes.optim.optimizer")
    manager_type = getattr(module, "GlobalOptimManager", None) if module is not None else None

    def restore() -> None:
        loaded = sys.modules.get("bitsandbytes.optim.optimizer")
        manager = getattr(loaded, "GlobalOptimManager", None) if loaded is not None else None
        instance = getattr(manager, "_instance", None) if manager is not None else None
        if instance is not None and hasattr(instance, "initialize"):
            instance.initialize()  # what a fresh process has: no overrides

    if manager_type is not None and getattr(manager_type, "_instance", None) is not None:
        instance = manager_type._instance
        if getattr(instance, "pid2config", None) or getattr(instance, "index2config", None):
            return None  # the caller's own overrides, made before the job: left alone
    return restore


ACCELERATE_SHARED_STATES = ("PartialState", "AcceleratorState", "GradientState")


@_register
def _accelerate_shared_states() -> Restore:
    module = sys.modules.get("accelerate.state")
    saved = {name: dict(getattr(getattr(module, name, None), "_shared_state", None) or {})
             for name in ACCELERATE_SHARED_STATES} if module is not None else {}

    def restore() -> None:
        loaded = sys.modules.get("accelerate.state")  # imported by the job, or before it
        for name in ACCELERATE_SHARED_STATES:
            shared = getattr(getattr(loaded, name, None), "_shared_state", None)
            if isinstance(shared, dict):
                shared.clear()
                shared.update(saved.get(name, {}))  # empty where the job made the first

    return restore


@_register
def _root_logger() -> Restore:
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    levels = {name: logger.level for name, logger in list(root.manager.loggerDict.items())
              if isinstance(logger, logging.Logger)}  # open_clip_train sets every one to INFO

    def restore() -> None:
        for handler in [h for h in root.handlers if h not in handlers]:
            root.removeHandler(handler)
            with contextlib.suppress(Exception):  # a job's handler may fail as it likes
                handler.close()  # the job's log file, say
        for handler in handlers:
            if handler not in root.handlers:
                root.addHandler(handler)
        # `Logger.setLevel` empties every logger's isEnabledFor cache (one pass over all of
        # them): set directly the levels that differ, then one setLevel empties the caches once
        # (a setLevel per logger made each restore quadratic in the loggers: ~0.3 s with the
        # ~500 loggers that transformers, DeepSpeed and diffusers create, seconds with more)
        for name, logger in list(root.manager.loggerDict.items()):
            if isinstance(logger, logging.Logger):
                wanted = levels.get(name, logging.NOTSET)
                if logger.level != wanted:
                    logger.level = wanted
        root.setLevel(level)

    return restore


@contextmanager
def process_state_kept() -> Iterator[None]:
    """Every registered kind of process-wide state put back after the block."""
    restores = [restore for saver in SAVERS if (restore := saver()) is not None]
    try:
        yield
    finally:
        for restore in reversed(restores):
            restore()
