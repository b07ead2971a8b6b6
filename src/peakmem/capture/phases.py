"""Where the job is: the phase of the training step and the module running; how long it runs.

- forward: from the first module call after a step until backward starts (the loss counts);
- backward: while `backward()` / `autograd.grad()` runs;
- optimizer: inside `optimizer.step()`;
- eval: while the top-level module of an evaluation's forward runs (below); what it makes is
  `activation` (session.default_category);
- other: everything else (model set-up, moving the batch, `zero_grad`, what follows an
  evaluation's forward: metrics, predictions, best-weights copies (capture.model_copies), a
  torchmetrics metric's call (`BOOKKEEPING_MODULES`) even inside a training step).
Module paths come from `capture.modules.ModulePaths` (forward and backward).
Tensors the job keeps are re-tagged when they are recognised: parameters and buffers of called
modules, gradients after backward, optimizer state after a step, and what the forward left alive
for backward (activations) when backward starts.

Training steps are optimizer steps, or — for jobs without `torch.optim` — the first in-place
write to a parameter that received a gradient after a backward (`p.data -= lr * p.grad`,
`p.sub_(...)` under `no_grad`, `torch._foreach_add_(params, ...)`), or new data for such a
parameter when the next forward starts (`p.data = p.data - lr * p.grad`). How long the job runs
(`stop_after_steps`):
- None (the default): `auto_step_limit` steps; then the training loop is ENDED where it iterates a
  DataLoader (capture.dataloader: its epoch skips to its last batch and stops), so the code after
  it (evaluation, predict, saving) still runs; a loop that does not iterate a DataLoader
  (`for x in zip(data, targets)`, `while True: x = get_batch()`) is ended at its head
  (capture.loop_ends: the code after it runs, the next loop gets its own limit), or, where it
  cannot be, stopped (StopJob) with a note that the estimate may be low; either kind of loop
  goes on past the limit (bounded) while its memory still grows (capture.step_growth,
  capture.loader_growth);
- N: stopped after N steps (StopJob), nothing shortened;
- "all": run to the end, nothing shortened (DataLoader epochs are followed, not changed).
A forward pass without gradients after training is an evaluation: marked "eval" in the trace
(once, however many batches). A module in eval mode (`model.eval()`) runs it in the eval phase,
which ends when the module returns; one left in training mode (RL rollouts and target networks)
runs it in the forward phase, as part of the next training step, until its backward.
"""

from __future__ import annotations

import itertools
import os
import sys
import weakref
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import torch
import torch.optim.optimizer as optimizer_hooks

from peakmem.capture.arg_tensors import tensors_in
from peakmem.capture.dataloader import LoaderEpochs, LoaderIteration
from peakmem.capture.loader_growth import LoaderGrowth
from peakmem.capture.loop_ends import LoopEnds
from peakmem.capture.model_copies import ModelCopies
from peakmem.capture.modules import ModulePaths
from peakmem.capture.session import DEVICE_STREAM, CaptureSession
from peakmem.capture.step_growth import StepGrowth
from peakmem.capture.step_repeat import StepRepeater, enabled_by_env
from peakmem.capture.weight_copies import WeightCopies
from peakmem.cuda_rules.true_device import is_meta
from peakmem.jobs.stop import ALL_STEPS, Steps
from peakmem.trace.vocab import Category, Mark, Phase

_STEP_TEMPS = (Category.TEMPORARY.value, Category.OTHER.value)
_GRAD_SOURCES = (*_STEP_TEMPS, Category.COMMUNICATION.value)
"""What a `.grad` may be tagged before it is classified: a gradient that is a view of a
collective's buffer (DDP's `gradient_as_bucket_view=True`, FSDP2's reduce-scatter output) makes
that buffer the gradient's storage (capture.collective_buffers)."""
_STEPPED_PARAMS = (*_STEP_TEMPS, Category.INPUT.value, Category.MODEL_COPY.value)
_STATE_SOURCES = (*_STEPPED_PARAMS, Category.EMA.value)
"""What an optimizer's state may have been tracked as before its step kept it (`ema` too: a
wrapper's slow weights synced from the trained ones after the inner optimizer's step, timm's
Lookahead, are the optimizer's state)."""
"""What an optimizer's parameters may still be tagged when it steps: a host tensor moved to the
device is an input until a module's forward claims it, and a module whose `forward` is called
directly (`layer.forward(x)`, mnist_forward_forward) never is claimed."""
_NOT_EMA: tuple = (None, *(category.value for category in Category if category is not Category.EMA))
"""A module's weights are parameters when its forward runs, unless they were seen kept in sync
with the trained weights (an EMA teacher's forward: capture.weight_copies)."""
_FORWARDS = (Phase.FORWARD.value, Phase.EVAL.value)
MIN_STEPS = 3
MAX_AUTO_EPOCH = 256
MAX_STEPS_AFTER_END = 32
"""Steps allowed after the training loop was ended (later epochs run 1 step each) before the
job is stopped: a loop that re-iterates its DataLoader until a step count never ends by itself."""
MAX_SIDE_STREAM_STEPS = 64
"""Steps past the limit taken on a side stream (CUDA graph warm-up and capture: they do not end
the job, so the capture is reached) before the job is stopped anyway (one that trains on a side
stream throughout)."""
MAX_BARE_EPOCHS = 3
"""Later epochs in a row with nothing but training between them (no evaluation, no other
DataLoader) before the job is stopped: they repeat the same allocations."""
EVAL_MARK = Mark.EVAL.value
END_MARK = Mark.LOOP_ENDED.value
STOP_MARK = Mark.STOPPED.value
MANUAL = "manual"


