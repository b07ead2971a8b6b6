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


def test_alive_objects_are_frozen_and_garbage_cycles_collected_before():
    alive, garbage = _Node(), _Node()
    dead = weakref.ref(garbage)
    del garbage
    try:
        frozen = freeze_what_is_alive()
        assert dead() is None  # collected, not frozen
        assert frozen == gc.get_freeze_count() > 0
        later = [_Node()]  # made after the freeze: the next collection walks it
        gc.collect()
        assert gc.get_freeze_count() == frozen and gc.is_tracked(later[0])
        assert gc.is_tracked(alive)
    finally:
        gc.unfreeze()
