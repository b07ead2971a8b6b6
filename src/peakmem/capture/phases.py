"""Where the job is: the phase of the training step and the module running.

- forward: from the first module call after a step until backward starts (the loss counts);
- backward: while `backward()` / `autograd.grad()` runs;
- optimizer: inside `optimizer.step()`;
- other: everything else (model set-up, moving the batch, `zero_grad`).
Module paths come from `capture.modules.ModulePaths` (forward and backward).
Tensors the job keeps are re-tagged when they are recognised: parameters and buffers of called
modules, gradients after backward, optimizer state after a step, and what the forward left alive
for backward (activations) when backward starts.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import torch
import torch.optim.optimizer as optimizer_hooks

from peakmem.capture.modules import ModulePaths
from peakmem.capture.session import CaptureSession
from peakmem.trace.vocab import Category, Phase

_STEP_TEMPS = (Category.TEMPORARY.value, Category.OTHER.value)
MIN_STEPS = 3
MAX_AUTO_EPOCH = 256


def auto_step_limit(epoch_steps: int | None) -> int:
    """Steps to run when the user did not say: at least 3; when the job iterates a DataLoader
    with a short epoch, the whole epoch (its last batch is often smaller and changes the
    allocator's state) plus two steps of the next one."""
    if epoch_steps is not None and epoch_steps <= MAX_AUTO_EPOCH:
        return max(MIN_STEPS, epoch_steps + 2)
    return MIN_STEPS


class StopJob(BaseException):  # noqa: N818  (a control-flow signal, not an error)
    """Raised from an optimizer step hook once enough steps ran; the runner catches it."""


class PhaseTracker:
    def __init__(self, session: CaptureSession, stop_after_steps: int | None) -> None:
        """`stop_after_steps`: stop after that many optimizer steps; None: `auto_step_limit`."""
        self.session = session
        self.stop_after_steps = stop_after_steps
        self.modules = ModulePaths(on_root=self._classify_module_state)
        self._stack = ExitStack()
        self._param_owner: dict[int, str] = {}
        self._optimizers: dict[int, Any] = {}
        self._steps_by_optimizer: dict[int, int] = {}

    # -- lifecycle ---------------------------------------------------------------------------
    def __enter__(self) -> PhaseTracker:
        stack = self._stack
        stack.enter_context(self.modules)
        for register, hook in (
            (torch.nn.modules.module.register_module_forward_pre_hook, self._forward_pre),
            (optimizer_hooks.register_optimizer_step_pre_hook, self._step_pre),
            (optimizer_hooks.register_optimizer_step_post_hook, self._step_post),
        ):
            stack.callback(register(hook).remove)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    # -- state read by the recorder ------------------------------------------------------------
    def current_module(self) -> str | None:
        return self.modules.current()

    @contextmanager
    def backward(self) -> Iterator[None]:
        # What the forward made and is still alive when backward starts is what autograd saved
        # (a saved_tensors_hooks pack hook would tell exactly, but returning the tensor from it
        # makes reference cycles that delay every free until Python's garbage collection).
        self.session.reclassify_live(
            Category.ACTIVATION.value, phase=Phase.FORWARD.value, only_from=_STEP_TEMPS
        )
        state = self.session.state
        previous = state.phase
        state.phase = Phase.BACKWARD.value
        self.modules.in_backward, self.modules.backward_module = True, None
        self.session.mark("backward")
        try:
            yield
        finally:
            self.modules.in_backward = False
            state.phase = Phase.OTHER.value if previous == Phase.FORWARD.value else previous
            self._classify_gradients(self.modules.roots.values())

    # -- hooks ---------------------------------------------------------------------------------
    def _forward_pre(self, module: torch.nn.Module, args: Any) -> None:
        state = self.session.state
        if state.phase == Phase.OTHER.value:
            state.phase = Phase.FORWARD.value
            state.forward_calls += 1
            self.session.mark("forward")

    def _classify_module_state(self, module: torch.nn.Module) -> None:
        session = self.session
        for sub in module.modules():
            owner = self.modules.name_of(sub)
            for param in sub.parameters(recurse=False):
                if owner is not None:
                    self._param_owner[id(param)] = owner
                session.classify(param, Category.PARAMETER.value, module=owner)
            for buffer in sub.buffers(recurse=False):
                session.classify(buffer, Category.BUFFER.value, module=owner)

    def _classify_gradients(self, modules) -> None:
        for module in list(modules):
            for param in module.parameters():
                self.session.classify(param.grad, Category.GRADIENT.value, only_from=_STEP_TEMPS)

    def _step_pre(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self._optimizers[id(optimizer)] = optimizer
        for group in optimizer.param_groups:
            for param in group["params"]:
                self.session.classify(param, Category.PARAMETER.value, only_from=_STEP_TEMPS)
                self.session.classify(
                    param.grad, Category.GRADIENT.value, only_from=_STEP_TEMPS
                )
        self.session.state.phase = Phase.OPTIMIZER.value
        self.session.mark("optimizer")

    def _step_post(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        session = self.session
        for param, per_param in optimizer.state.items():
            owner = self._param_owner.get(id(param))
            for value in per_param.values():
                session.classify(
                    value, Category.OPTIMIZER_STATE.value, module=owner, only_from=_STEP_TEMPS
                )
        session.state.phase = Phase.OTHER.value
        key = id(optimizer)
        self._steps_by_optimizer[key] = self._steps_by_optimizer.get(key, 0) + 1
        session.state.steps = max(self._steps_by_optimizer.values())
        session.mark(f"step {self._steps_by_optimizer[key]}")
        limit = self.stop_after_steps
        if limit is None:
            limit = auto_step_limit(session.state.epoch_steps)
        if min(self._steps_by_optimizer.values()) >= limit:
            session.state.stopped = True
            raise StopJob
