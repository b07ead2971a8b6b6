"""The job's DataLoader epochs during a capture: shortened where that is exact, ended early once
training has run long enough, so that what the script does after its training loop (evaluation,
`predict`, generation, saving) still runs and is traced.

Every iteration of a `torch.utils.data.DataLoader` goes through `LoaderEpochs`:
- shortening (the default step policy): a map-style loader's epoch longer than
  STEADY_BATCHES + 1 batches yields its first STEADY_BATCHES batches, then its last (often smaller)
  batch; the batch sampler skips the indices between (no data is loaded for them), and
  `len(loader)` says STEADY_BATCHES + 1, so code that counts batches sees a consistent epoch. The batches
  skipped repeat the allocations of those traced when every batch has the same shapes; a loader
  whose traced batches differ in shape is noted (the skipped ones may be larger). With gradient
  accumulation the epoch yields whole windows until it has fed two optimizer steps
  (capture.accumulation), so the steady state (a step with the optimizer state live) is traced;
- ending: once the step limit is reached, an iteration that fed a training step skips to its
  epoch's last batch after that step, then ends (StopIteration) — the training loop ends the way
  it would at the end of its data; later epochs over a dataset that fed training, iterated with
  gradients enabled, yield their last batch only (an iteration under `no_grad` is an
  evaluation: shortened, not ended);
- worker processes: a loader with `num_workers > 0` loads its batches in the main process
  (GPU memory does not depend on where the host loads data, and only a main-process sampler can
  skip batches);
- an epoch too long to skip through (skipping draws every skipped batch's indices from the job's
  sampler: more than MAX_SKIPPED_SAMPLES of them) is neither shortened nor skipped to its last
  batch: when the loop ends, it ends at the batch it was on.

Other loader classes (fastai's `DataLoader`: capture.fastai_dataloader) take part through
`LoaderEpochs.adopt` (how the capture reads their length and whether they are map-style) and
`LoaderEpochs.begin_epoch` / `shortened_length`, called from their own patched `__iter__` and
`__len__`; their epoch iterator offers what the skipping reads of torch's: `_sampler_iter` (one
`next()` skips one batch's indices) and `_num_yielded`, and may offer `end_epoch()` (called once
when the epoch ends, early or not).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._pytree import tree_flatten

from peakmem.capture.accumulation import MAX_WAIT_BATCHES, STEADY_STEPS, window_in_callers
from peakmem.capture.session import CaptureSession

STEADY_BATCHES = 3

MAX_SKIPPED_SAMPLES = 10_000_000
"""The most sample indices a skip may draw from a sampler (one `next()` of the batch sampler per
skipped batch, a few microseconds per index). karpathy/makemore's `InfiniteDataLoader` stands an
endless loader on `RandomSampler(dataset, replacement=True, num_samples=int(1e10))`: its epoch
of 1e10 / batch_size batches cannot be skipped through (drawing them took hours)."""


def skip_affordable(loader: Any, length: int) -> bool:
    """Whether skipping to the last of `length` batches draws at most MAX_SKIPPED_SAMPLES
    indices (a loader without an integer batch size counts one index a batch)."""
    per_batch = getattr(loader, "batch_size", None)
    per_batch = per_batch if isinstance(per_batch, int) and per_batch > 0 else 1
    return (length - 1) * per_batch <= MAX_SKIPPED_SAMPLES


@dataclass(frozen=True)
class LoaderKind:
    """How the capture reads one class of data loader."""

    length: Callable[[Any], int]
    """The class's own `__len__` (raising TypeError: the loader has no length)."""
    map_style: Callable[[Any], bool]
    """Whether the loader draws its batches from dataset indices (an epoch can skip batches)."""
    workers: Callable[[Any], int]
    """The worker processes the job asked the loader for."""


def _torch_map_style(loader: Any) -> bool:
    from torch.utils.data.dataloader import _DatasetKind

    return getattr(loader, "_dataset_kind", None) == _DatasetKind.Map


def _torch_workers(loader: Any) -> int:
    workers = getattr(loader, "num_workers", 0)
    return workers if isinstance(workers, int) else 0


def _shapes(batch: Any) -> tuple:
    """The shapes of the tensors in a batch, in order (its shape signature)."""
    flat, _ = tree_flatten(batch)
    return tuple(tuple(t.shape) for t in flat if isinstance(t, torch.Tensor))


