"""Lightning's end-of-epoch validation in the epochs the capture ended early.

Once the default step policy ends the training loop, each later epoch yields its last batch only
(capture/dataloader.py). Lightning decides whether to validate after a batch from its own batch
count: with `check_val_every_n_epoch` set (the default) it validates when `(batch_idx + 1) %
val_check_batch == 0`, and the one batch a later epoch yields is its `batch_idx` 0. So from the
first later epoch on no validation ran, the epochs looked like bare repeats, and the capture
stopped the job after `MAX_BARE_EPOCHS` of them: whatever the job does at a later epoch (a
`BaseFinetuning` callback unfreezing the backbone at epoch 10, and the larger optimizer state
and gradients that follow) was never traced.

The patch: at the last batch of an epoch whose other batches the capture skipped (Lightning,
knowing the loader's length, says `is_last_batch` only after as many batches as that length),
Lightning's
check is made for the batch that one stands for, the epoch's last (`num_training_batches - 1`),
as the uncut run makes it. Validation by time (`val_check_interval` as a duration) and by a
global batch count (`check_val_every_n_epoch=None`) are left as they are."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

from peakmem.capture.library_patches import register_library_patch
from peakmem.capture.on_import import patch_on_import

EPOCH_LOOP_MODULES = ("lightning.pytorch.loops.training_epoch_loop",
                      "pytorch_lightning.loops.training_epoch_loop")


def _skipped_to_last_batch() -> bool:
    """Whether the running capture's latest training epoch skipped batches to reach the one the
    job holds, its last (Lightning, knowing the loader's length, counts the batches it fetched:
    neither its `batch_idx` nor its `is_last_batch` says so)."""
    from peakmem.capture.running_session import session_on_mode_stack

    session = session_on_mode_stack()
    tracker = getattr(session, "phase_tracker", None) if session is not None else None
    loaders = getattr(tracker, "loaders", None)
    last = getattr(loaders, "_last", None)
    return bool(last is not None and last.fed_training and last.skipped > 0
                and last.length is not None and last.position >= last.length)


def validates_at_epoch_end(loop: Any) -> bool | None:
    """Lightning's `_should_check_val_fx` answer for an epoch's last batch at its uncut
    position; None where the check does not count batches within the epoch."""
    trainer = loop.trainer
    if trainer.check_val_every_n_epoch is None or getattr(trainer, "_val_check_time_interval", None):
        return None
    every = trainer.val_check_batch
    batches = trainer.num_training_batches
    if every is None or every == float("inf") or batches == float("inf"):
        return None
    return int(batches) % int(every) == 0


def _wrap(module: Any):
    cls = getattr(module, "_TrainingEpochLoop", None)
    check = getattr(cls, "_should_check_val_fx", None) if cls is not None else None
    if check is None:
        return lambda: None

    def should_check_val(self, *args: Any, **kwargs: Any) -> bool:
        result = check(self, *args, **kwargs)
        if result or not _skipped_to_last_batch():
            return result
        if not self._should_check_val_epoch():
            return result
        at_end = validates_at_epoch_end(self)
        return result if at_end is None else at_end

    cls._should_check_val_fx = should_check_val

    def undo() -> None:
        cls._should_check_val_fx = check

    return undo


@register_library_patch("lightning_val_check")
@contextmanager
def lightning_val_check() -> Iterator[None]:
    with ExitStack() as stack:
        for name in EPOCH_LOOP_MODULES:
            stack.enter_context(patch_on_import(name, _wrap))
        yield