def auto_step_limit(epoch_steps: int | None) -> int:
    """Steps to run when the user did not say: at least 3; when the job iterates a DataLoader
    with a short epoch, the whole epoch (its last batch is often smaller and changes the
    allocator's state) plus two steps of the next one."""
    if epoch_steps is not None and epoch_steps <= MAX_AUTO_EPOCH:
        return max(MIN_STEPS, epoch_steps + 2)
    return MIN_STEPS


def _epoch_steps(epoch: LoaderIteration) -> int | None:
    """Steps an epoch feeds, from its traced length and its accumulation window (if known)."""
    length = epoch.traced_length
    if length is None:
        return None
    window = epoch.window or 1
    return -(-length // window)


class StopJob(BaseException):  # noqa: N818  (a control-flow signal, not an error)
    """Raised once the job must stop (the step limit); the runner catches it."""


class PhaseTracker:
    def __init__(
        self, session: CaptureSession, stop_after_steps: Steps, repeat_steady: bool | None = None
    ) -> None:
        """`stop_after_steps`: N, "all" or None (`auto_step_limit`, then the loop is ended).
        `repeat_steady` (None: the PEAKMEM_REPEAT_STEADY environment variable): with a step
        limit N, once the steps are steady repeat them up to N instead of running them
        (capture.step_repeat)."""
        self.session = session
        self.run_all = stop_after_steps == ALL_STEPS
        self.stop_after_steps = None if self.run_all else stop_after_steps
        if repeat_steady is None:
            repeat_steady = enabled_by_env()
        self.repeater = (
            StepRepeater(session)
            if repeat_steady and isinstance(self.stop_after_steps, int) else None
        )
        self.loaders = LoaderEpochs(session, shorten=stop_after_steps is None)
        # the default policy ends loops without a DataLoader too (capture.loop_ends)
        self.loop_ends = (LoopEnds(stop=self._stop, boundary=PhaseTracker.run.__code__)
                          if stop_after_steps is None else None)
        self._loop_base: dict[Any, int] = {}  # steps by optimizer when the last loop ended
        self._first_loop_end = 0  # steps when the first loop without a DataLoader ended
        self._loop_planned = 0  # steps when the last loop end was planned
        self._nothing_follows = False  # the stopped loop was the script's last statement
        self.growth = StepGrowth(session)  # steps past the limit while the peak still grows
        # DataLoader epochs held (not shortened, the loop not ended) while their live memory
        # grows (default policy only)
        self.loader_growth = LoaderGrowth(session)
        if stop_after_steps is None:
            self.loaders.hold = self.loader_growth.hold
        self.modules = ModulePaths(on_root=self._classify_module_state)
        self.weight_copies = WeightCopies(session)
        self.model_copies = ModelCopies(session, self.modules.in_forward)
        self._stack = ExitStack()
        self._param_owner: dict[int, str] = {}
        # ids of the optimizers that stepped (never the optimizers: a job that makes a new one
        # per fold / run frees the old one with its state, and so must the capture)
        self._optimizers: set[int] = set()
        self._steps_by_optimizer: dict[Any, int] = {}
        # each optimizer's key in `_steps_by_optimizer`: a serial number, never its id (a freed
        # optimizer's id is reused by the next one: pytorch/examples' ddp main.py runs three
        # demos with an optimizer each, which counted as 1 or 2 steps of one, by chance)
        self._optimizer_keys: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._freed_keys: set[Any] = set()  # optimizers freed since: they no longer step
        self._serials = itertools.count(1)
        self._updated_storages: set[int] = set()  # parameters with a gradient after a backward
        self._watched: list[tuple[weakref.ref, int]] = []  # those parameters, their storages
        self._await_update = False  # a backward ran; no parameter update seen since
        self._outer_steps = 0  # wrapping optimizers' steps running (outer_step)
        self._in_steps = 0  # torch optimizers' steps running (between their pre and post hooks)
        self._stop_pending = False
        self._in_eval = False
        self._eval_depth = 0  # module calls open inside an evaluation's top-level forward
        self._aside_depth = 0  # module calls open inside a bookkeeping module's call
        self._aside_phase = Phase.OTHER.value  # the phase that call interrupted
        self.phases_ran: list[str] = []
        self.stop_reason: str | None = None  # "limit", "runaway", "error"
        self.stop_epoch: int | None = None
        self.end_steps = 0
        self.end_epoch = 0
        self.end_can_skip = True
        self.error_after_end: BaseException | None = None
        self.failed_after_shortening = False
        self.repeated_note: str | None = None

    # -- lifecycle ---------------------------------------------------------------------------
    def __enter__(self) -> PhaseTracker:
        stack = self._stack
        stack.enter_context(self.modules)
        stack.enter_context(self.loaders.followed() if self.run_all else self.loaders.patched())
        for register, hook in (
            (torch.nn.modules.module.register_module_forward_pre_hook, self._forward_pre),
            (_register_forward_post_hook, self._forward_post),
            (optimizer_hooks.register_optimizer_step_pre_hook, self._step_pre),
            (optimizer_hooks.register_optimizer_step_post_hook, self._step_post),
        ):
            stack.callback(register(hook).remove)
        self.session.watch_op = self._watch_op
        stack.callback(setattr, self.session, "watch_op", None)
        self.session.phase_tracker = self
        stack.callback(setattr, self.session, "phase_tracker", None)
        return self

    def __exit__(self, *exc: object) -> None:
        self.model_copies.flush()  # a copy made by the job's last op
        if self.loop_ends is not None:
            self.loop_ends.close()
        self._stack.close()

    def run(self, job: Any) -> None:
        """Run the job. A `StopIteration` escaping it after its DataLoader epochs were
        shortened or its training loop ended (a `next()` on an iterator the capture ended) is
        the capture's doing: the estimate keeps what ran until then and says so. Any other
        error is the job's own (`failed_after_shortening` tells the runner to hint at
        --steps all)."""
        try:
            job()
        except Exception as exc:
            shortened = (self.session.state.loop_ended or self.loaders.shortened
                         or bool(self.loop_ends and self.loop_ends.ended))
            if not shortened:
                # only `len(loader)` said less yet (a schedule sized from it): the job's error,
                # which the shortening may have caused
                self.failed_after_shortening = self.loaders.length_shortened
                raise
            if not _is_stop_iteration(exc):
                self.failed_after_shortening = True
                raise
            self.error_after_end = exc
            self.stop_reason = "error"
            self.session.state.stopped = True
            self.session.mark(STOP_MARK)
            raise StopJob from exc

    def failure_hint(self) -> str | None:
        """A line for the job's error message when it failed after the capture shortened it."""
        if not self.failed_after_shortening:
            return None
        return (
            "peakmem: the job failed after peakmem shortened its DataLoader epochs (3 full "
            "batches and the last, the training loop ended after a few steps); if that caused "
            "it, --steps all runs the job unchanged"
        )

    # -- state read by the recorder ------------------------------------------------------------
    def current_module(self) -> str | None:
        return self.modules.current()

    @contextmanager
    def backward(self) -> Iterator[None]:
        # What the forward made and is still alive when backward starts is what autograd saved
        # (a saved_tensors_hooks pack hook would tell exactly, but returning the tensor from it
        # makes reference cycles that delay every free until Python's garbage collection).
        self._check_pending_stop()
        self.session.reclassify_live(
            Category.ACTIVATION.value, phase=Phase.FORWARD.value, only_from=_STEP_TEMPS
        )
        state = self.session.state
        previous = state.phase
        state.phase = Phase.BACKWARD.value
        state.backward_passes += 1
        self._in_eval = False
        self._eval_depth = 0
        self.modules.in_backward, self.modules.backward_module = True, None
        self.session.mark("backward")
        try:
            yield
        finally:
            self.modules.in_backward = False
            if previous in _FORWARDS:
                # a closure's backward (`optimizer.step(closure)`) returns into its step
                previous = Phase.OPTIMIZER.value if self._in_steps else Phase.OTHER.value
            state.phase = previous
            self._classify_gradients(self.modules.roots.values())

    @contextmanager
    def outer_step(self) -> Iterator[None]:
        """The step of an optimizer that wraps a torch optimizer (DeepSpeed's ZeRO, bf16 and
        fp16 optimizers: capture.zero_partitions): what it does around the inner optimizer's
        step (gradient norms, overflow checks, casts between the master weights and the 16-bit
        ones) is part of the optimizer step too. The inner step's hooks count the step."""
        state = self.session.state
        previous = state.phase
        self._outer_steps += 1
        state.phase = Phase.OPTIMIZER.value
        try:
            yield
        finally:
            self._outer_steps -= 1
            if not self._outer_steps:
                state.phase = previous

    @contextmanager
    def outer_backward(self) -> Iterator[None]:
        """Gradient work a training engine does right after autograd's backward, outside it
        (DeepSpeed's backward epilogue: capture.zero_partitions): in the backward phase."""
        state = self.session.state
        previous = state.phase
        state.phase = Phase.BACKWARD.value
        try:
            yield
        finally:
            state.phase = previous

    # -- hooks ---------------------------------------------------------------------------------
    def _forward_pre(self, module: torch.nn.Module, args: Any) -> None:
        if self._aside_depth:
            self._aside_depth += 1  # a module inside a bookkeeping module's call
            return
        if self._eval_depth:
            self._eval_depth += 1  # a module inside an evaluation's top-level forward
            return
        state = self.session.state
        if _bookkeeping_module(module):
            # a metric's update (torchmetrics): between steps, in whatever phase it is called
            self._aside_depth, self._aside_phase = 1, state.phase
            state.phase = Phase.OTHER.value
            return
        if (state.phase == Phase.OTHER.value or self._in_eval) and _host_data_transform(module, args):
            return  # torchvision transforms in a dataset's __getitem__ / collate: not a forward
        if (state.phase == Phase.OPTIMIZER.value and self._in_steps and not self._outer_steps
                and torch.is_grad_enabled()):
            # a closure's forward inside the step (`optimizer.step(closure)`: LBFGS, SAM-style
            # optimizers): the training forward, whose saved tensors its backward reclassifies
            # as activations, not the optimizer's temporaries
            state.phase = Phase.FORWARD.value
            state.forward_calls += 1
            self.session.mark("forward")
            return
        if state.phase == Phase.OTHER.value:
            self._check_replaced_parameters()
        self._check_pending_stop()
        if state.phase == Phase.OTHER.value or self._in_eval:
            # a top-level forward without gradients after training is an evaluation (inner
            # no-grad calls, e.g. reentrant checkpointing, do not start one)
            # (a no-grad forward on the training batch the job holds is part of its step)
            evaluating = (state.backward_passes > 0 and not torch.is_grad_enabled()
                          and not self.loaders.inside_training_batch())
            if evaluating:
                if not self._in_eval:  # an evaluation starts: marked once, however many batches
                    self._in_eval = True
                    self.loaders.other_activity()
                    self._ran("eval")
                    self.session.mark(EVAL_MARK)
                    state.forward_calls += 1
                if module.training:
                    # a module left in training mode (no `model.eval()`): part of the training
                    # algorithm (RL rollouts and target networks, `with no_grad(): q_target(s)`
                    # feeding the next loss), so the forward phase, until the next backward
                    if state.phase == Phase.OTHER.value:
                        state.phase = Phase.FORWARD.value
                    return
                # `model.eval()`: each top-level call is in the eval phase until it returns
                # (`_forward_post`)
                state.phase = Phase.EVAL.value
                self._eval_depth = 1
                return
            elif self._in_eval:
                self._in_eval = False
                state.phase = Phase.OTHER.value
        if state.phase == Phase.OTHER.value:
            state.phase = Phase.FORWARD.value
            state.forward_calls += 1
            self.session.mark("forward")
            if self.loop_ends is not None:
                self.loop_ends.forward_started()

    def _forward_post(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        """An evaluation's top-level module returned: its phase ends. What follows (the
        predictions' argmax, metrics, `torch.cat` of outputs, a best-weights copy, the next
        batch moved to the device) is between steps (`other`), never the next training
        step's forward, whose backward would have taken it for activations."""
        if self._aside_depth:
            self._aside_depth -= 1
            if not self._aside_depth:
                self.session.state.phase = self._aside_phase
            return
        if not self._eval_depth:
            return
        self._eval_depth -= 1
        if not self._eval_depth and self.session.state.phase == Phase.EVAL.value:
            self.session.state.phase = Phase.OTHER.value

    def _classify_module_state(self, module: torch.nn.Module) -> None:
        session = self.session
        for sub in module.modules():
            owner = self.modules.name_of(sub)
            for param in sub.parameters(recurse=False):
                if owner is not None:
                    self._param_owner[id(param)] = owner
                session.classify(param, Category.PARAMETER.value, module=owner,
                                 only_from=_NOT_EMA)
            for buffer in sub.buffers(recurse=False):
                session.classify(buffer, Category.BUFFER.value, module=owner)

    def _classify_gradients(self, modules) -> None:
        updated, watched = set(), []
        for module in list(modules):
            for param in module.parameters():
                storage = _storage_id(param) if param.grad is not None else None
                if storage is not None:
                    updated.add(storage)
                    watched.append((weakref.ref(param), storage))
                self.session.classify(param.grad, Category.GRADIENT.value, only_from=_GRAD_SOURCES)
        self._updated_storages = updated
        self.weight_copies.add_trained(updated)
        self._watched = watched
        self._await_update = True

    def _check_replaced_parameters(self) -> None:
        """A training step without an optimizer that replaces parameters' data
        (`p.data = p.data - lr * p.grad`): seen when the next forward starts."""
        if not self._await_update or self._optimizers or not self._watched:
            return
        for ref, storage in self._watched:
            param = ref()
            if param is not None and _storage_id(param) not in (storage, None):
                self._manual_step()
                return

    def _step_pre(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self._optimizers.add(id(optimizer))
        self._await_update = False
        for group in optimizer.param_groups:
            for param in group["params"]:
                self.session.classify(param, Category.PARAMETER.value, only_from=_STEPPED_PARAMS)
                self.session.classify(
                    param.grad, Category.GRADIENT.value, only_from=_GRAD_SOURCES
                )
        self.session.state.phase = Phase.OPTIMIZER.value
        self._in_steps += 1
        self.session.mark("optimizer")

    def _step_post(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        session = self.session
        self._in_steps = max(0, self._in_steps - 1)
        for param, per_param in optimizer.state.items():
            owner = self._param_owner.get(id(param))
            # the tensors in each value: a tensor, or a list / dict of them (timm's Kron and
            # Shampoo-style optimizers keep one preconditioner per dimension in `state["Q"]`)
            for value in tensors_in(list(per_param.values())):
                # from the host too: Adafactor makes its factored moments with
                # `torch.zeros(shape).to(grad)`, a state loaded from a checkpoint is copied in
                session.classify(
                    value, Category.OPTIMIZER_STATE.value, module=owner, only_from=_STATE_SOURCES
                )
        for group in optimizer.param_groups:
            # hyper-parameters held as device tensors (`lr=torch.tensor(..., device="cuda")`
            # with `capturable=True`, which LR schedulers update in place: `fill_`)
            hyper = [value for key, value in group.items() if key != "params"]
            for value in tensors_in(hyper):
                session.classify(value, Category.OPTIMIZER_STATE.value, only_from=_STATE_SOURCES)
        session.state.phase = Phase.OPTIMIZER.value if self._outer_steps else Phase.OTHER.value
        self._await_update = False  # a closure's backward ran inside the step it fed
        self._step_taken(self._optimizer_key(optimizer), stop_now=True)

    def _optimizer_key(self, optimizer: torch.optim.Optimizer) -> Any:
        try:
            key = self._optimizer_keys.get(optimizer)
            if key is None:
                key = self._optimizer_keys[optimizer] = next(self._serials)
                weakref.finalize(optimizer, self._freed_keys.add, key)
        except TypeError:  # not weakly referenceable (a __slots__ optimizer): by id, as before
            return id(optimizer)
        return key

    def _watch_op(self, func: Any, args: tuple, out: Any) -> None:
        """A training step without an optimizer: the first in-place write to a parameter that
        received a gradient, after a backward, outside any optimizer step. (And weight copies
        kept in sync: capture.weight_copies; copies of weights between steps:
        capture.model_copies.)"""
        self.weight_copies.watch(func, args, out)
        self.model_copies.watch(func, args, out)
        if not self._await_update or not args or self._optimizers:
            return  # a job with an optimizer: its steps are the training steps
        name = getattr(func, "_opname", "")
        if not name.endswith("_") or self.session.state.phase == Phase.OPTIMIZER.value:
            return
        target = args[0]
        if isinstance(target, (list, tuple)):
            target = target[0] if target else None
        if not isinstance(target, torch.Tensor):
            return
        try:
            is_param = id(target.untyped_storage()) in self._updated_storages or (
                target.is_leaf and target.requires_grad and target.grad is not None
            )
        except (RuntimeError, NotImplementedError):  # a tensor without storage (sparse, ...)
            return
        if not is_param:
            return
        self._manual_step()

    def _manual_step(self) -> None:
        self._await_update = False
        self.session.state.manual_steps += 1
        self._step_taken(MANUAL, stop_now=False)

    # -- steps and the limit -------------------------------------------------------------------
    def _ran(self, phase: str) -> None:
        if not self.phases_ran or self.phases_ran[-1] != phase:
            self.phases_ran.append(phase)

    def limit(self) -> int:
        if self.stop_after_steps is not None:
            return int(self.stop_after_steps)
        measured = self.loaders.first_epoch_steps  # an accumulating epoch, as it ran
        return auto_step_limit(measured if measured else self.session.state.epoch_steps)

    def _step_taken(self, key: Any, *, stop_now: bool) -> None:
        session, state = self.session, self.session.state
        self._steps_by_optimizer[key] = self._steps_by_optimizer.get(key, 0) + 1
        state.steps = max(self._steps_by_optimizer.values())
        self._ran("training")
        session.synchronize_streams()  # record_stream holds end with the step (fake_streams)
        session.mark(f"step {self._steps_by_optimizer[key]}")
        self.growth.step_taken()
        # (under --steps all too: the epochs are followed, unchanged, so a forward on the batch
        # the job holds is known to be part of its step)
        feeding = self.loaders.step_taken()
        if feeding is not None and state.epoch_steps is None:
            state.epoch_steps = _epoch_steps(feeding)
        if self.run_all:
            return
        if self.stop_after_steps is None:
            self.loader_growth.step_fed(feeding)
        if self.repeater is not None:
            self._repeat_steady(key, feeding, stop_now=stop_now)
        # each loop's steps count from where the previous loop without a DataLoader ended (a
        # new optimizer's from 0; one that has not stepped since does not hold the count back)
        live = [n - self._loop_base.get(k, 0)
                for k, n in self._steps_by_optimizer.items() if k not in self._freed_keys]
        if self._loop_base:
            live = [n for n in live if n > 0]
        steps = min(live or self._steps_by_optimizer.values())
        if steps < self.limit():
            return
        if (
            stop_now
            and session.stream != DEVICE_STREAM
            and steps < self.limit() + MAX_SIDE_STREAM_STEPS
        ):
            return  # a side stream's steps (CUDA graph warm-up, capture): stop on the default one
        if self.stop_after_steps is None and feeding is not None:
            if not state.loop_ended and self.loader_growth.hold(feeding):
                return  # its live memory still grows: the loop goes on (capture.loader_growth)
            self._end_loop(feeding, steps)
            if (
                steps < self.limit() + MAX_STEPS_AFTER_END
                and self.loaders.bare_epochs < MAX_BARE_EPOCHS
            ):
                return
            self.stop_reason = "runaway"
        elif self._still_growing(steps) or self._end_own_loop(steps):
            return
        else:
            self.stop_reason = "limit"
            if self.loop_ends is not None:
                self._nothing_follows = self.loop_ends.loop_ends_code()
        self.stop_epoch = self.loaders.training_epochs or None
        if stop_now:
            self._stop()
        self._stop_pending = True  # inside the job's update loop: stop at its next forward

    def _still_growing(self, steps: int) -> bool:
        """The default policy at the limit of a loop without a DataLoader: one more step while
        the last one still raised the peak (capture.step_growth)."""
        if self.stop_after_steps is not None:
            return False
        if self.loop_ends is not None and self.loop_ends.pending:
            return False  # its end is planned: it finishes its iteration
        return self.growth.keep_going(steps)

    def _end_own_loop(self, steps: int) -> bool:
        """The default policy at the limit of a loop without a DataLoader: end that loop
        (capture.loop_ends) so the code after it runs; False when it cannot be (stop)."""
        ends, state = self.loop_ends, self.session.state
        if ends is None:
            return False
        if ends.pending:
            if state.steps - self._loop_planned < MAX_STEPS_AFTER_END:
                return True
            # the jump never came (the job took the frames' tracing away, e.g. a
            # `settrace(None)` imported before the plan): stopped as before
            ends.abandon(f"its loop did not come back to its head in {MAX_STEPS_AFTER_END} "
                         "steps (its line tracing was switched off)")
            return False
        if ends.ended and state.steps - self._first_loop_end >= MAX_STEPS_AFTER_END:
            ends.refused = (
                f"{state.steps - self._first_loop_end} steps were taken after the first loop "
                "was ended"
            )
            return False
        if ends.loop_ends_code():
            return False  # the script's last statement: stopping there misses nothing
        if not ends.plan(steps):
            return False
        self._loop_planned = state.steps
        if len(ends.ended) == 1:
            self._first_loop_end = state.steps
        self._loop_base = dict(self._steps_by_optimizer)
        self.growth.loop_ended()
        self.session.mark(END_MARK)
        return True

    def _repeat_steady(self, key: Any, feeding: LoaderIteration | None, *, stop_now: bool) -> None:
        """Step repetition (capture.step_repeat): only for one optimizer's steps, stopped at the
        explicit limit, with nothing but training traced; a DataLoader epoch may feed them one
        batch a step if its batches up to the limit are full ones (not its last)."""
        repeater, state = self.repeater, self.session.state
        assert repeater is not None
        eligible = (
            stop_now
            and key != MANUAL
            and len(self._steps_by_optimizer) == 1
            and (feeding is not None or not self.loaders.training_epochs)
            and not state.loop_ended
            and self.phases_ran == ["training"]
        )
        if not eligible:
            self.repeater = None  # a step that cannot be repeated: run every step
            return
        step, limit = self._steps_by_optimizer[key], self.limit()
        repeater.step_marked(step, id(feeding) if feeding is not None else 0)
        if step >= limit or not _full_batches_ahead(feeding, self.loaders.window, limit - step):
            return
        if repeater.repeat_to(limit):
            if feeding is not None:
                feeding.repeated_steps(limit - step)
            self._steps_by_optimizer[key] = limit
            state.steps = limit
            self.repeated_note = repeater.note()
            self.repeater = None

    # -- CUDA graphs (capture.fake_graphs) ---------------------------------------------------------
    def step_counts(self) -> dict[Any, int]:
        """Optimizer steps taken so far, by optimizer (a graph capture compares before/after)."""
        return dict(self._steps_by_optimizer)

    def replay_steps(self, keys: list[Any]) -> None:
        """A CUDA graph whose capture took the steps of these optimizers was replayed: each
        replay is a training step of theirs (and may end the job at the step limit)."""
        for key in keys:
            self._step_taken(key, stop_now=True)

    def _end_loop(self, feeding: LoaderIteration, steps: int) -> None:
        state = self.session.state
        feeding.end_after_this_batch()
        if not state.loop_ended:
            state.loop_ended = True
            self.end_steps = steps
            self.end_epoch = self.loaders.training_epochs
            self.end_can_skip = feeding.can_skip
            self.session.mark(END_MARK)

    def _check_pending_stop(self) -> None:
        if self._stop_pending:
            self._stop_pending = False
            self._stop()

    def _stop(self) -> None:
        self.session.state.stopped = True
        self.session.mark(STOP_MARK)
        raise StopJob

    def trace_meta(self) -> dict[str, Any]:
        """What ran, for the trace's header: the phases in order (training / eval), whether
        the job was stopped before its end or its training loop ended early."""
        state = self.session.state
        return {
            "phases_ran": list(self.phases_ran),
            "stopped": state.stopped,
            "loop_ended": state.loop_ended,
            "steps_policy": "all" if self.run_all else (self.stop_after_steps or "auto"),
        }

    # -- what the estimate says about it -------------------------------------------------------
    def notes(self) -> list[str]:
        state = self.session.state
        notes = []
        unit = _step_unit(state.steps, manual=state.manual_steps > 0 and not self._optimizers)
        if state.manual_steps and not self._optimizers:
            notes.append(
                "training recognised from in-place parameter updates after backward (no "
                "torch.optim optimizer): each update after a backward counts as a step"
            )
        if state.stopped and self.stop_reason == "runaway":
            notes.append(
                f"stopped after {state.steps} {unit}: the job kept training after peakmem "
                f"ended its training loop early at step {self.end_steps} (more epochs with "
                "nothing else between them, or a loop over a step count that re-iterates its "
                "DataLoader); what the script does after that — later epochs, evaluation, "
                "saving — did not run; --steps all runs it to the end"
            )
        elif state.stopped and self.stop_reason != "error":
            epoch = f"epoch {self.stop_epoch} of its DataLoader" if self.stop_epoch else None
            if self.stop_after_steps is not None:
                where = f"--steps {self.stop_after_steps}" + (f", in {epoch}" if epoch else "")
            elif epoch:
                where = epoch
            elif self._nothing_follows:
                where = ("its training loop does not iterate a DataLoader; it is the last "
                         "statement of the script, so nothing after it was missed")
            else:
                refused = self.loop_ends.refused if self.loop_ends is not None else None
                where = ("its training loop does not iterate a DataLoader and could not be "
                         f"ended early{': ' + refused if refused else ''}")
            if where.endswith("was missed"):
                notes.append(
                    f"stopped after {state.steps} {unit} ({where}); its remaining iterations "
                    "did not run; --steps all runs it to the end"
                )
            elif self.stop_after_steps is None and not epoch:
                notes.append(
                    f"stopped after {state.steps} {unit} ({where}); what the script does after "
                    "that — later loops, evaluation, sampling, saving — did not run: the "
                    "estimate may be low if that reaches a higher peak; --steps all runs it to "
                    "the end (and checks it)"
                )
            else:
                notes.append(
                    f"stopped after {state.steps} {unit} ({where}); what the script does after "
                    "that — later epochs, evaluation, saving — did not run; --steps all runs it "
                    "to the end"
                )
        elif state.loop_ended:
            manual = state.manual_steps > 0 and not self._optimizers
            how = (
                "its DataLoader skipped to the epoch's last batch and stopped, and each later "
                "epoch ran its last batch only" if self.end_can_skip else
                "its DataLoader stopped (it cannot skip to its last batch: an iterable dataset), "
                "and each later epoch ran its first batch only"
            )
            notes.append(
                f"training loop ended early after {self.end_steps} "
                f"{_step_unit(self.end_steps, manual=manual)} (in epoch {self.end_epoch}): {how} "
                f"({state.steps} steps in all); the code after the training loop ran; --steps "
                "all runs every batch"
            )
        if self.loop_ends is not None and self.loop_ends.ended:
            ended = self.loop_ends.ended
            where = ", ".join(f"{os.path.basename(end.filename)}:{end.line}" for end in ended[:4])
            more = f" and {len(ended) - 4} more" if len(ended) > 4 else ""
            notes.append(
                f"ended {len(ended)} training loop(s) without a DataLoader at the step limit "
                f"({where}{more}): each finished the iteration that took its last step, then "
                "the script went on after the loop (its remaining iterations did not run; the "
                "code after it — later loops, evaluation, sampling — ran); --steps all runs "
                "every iteration"
            )
        notes.extend(self.growth.notes(unit))
        notes.extend(self.loader_growth.notes(unit))
        window = self.loaders.window
        if window is not None and window > 1 and state.steps:
            notes.append(
                f"traced {state.steps} {unit} over {self.loaders.training_batches()} batches "
                f"(accumulation window {window})"
            )
        if state.steps == 1 and state.backward_passes > 1 and not self.run_all:
            notes.append(
                f"only 1 {unit} was traced over "
                f"{state.backward_passes} backward passes (gradient accumulation): the steady "
                "state (forward and backward with the optimizer state already allocated) was "
                "not seen; the job ended first"
            )
        if self.error_after_end is not None:
            notes.append(
                f"the job raised {type(self.error_after_end).__name__} after peakmem shortened "
                "its DataLoader epochs (a next() on an iterator that ended early); the estimate "
                "covers what ran until then (what follows did not run); --steps all runs the "
                "job unchanged"
            )
        if "eval" in self.phases_ran:
            notes.append(
                "an evaluation phase (forward passes without gradients) ran after training "
                "and was traced"
            )
        if state.backward_passes and not state.steps:
            notes.append(
                f"training (no parameter update seen): the job ran {state.backward_passes} "
                "backward pass(es) but no optimizer step and no in-place update of a parameter "
                "after a backward"
            )
        elif not state.backward_passes and not state.steps:
            notes.append(
                "the job never ran a backward pass: this is a forward/inference estimate"
            )
        if self.repeated_note is not None:
            notes.append(self.repeated_note)
        return notes


BOOKKEEPING_MODULES: tuple[tuple[str, str], ...] = (("torchmetrics.metric", "Metric"),)
"""(module, class) of nn.Modules whose calls are bookkeeping, not a forward: a torchmetrics
metric's `metric(preds, target)` keeps its state (counts, a CatMetric's predictions) on the
device between steps. Its call runs in the phase `other` (its blocks `other`), in a training
step (the training forward's phase resumes after it: its state is not the backward's
activations) or after an evaluation's forward (it does not start one)."""


def _bookkeeping_module(module: torch.nn.Module) -> bool:
    for module_name, class_name in BOOKKEEPING_MODULES:
        library = sys.modules.get(module_name)
        if library is not None:
            kind = getattr(library, class_name, None)
            if isinstance(kind, type) and isinstance(module, kind):
                return True
    return False


def _register_forward_post_hook(hook: Any) -> Any:
    """A global forward hook called even when the forward raises (an evaluation's phase ends
    with its top-level module however it returns)."""
    return torch.nn.modules.module.register_module_forward_hook(hook, always_call=True)


def _full_batches_ahead(feeding: LoaderIteration | None, window: int | None, steps: int) -> bool:
    """Whether `steps` more steps, one batch each, take full batches of the feeding epoch
    (never its last, which may be smaller, nor past its end); True without a DataLoader."""
    if feeding is None:
        return True
    if window != 1 or feeding.length is None or feeding.ending or feeding.skipped:
        return False
    return feeding.position + steps < feeding.length


def _is_stop_iteration(exc: BaseException) -> bool:
    """`StopIteration`, or a generator's `RuntimeError` made from one."""
    return isinstance(exc, StopIteration) or (
        isinstance(exc, RuntimeError) and isinstance(exc.__cause__, StopIteration)
    )


def _step_unit(steps: int, *, manual: bool) -> str:
    what = "parameter update" if manual else "optimizer step"
    return f"{what}{'' if steps == 1 else 's'}"


def _storage_id(tensor: torch.Tensor) -> int | None:
    """id() of the tensor's storage; None for one without a storage a hook may read (a
    torch.func transform's wrapper inside `vmap` / `grad`, a sparse tensor)."""
    try:
        return id(tensor.untyped_storage())
    except (RuntimeError, NotImplementedError):
        return None


def _host_data_transform(module: torch.nn.Module, args: Any) -> bool:
    """A module with no parameters or buffers called on host data only (torchvision's
    `Normalize`, `RandomResizedCrop`, ... are modules, run by a dataset's transform while the
    DataLoader fetches a batch): it touches no device memory, so it starts no forward phase and
    does not end an evaluation."""
    if next(module.parameters(), None) is not None or next(module.buffers(), None) is not None:
        return False
    return not any(is_meta(tensor) for tensor in tensors_in(args))