class LoaderIteration:
    """One epoch of one DataLoader, as the job iterates it."""

    def __init__(self, loaders: LoaderEpochs, loader: Any, iterator: Any) -> None:
        self._loaders = loaders
        self._iterator = iterator
        self.loader = loader
        self.length = loaders.true_length(loader)
        self.can_skip = (
            self.length is not None
            and loaders.kind_of(loader).map_style(loader)
            and hasattr(iterator, "_sampler_iter")
            and loaders.affordable_skip(loader, self.length)
        )
        self.window = loaders.window_of(loader)
        """The accumulation window a framework declared for this loader (None: not known)."""
        self.steady_batches = loaders.steady_batches(self.window)
        self.shorten = self.can_skip and loaders._shortens(loader, self.length, self.window)
        self.backward_at_start = loaders.session.state.backward_passes
        self.discarded_at_start = loaders.session.state.grads_discarded
        self.steps_fed = 0
        self.step_positions: list[int] = []  # batches yielded when each step it fed ran
        self.waited = False  # yielded more full batches than steady_batches, waiting for steps
        self._short_done = False
        self.position = 0  # index in the epoch of the next batch
        self.yielded = 0
        self.ending = False  # end after the batch the job holds: skip to the last, then stop
        self.finished = False
        self.steps_since_yield_at_finish: int | None = None
        """`LoaderEpochs`' steps since its latest yield when this epoch finished."""
        self.skipped = 0
        self.fed_training = False
        self.shapes: set[tuple] = set()
        self.grad_enabled = torch.is_grad_enabled()
        """Iterated with gradients enabled (a training loop's; an evaluation's runs under no_grad)."""

    @property
    def traced_length(self) -> int | None:
        """Batches this epoch yields when it is not ended early."""
        if self.shorten:
            return self.steady_batches + 1
        return self.length

    def __iter__(self) -> LoaderIteration:
        return self

    def __len__(self) -> int:
        return len(self.loader)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._iterator, name)

    def end_after_this_batch(self) -> None:
        self.ending = True

    def _skip_to(self, index: int) -> None:
        count = index - self.position
        if count <= 0:
            return
        for _ in range(count):
            next(self._iterator._sampler_iter, None)
        self._iterator._num_yielded += count
        self.position = index
        self.skipped += count
        self._loaders.shortened = True

    def __next__(self) -> Any:
        if self.finished:
            raise StopIteration
        last = None if self.length is None else self.length - 1
        if self.ending:
            if not self.can_skip or last is None:
                if self.yielded:  # cannot skip: end here (an epoch keeps at least one batch)
                    self._finish()
            elif self.position > last:
                self._finish()
            else:
                self._skip_to(last)
        elif (
            self.shorten
            and not self._short_done
            and last is not None
            and self.steady_batches <= self.position < last
        ):
            if self._awaiting_steps():
                self.waited = True
            else:
                self._short_done = True
                self._skip_to(last)
                self._loaders.shortened_epoch(self)
        try:
            batch = next(self._iterator)
        except StopIteration:
            self._finish()
        if len(self.shapes) < 8 and self.position != last:  # the last batch may be smaller
            self.shapes.add(_shapes(batch))
        self.position += 1
        self.yielded += 1
        self._loaders.yielded(self)
        return batch

    def _awaiting_steps(self) -> bool:
        """A training epoch (a backward ran during it) that has not fed STEADY_STEPS optimizer
        steps yet, in a loop that counts its accumulation window itself and has not thrown a
        backward's gradients away during it (capture.discarded_grads): keep yielding full
        batches (MAX_WAIT_BATCHES at most). A window a framework declared is already in
        `steady_batches` (its `len(loader)` says so): no wait."""
        return (
            self.window is None
            and self.steps_fed < STEADY_STEPS
            and self.position < MAX_WAIT_BATCHES
            and self._loaders.session.state.backward_passes > self.backward_at_start
            # gradients cleared before any step used them: not an accumulation window
            and self._loaders.session.state.grads_discarded == self.discarded_at_start
        )

    @property
    def fetches_ahead(self) -> bool:
        """Read one batch ahead of the job (accelerate's `DataLoaderShard` yields a batch once it
        has fetched the next one): the epoch's first step came one batch after its window, not
        at it (a loop reading batch by batch steps at batch `window`); an epoch without a step
        yet, when an earlier epoch of its loader did."""
        # the batches steps came at, each once (two optimizers stepping on one batch, a GAN's
        # or seq2seq's encoder and decoder, record its position twice)
        positions = list(dict.fromkeys(self.step_positions))
        if not positions:  # no step yet (a later epoch of an ended loop: its last batch only)
            return id(self.loader) in self._loaders.ahead_loaders
        if len(positions) >= 2:
            window = positions[1] - positions[0]
        else:  # one step so far: the window a framework declared, or an earlier epoch's
            window = self.window or self._loaders.window or 1
        return positions[0] == window + 1

    def fed_step(self) -> None:
        self.steps_fed += 1
        self.step_positions.append(self.yielded)

    def repeated_steps(self, count: int) -> None:
        """`count` more steps, one batch each, were repeated (capture.step_repeat) rather than
        run: count their batches as yielded (the job is stopped: nothing more is fetched)."""
        for _ in range(count):
            self.position += 1
            self.yielded += 1
            self.fed_step()

    def _finish(self) -> None:
        self.finished = True
        end_epoch = getattr(self._iterator, "end_epoch", None)
        if callable(end_epoch):
            end_epoch()
        self._loaders.finished(self)
        raise StopIteration


