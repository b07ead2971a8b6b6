"""Each pytest process (an xdist worker, or pytest alone) moves what is alive at the end of a
test module out of the garbage collector's reach (`gc.freeze`, after one collection so that no
garbage is frozen), as peakmem's bench workers do (`peakmem.bench.runner.after_worker_row`).

A worker imports torch, transformers, DeepSpeed, Lightning, ... as the suite goes on: 0.5-2
million tracked objects that live as long as it. Every full collection (the interpreter's own,
every few thousand surviving allocations of a capture, and the `gc.collect()` of the tests and
of the libraries they run: accelerate's after each out-of-memory retry) walked all of them:
0.12-0.3 s of CPU each. Frozen, a collection walks only what was made since the last module
ended.

Only cyclic garbage is affected: objects freed by their reference count are freed as before. An
object alive at a module's end that later becomes part of a garbage cycle is not collected
(memory, not behaviour); module-scoped fixtures are torn down before the freeze."""

from __future__ import annotations

import gc

import pytest


def module_ends(item: pytest.Item, nextitem: pytest.Item | None) -> bool:
    """Whether `item` is the last test of its module in this process for now (its module's
    fixtures are torn down with it)."""
    return nextitem is None or nextitem.path != item.path


def freeze_what_is_alive() -> int:
    """One collection, then freeze what is left; the number of objects frozen in all."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
