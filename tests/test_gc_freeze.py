"""tests/gc_freeze.py: what is alive at a module's end is frozen; garbage is collected first."""

from __future__ import annotations

import gc
import weakref
from types import SimpleNamespace

from tests.gc_freeze import freeze_what_is_alive, module_ends


def test_the_last_test_of_a_module_ends_it():
    a, b = SimpleNamespace(path="tests/a.py"), SimpleNamespace(path="tests/b.py")
    assert module_ends(a, b) and module_ends(a, None)
    assert not module_ends(a, SimpleNamespace(path="tests/a.py"))


class _Node:
    def __init__(self):
        self.me = self  # a reference cycle: freed by the collector only


def _collectable(obj: object) -> bool:
    """Whether `obj` is in one of the collector's three generations (a frozen object is in the
    permanent one, which `gc.get_objects()` does not list)."""
    return any(o is obj for o in gc.get_objects())


def test_alive_objects_are_frozen_and_garbage_cycles_collected_before():
    alive, garbage = _Node(), _Node()
    dead = weakref.ref(garbage)
    del garbage
    try:
        frozen = freeze_what_is_alive()
        assert dead() is None  # collected, not frozen
        # Frozen objects freed later by their reference count (other threads of the process
        # run on) leave the permanent generation: the count can only fall, never grow.
        assert 0 < gc.get_freeze_count() <= frozen
        assert not _collectable(alive)  # frozen
        later = [_Node()]  # made after the freeze: the next collection walks it
        gc.collect()
        assert gc.get_freeze_count() <= frozen
        assert _collectable(later[0]) and not _collectable(alive)
        assert gc.is_tracked(alive)
    finally:
        gc.unfreeze()
    assert _collectable(alive)