def _note_loader(session: CaptureSession, loader: Any, workers: int) -> None:
    """The job's DataLoader workers and pinning, for the utilization model (trace metadata)."""
    meta = session.trace.meta
    if isinstance(workers, int) and workers > meta.get("loader_workers", 0):
        meta["loader_workers"] = workers
    if getattr(loader, "pin_memory", False) is True:
        meta["loader_pin_memory"] = True


class LoaderEpochs:
    """Patches `DataLoader.__iter__` for the capture; tells the phase tracker which epoch fed
    the latest training step."""

    def __init__(self, session: CaptureSession, *, shorten: bool) -> None:
        self.session = session
        self.shorten = shorten
        self.bare_epochs = 0
        """Later epochs of the ended loop in a row with nothing else between them."""
        self._activity = True  # something besides training since the last later epoch began
        self._last: LoaderIteration | None = None  # the epoch that yielded last
        self._steps_since_yield = 2
        self.training_epochs = 0
        """Epochs that fed a training step."""
        self._noted: set[tuple] = set()
        self._workers_noted = False
        self.shortened = False
        """An epoch skipped batches (the job may notice: a count of batches, a `next()`)."""
        self.length_shortened = False
        """`len(loader)` has said a shortened epoch's length (less than the loader's own)."""
        self._trained: set[int] = set()  # ids of the datasets whose loaders fed training
        self.ahead_loaders: set[int] = set()
        """ids of the loaders whose epochs were read one batch ahead (`fetches_ahead`)."""
        self._windows: dict[int, int] = {}  # id(loader) -> the window a framework declared
        self._training_iterations: list[LoaderIteration] = []
        self._current: dict[int, weakref.ref] = {}  # id(loader) -> its latest epoch (weakly)
        self.window: int | None = None
        """The accumulation window seen: batches between two steps in one epoch."""
        self.first_epoch_steps: int | None = None
        """Steps fed by the first training epoch that waited for its steps, when it finished."""
        self.active = False
        """Inside `patched()`: epochs are tracked (and shortened when `shorten`)."""
        self._kinds: dict[type, LoaderKind] = {}

    # -- read by the phase tracker -------------------------------------------------------------
    def step_taken(self) -> LoaderIteration | None:
        """A training step ran: the epoch that fed it (None: no DataLoader did). That is the
        epoch that yielded last, if it yielded since the step before this one (loaders that
        fetch one batch ahead, as accelerate's do, yield a step early)."""
        feeding = self._last if self._steps_since_yield <= 1 else None
        self._steps_since_yield += 1
        if feeding is not None and not feeding.fed_training:
            feeding.fed_training = True
            self._trained.add(id(getattr(feeding.loader, "dataset", feeding.loader)))
            self.training_epochs += 1
        if feeding is not None:
            if feeding.steps_fed == 0:
                self._training_iterations.append(feeding)
            feeding.fed_step()
            if feeding.steps_fed == 1 and feeding.fetches_ahead:
                self.ahead_loaders.add(id(feeding.loader))
            positions = feeding.step_positions
            if self.window is None and len(positions) >= 2:
                self.window = positions[1] - positions[0]
        return feeding

    def inside_training_batch(self) -> bool:
        """Whether the job holds a training batch it has not stepped on yet: the epoch that
        yielded last, iterated with gradients enabled, yielded since the latest step, and it or
        its dataset fed training (or, read one batch ahead, the epoch met its end fetching past
        the batch the job holds, with no step since). A no-grad forward then is part of that
        training step (a distillation teacher's, a momentum target's), not an evaluation."""
        last = self._last
        if last is None or not last.grad_enabled:
            return False
        if last.finished:
            # a loader reading ahead met the epoch's end fetching past its last batch, which
            # the job holds until its next step (a plain loop's epoch ends after its last step)
            if not last.fetches_ahead or self._steps_since_yield != last.steps_since_yield_at_finish:
                return False
        elif self._steps_since_yield != 0:
            return False
        dataset = getattr(last.loader, "dataset", last.loader)
        return last.fed_training or id(dataset) in self._trained

    # -- accumulation windows ------------------------------------------------------------------
    def window_of(self, loader: Any) -> int | None:
        """The accumulation window a framework declared for `loader` (seen when it asked for
        the loader's length or iterated it), or None."""
        window = self._windows.get(id(loader))
        if window is None:
            window = window_in_callers(skip=3)
            if window is not None:
                self._windows[id(loader)] = window
        return window

    def training_batches(self) -> int:
        """Batches yielded by the epochs that fed training."""
        return sum(iteration.yielded for iteration in self._training_iterations)

    @staticmethod
    def steady_batches(window: int | None) -> int:
        """Full batches a shortened epoch yields: STEADY_BATCHES, or STEADY_STEPS whole windows
        when a framework declared a larger window."""
        return max(STEADY_BATCHES, STEADY_STEPS * (window or 1))

    # -- called by the iterations --------------------------------------------------------------
    def other_activity(self) -> None:
        """An evaluation (or another loader) ran: the epochs around it are not bare repeats."""
        self._activity = True

    def _later_epoch(self) -> None:
        self.bare_epochs = 0 if self._activity else self.bare_epochs + 1
        self._activity = False

    def yielded(self, iteration: LoaderIteration) -> None:
        if not iteration.ending and not iteration.fed_training:
            self._activity = True
        self._last = iteration
        self._steps_since_yield = 0

    def finished(self, iteration: LoaderIteration) -> None:
        iteration.steps_since_yield_at_finish = self._steps_since_yield
        if iteration.fed_training and iteration.waited and self.first_epoch_steps is None:
            self.first_epoch_steps = iteration.steps_fed
        self._note(iteration)

    def shortened_epoch(self, iteration: LoaderIteration) -> None:
        self._note_once(
            ("short", iteration.length),
            f"DataLoader epoch of {iteration.length} batches: traced {iteration.yielded} "
            f"full batches, then its last batch (the {iteration.skipped} between repeat "
            "the same allocations when every batch has the same shapes)",
        )

    def _note(self, iteration: LoaderIteration) -> None:
        if iteration.skipped and len(iteration.shapes) > 1:
            self._note_once(
                ("varied", id(iteration.loader)),
                f"a DataLoader's batches vary in shape ({len(iteration.shapes)} different "
                f"shapes among the first {iteration.yielded - 1} traced): the {iteration.skipped} "
                "batches skipped may be larger than those traced; --steps all runs every batch",
            )

    def _note_once(self, key: tuple, text: str) -> None:
        if key not in self._noted:
            self._noted.add(key)
            self.session.notes.append(text)

    def _waited_length(self, loader: Any) -> int:
        """The length of `loader`'s current epoch when it yielded full batches past the
        shortened length, waiting for its accumulation steps: at least one batch more than it
        yielded until its last has come, so `step / len(loader)` stays below 1 (MAE's
        per-iteration lr schedule divides by the cosine phase's length once it reaches 1)."""
        ref = self._current.get(id(loader))
        iteration = ref() if ref is not None else None
        if iteration is None or iteration.loader is not loader or iteration.finished or not iteration.waited:
            return 0
        return iteration.yielded + (0 if iteration._short_done else 1)

    # -- loader classes --------------------------------------------------------------------------
    def adopt(self, loader_class: type, kind: LoaderKind) -> None:
        """Read loaders of `loader_class` (and its subclasses) as `kind` says."""
        self._kinds[loader_class] = kind

    def kind_of(self, loader: Any) -> LoaderKind:
        for cls in type(loader).__mro__:
            kind = self._kinds.get(cls)
            if kind is not None:
                return kind
        return self._kinds[torch.utils.data.DataLoader]

    # -- the patch -----------------------------------------------------------------------------
    def note_main_process(self, workers: int) -> None:
        """A loader with worker processes loads its batches in the main process (noted once)."""
        if not self._workers_noted:
            self._workers_noted = True
            self.session.notes.append(
                f"a DataLoader with num_workers={workers} loaded its batches in the main process "
                "during the capture (GPU memory does not depend on it)"
            )

    def note_loader(self, loader: Any, workers: int) -> None:
        """The loader's workers and pinning, for the utilization model."""
        _note_loader(self.session, loader, workers)

    def _main_process_iterator(self, loader: Any) -> Any:
        """A single-process iterator for a loader with worker processes."""
        from torch.utils.data.dataloader import _SingleProcessDataLoaderIter

        workers, timeout = loader.num_workers, loader.timeout
        object.__setattr__(loader, "num_workers", 0)
        object.__setattr__(loader, "timeout", 0)
        try:
            iterator = _SingleProcessDataLoaderIter(loader)
        finally:
            object.__setattr__(loader, "num_workers", workers)
            object.__setattr__(loader, "timeout", timeout)
        self.note_main_process(workers)
        return iterator

    def true_length(self, loader: Any) -> int | None:
        """The loader's length as torch computes it (None: an IterableDataset without one)."""
        try:
            return self.kind_of(loader).length(loader)
        except TypeError:
            return None

    def _shortens(self, loader: Any, length: int | None, window: int | None) -> bool:
        return (
            self.shorten
            and length is not None
            and length > self.steady_batches(window) + 1
            and self.kind_of(loader).map_style(loader)
            and self.affordable_skip(loader, length)
        )

    def affordable_skip(self, loader: Any, length: int) -> bool:
        """`skip_affordable`, with a note (once per length) when it is not."""
        if skip_affordable(loader, length):
            return True
        self._note_once(
            ("unskippable", length),
            f"a DataLoader epoch of {length} batches is too long to skip through (its sampler "
            "draws every skipped batch's indices): not shortened; an ended training loop "
            "stops at the batch it is on",
        )
        return False

    def shortened_length(self, loader: Any, value: int) -> int:
        """`len(loader)` during the capture: its true length `value`, or the shortened epoch's."""
        if not self.shorten or value <= STEADY_BATCHES + 1:
            return value
        window = self.window_of(loader)
        if not self._shortens(loader, value, window):
            return value
        length = max(self.steady_batches(window) + 1, self._waited_length(loader))
        if length < value:
            # the job may size things from it (a schedule's total steps) before any epoch is
            # shortened: an error after this is one the shortening may have caused
            self.length_shortened = True
        return length

    def begin_epoch(self, loader: Any, iterator: Any) -> LoaderIteration:
        """An epoch of `loader` begins: the LoaderIteration the job iterates, over `iterator`."""
        if isinstance(iterator, LoaderIteration):  # a subclass calling super().__iter__
            return iterator
        iteration = LoaderIteration(self, loader, iterator)
        self._current[id(loader)] = weakref.ref(iteration)
        if (
            self.session.state.loop_ended
            and id(getattr(loader, "dataset", loader)) in self._trained
            and torch.is_grad_enabled()
        ):
            iteration.end_after_this_batch()  # a later epoch of the ended loop: its last batch
            self._later_epoch()
        return iteration

    @contextmanager
    def patched(self) -> Iterator[LoaderEpochs]:
        """`DataLoader.__iter__` yields LoaderIterations; with shortening, `len(loader)` is the
        shortened epoch's length, so code that counts batches (Lightning's validation check,
        HF Trainer's steps per epoch, `if i == len(loader) - 1`) sees a consistent epoch."""
        loader_class = torch.utils.data.DataLoader
        original_iter = loader_class.__iter__
        original_len = loader_class.__len__
        self.adopt(loader_class, LoaderKind(original_len, _torch_map_style, _torch_workers))

        def length(loader: Any) -> int:
            return self.shortened_length(loader, original_len(loader))

        def iterate(loader: Any) -> Any:
            iterator = None
            self.note_loader(loader, _torch_workers(loader))
            if getattr(loader, "num_workers", 0) > 0:
                try:
                    iterator = self._main_process_iterator(loader)
                except Exception:  # an unusual loader: let it run as it is
                    iterator = None
            if iterator is None:
                iterator = original_iter(loader)
            return self.begin_epoch(loader, iterator)

        loader_class.__iter__ = iterate
        loader_class.__len__ = length
        self.active = True
        try:
            yield self
        finally:
            self.active = False
            loader_class.__iter__ = original_iter
            loader_class.__len__ = original_len
