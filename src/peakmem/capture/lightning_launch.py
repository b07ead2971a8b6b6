"""Lightning's own multi-GPU launch, run as plain `python train.py`: rank 0 of the world it
would start.

`Trainer(devices=N, strategy="ddp" | "fsdp" | ...)` (and `Fabric(devices=N)`) started without a
launcher starts the other N-1 processes itself: `_SubprocessScriptLauncher.launch` re-runs the
script once per local rank with `LOCAL_RANK=i` (`_call_children_scripts`) and goes on as rank 0.
During a capture:
- asking for N GPUs by count or by index works: the fake machine has the GPUs the job asks for
  (`_sanitize_gpu_ids` of Lightning's device parser accepts them; `devices=-1`/"auto" still see
  the one fake GPU, or the launch's local world size);
- the launch starts no process: this process becomes rank 0 as the children would see it
  (MASTER_ADDR/PORT, NODE_RANK=0, LOCAL_RANK=0, RANK=0, WORLD_SIZE=N x nodes,
  LOCAL_WORLD_SIZE=N), with `torch.cuda.device_count()` = N; Lightning then sees a launch made
  outside it and goes on exactly as each child would, and its process group is the fake group
  of the full world size (capture.fake_distributed);
- the capture's trace meta says so (`launch`: launcher "lightning", world size, processes per
  node, nodes), and the estimate reports `world_size` and `ranks` as for torchrun
  (estimate.distributed.adopt_self_launch), with a note.
`strategy="ddp_spawn"` (`_MultiProcessingLauncher`) is the same: the fake `torch.multiprocessing`
runs worker 0 here as rank 0 of N, and the main process's recovery of its results (reloading a
checkpoint the worker saved) is skipped, since the trainer it ran with is this one.
The environment and the device count are put back when the capture ends.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import torch

from peakmem.capture.library_patches import register_library_patch
from peakmem.capture.on_import import patch_on_import

LAUNCHER_MODULES = (
    "lightning.pytorch.strategies.launchers.subprocess_script",
    "lightning.fabric.strategies.launchers.subprocess_script",
    "pytorch_lightning.strategies.launchers.subprocess_script",
    "lightning_fabric.strategies.launchers.subprocess_script",
)
SPAWN_MODULES = (
    "lightning.pytorch.strategies.launchers.multiprocessing",
    "lightning.fabric.strategies.launchers.multiprocessing",
    "pytorch_lightning.strategies.launchers.multiprocessing",
    "lightning_fabric.strategies.launchers.multiprocessing",
)
PARSER_MODULES = (
    "lightning.fabric.utilities.device_parser",
    "lightning_fabric.utilities.device_parser",
)
LAUNCH_META = "launch"
"""The trace meta key of a launch the job made itself: {launcher, world_size, nproc_per_node,
nnodes}."""


class _Adopted:
    """What adopting rank 0 changed, to put back afterwards."""

    def __init__(self) -> None:
        self.env: dict[str, str | None] = {}
        self.device_counts: list[tuple[Any, Any]] = []

    def set_env(self, name: str, value: str) -> None:
        if name not in self.env:
            self.env[name] = os.environ.get(name)
        os.environ[name] = value

    def set_device_count(self, count: int) -> None:
        for owner in (torch.cuda, torch.accelerator):
            if hasattr(owner, "device_count"):
                self.device_counts.append((owner, owner.device_count))
                owner.device_count = lambda count=count: count

    def restore(self) -> None:
        for owner, original in reversed(self.device_counts):
            owner.device_count = original
        self.device_counts.clear()
        for name, value in self.env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        self.env.clear()


def _adopt_rank_zero(launcher: Any, adopted: _Adopted) -> None:
    """Make this process rank 0 of the launch `launcher` would start."""
    from peakmem.capture.running_session import session_on_mode_stack as current_session

    nproc = max(1, int(getattr(launcher, "num_processes", 1) or 1))
    nnodes = max(1, int(getattr(launcher, "num_nodes", 1) or 1))
    cluster = launcher.cluster_environment
    env = {
        "MASTER_ADDR": str(getattr(cluster, "main_address", "127.0.0.1")),
        "MASTER_PORT": str(getattr(cluster, "main_port", 29500)),
        "NODE_RANK": "0", "GROUP_RANK": "0", "LOCAL_RANK": "0", "RANK": "0",
        "WORLD_SIZE": str(nproc * nnodes), "LOCAL_WORLD_SIZE": str(nproc),
    }
    for name, value in env.items():
        adopted.set_env(name, value)
    adopted.set_device_count(nproc)
    session = current_session()
    if session is None:
        return
    session.trace.meta[LAUNCH_META] = {
        "launcher": "lightning", "world_size": nproc * nnodes, "nproc_per_node": nproc,
        "nnodes": nnodes,
    }
    note = (f"Lightning would start {nproc} process(es) per node on {nnodes} node(s) itself: "
            f"rank 0 was traced with a fake process group of world size {nproc * nnodes}; the "
            "other ranks were not started")
    if note not in session.notes:
        session.notes.append(note)


def _patch_launcher(adopted: _Adopted) -> Any:
    def apply(module: Any) -> Any:
        cls = getattr(module, "_SubprocessScriptLauncher", None)
        if cls is None:
            return lambda: None
        original = cls.launch

        def launch(self: Any, function: Any, *args: Any, **kwargs: Any) -> Any:
            if not self.cluster_environment.creates_processes_externally:
                _adopt_rank_zero(self, adopted)
            return original(self, function, *args, **kwargs)

        cls.launch = launch

        def undo() -> None:
            cls.launch = original

        return undo

    return apply


def _patch_spawn(adopted: _Adopted) -> Any:
    """`strategy="ddp_spawn"` (`_MultiProcessingLauncher`): the fake `torch.multiprocessing`
    runs worker 0 in this process (capture.fake_processes); it is rank 0 of the world, and its
    results need no recovery in a "main process" (the trainer it ran with is this one)."""

    class _Shape:
        def __init__(self, strategy: Any) -> None:
            self.num_processes = getattr(strategy, "num_processes", 1)
            self.num_nodes = getattr(strategy, "num_nodes", 1)
            self.cluster_environment = strategy.cluster_environment

    def apply(module: Any) -> Any:
        cls = getattr(module, "_MultiProcessingLauncher", None)
        if cls is None:
            return lambda: None
        original_launch = cls.launch
        original_recover = getattr(cls, "_recover_results_in_main_process", None)

        def launch(self: Any, function: Any, *args: Any, **kwargs: Any) -> Any:
            strategy = getattr(self, "_strategy", None)
            if strategy is not None and getattr(strategy, "num_processes", 1) > 1:
                _adopt_rank_zero(_Shape(strategy), adopted)
            return original_launch(self, function, *args, **kwargs)

        def recover(self: Any, worker_output: Any, trainer: Any) -> None:
            return None

        cls.launch = launch
        if original_recover is not None:
            cls._recover_results_in_main_process = recover

        def undo() -> None:
            cls.launch = original_launch
            if original_recover is not None:
                cls._recover_results_in_main_process = original_recover

        return undo

    return apply


def _patch_parser(module: Any) -> Any:
    original = getattr(module, "_sanitize_gpu_ids", None)
    if original is None:
        return lambda: None

    def sanitize(gpus: Any, include_cuda: bool = False, include_mps: bool = False) -> Any:
        """The GPUs a job names exist on the fake machine (one, or the launch's world)."""
        if include_cuda and all(isinstance(gpu, int) and gpu >= 0 for gpu in gpus):
            return list(gpus)
        return original(gpus, include_cuda=include_cuda, include_mps=include_mps)

    module._sanitize_gpu_ids = sanitize

    def undo() -> None:
        module._sanitize_gpu_ids = original

    return undo


@register_library_patch("lightning_launch")
@contextmanager
def lightning_launch() -> Iterator[None]:
    adopted = _Adopted()
    try:
        with ExitStack() as stack:
            for name in LAUNCHER_MODULES:
                stack.enter_context(patch_on_import(name, _patch_launcher(adopted)))
            for name in SPAWN_MODULES:
                stack.enter_context(patch_on_import(name, _patch_spawn(adopted)))
            for name in PARSER_MODULES:
                stack.enter_context(patch_on_import(name, _patch_parser))
            yield
    finally:
        adopted.restore()
