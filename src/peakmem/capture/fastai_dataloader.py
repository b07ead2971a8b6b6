"""fastai's own `DataLoader` (`fastai.data.load.DataLoader`, what `from fastai.vision.all import *`
names `DataLoader`, and the base of every `TfmdDL`) in the capture's epoch policy
(capture.dataloader), as torch's is.

fastai's loader is not a `torch.utils.data.DataLoader`: its `__iter__` draws the epoch's indices
(`get_idxs`), then batches them through torch's iterators over a stand-in `_FakeLoader` (an
iterable dataset, so torch's sampler cannot skip). Without this patch the capture could neither
shorten its epochs nor end them early: by default a `Learner.fit` stopped after its first
training steps, before the validation pass that ends each epoch (often the peak).

During a capture the patched `__iter__` runs the same epoch as fastai's (`randomize`,
`before_iter`, the indices, `after_batch` on each batch moved to the loader's device,
`after_iter`), loading in the main process (as the capture does for torch's loaders with
workers), over indices that can be skipped one batch at a time without loading their items;
`__len__` says the shortened epoch's length (the Learner's `n_iter`, the schedulers' progress).
With `--steps N` epochs are tracked, not shortened, and the job stops at the limit (as with torch's);
outside a capture and with `--steps all` fastai's methods run unchanged.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from peakmem.capture.dataloader import LoaderEpochs, LoaderKind
from peakmem.capture.library_patches import register_library_patch
from peakmem.capture.on_import import Undo, patch_on_import
from peakmem.capture.running_session import session_on_mode_stack

FASTAI_LOADER_MODULE = "fastai.data.load"


class BatchIndices:
    """The epoch's index iterator, read by fastai's `sample()`; its `next()` skips one batch's
    indices (what torch's `_sampler_iter` does for a map-style DataLoader)."""

    def __init__(self, indices: Iterator[Any], batch_size: int) -> None:
        self._indices = indices
        self._batch_size = batch_size

    def __iter__(self) -> BatchIndices:
        return self

    def __next__(self) -> list[Any]:
        skipped = list(itertools.islice(self._indices, self._batch_size))
        if not skipped:
            raise StopIteration
        return skipped


class FastaiEpoch:
    """One epoch of a fastai DataLoader, as its `__iter__` runs it, loaded in the main process."""

    def __init__(self, loader: Any, epochs: LoaderEpochs) -> None:
        from torch.utils.data.dataloader import _SingleProcessDataLoaderIter

        self._loader = loader
        loader.randomize()
        loader.before_iter()
        indices = iter(loader.get_idxs())
        # fastai's `sample()` enumerates the name-mangled `__idxs` lazily, batch by batch
        loader._DataLoader__idxs = indices
        self._sampler_iter = BatchIndices(indices, loader.bs or 1)
        self._num_yielded = 0
        stand_in = loader.fake_l
        workers = stand_in.num_workers
        if workers > 0:
            epochs.note_main_process(workers)
        stand_in.num_workers = 0
        try:
            self._batches = _SingleProcessDataLoaderIter(stand_in)
        finally:
            stand_in.num_workers = workers
        self._ended = False

    def __iter__(self) -> FastaiEpoch:
        return self

    def __next__(self) -> Any:
        from fastai.torch_core import to_device

        loader = self._loader
        try:
            batch = next(self._batches)
        except StopIteration:
            self.end_epoch()
            raise
        if loader.pin_memory and type(batch) is list:  # as fastai: pinning makes tuples lists
            batch = tuple(batch)
        if loader.device is not None:
            batch = to_device(batch, loader.device)
        self._num_yielded += 1
        return loader.after_batch(batch)

    def end_epoch(self) -> None:
        """fastai's end of an epoch (`after_iter`, the dataset iterator dropped), once."""
        if self._ended:
            return
        self._ended = True
        self._loader.after_iter()
        if hasattr(self._loader, "it"):
            del self._loader.it


def _map_style(loader: Any) -> bool:
    return bool(getattr(loader, "indexed", False)) and getattr(loader, "n", None) is not None


def _workers(loader: Any) -> int:
    workers = getattr(getattr(loader, "fake_l", None), "num_workers", 0)
    return workers if isinstance(workers, int) else 0


def _active_epochs(loader_class: type, kind: LoaderKind) -> LoaderEpochs | None:
    """The running capture's epoch tracker, reading fastai's loaders as `kind` (None: no
    capture, or one that does not track epochs)."""
    session = session_on_mode_stack()
    tracker = getattr(session, "phase_tracker", None)
    epochs = getattr(tracker, "loaders", None)
    if not isinstance(epochs, LoaderEpochs) or not epochs.active:
        return None
    epochs.adopt(loader_class, kind)
    return epochs


def _patch_loader(module: Any) -> Undo:
    loader_class = getattr(module, "DataLoader", None)
    own = vars(loader_class) if isinstance(loader_class, type) else {}
    original_iter, original_len = own.get("__iter__"), own.get("__len__")
    if original_iter is None or original_len is None:
        return lambda: None
    kind = LoaderKind(original_len, _map_style, _workers)

    def iterate(loader: Any) -> Any:
        epochs = _active_epochs(loader_class, kind)
        if epochs is None or not hasattr(loader, "fake_l"):
            return original_iter(loader)
        epochs.note_loader(loader, _workers(loader))
        return epochs.begin_epoch(loader, FastaiEpoch(loader, epochs))

    def length(loader: Any) -> int:
        value = original_len(loader)
        epochs = _active_epochs(loader_class, kind)
        return value if epochs is None else epochs.shortened_length(loader, value)

    loader_class.__iter__ = iterate
    loader_class.__len__ = length

    def undo() -> None:
        loader_class.__iter__ = original_iter
        loader_class.__len__ = original_len

    return undo


@register_library_patch("fastai_dataloader_epochs")
@contextmanager
def fastai_dataloader_epochs() -> Iterator[None]:
    with patch_on_import(FASTAI_LOADER_MODULE, _patch_loader):
        yield
