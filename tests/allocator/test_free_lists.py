"""FreeList (allocator/free_lists.py) keeps SortedList's order and layout through its one-call
add / remove / delete_at, across sublist splits and joins and with a positional index built."""

from __future__ import annotations

from bisect import bisect_left

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sortedcontainers import SortedList

from peakmem.allocator.caching import free_key, key_fields
from peakmem.allocator.free_lists import FreeList

ops = st.lists(
    st.tuples(st.sampled_from(["add", "remove", "take", "index"]), st.integers(0, 400)),
    max_size=300,
)


def _check(free: FreeList, model: SortedList) -> None:
    assert list(free) == list(model)
    assert len(free) == len(model)
    free._check()  # SortedList's own invariants: sublist sizes, maxima, index


@settings(max_examples=200, deadline=None)
@given(ops, st.sampled_from([4, 8, 1000]))
def test_free_list_matches_sorted_list(operations, load):
    free, model = FreeList(), SortedList()
    free._reset(load)  # small loads: sublists split and join within a few hundred keys
    model._reset(load)
    for op, value in operations:
        if op == "add":
            free.add(value)
            model.add(value)
        elif op == "remove":
            if value in model:
                free.remove(value)
                model.remove(value)
            else:
                with pytest.raises(ValueError):
                    free.remove(value)
        elif op == "take" and len(free):  # get_free_block's path: the first key >= value
            pos = bisect_left(free._maxes, value)
            if pos < len(free._maxes):
                idx = bisect_left(free._lists[pos], value)
                taken = free._lists[pos][idx]
                free.delete_at(pos, idx)
                model.remove(taken)
        elif op == "index" and len(free):
            assert free[value % len(free)] == model[value % len(model)]  # builds the index
        _check(free, model)


@given(st.integers(-3, 2**40), st.integers(0, 2**63 - 1), st.integers(0, 2**64))
def test_free_key_orders_as_the_tuple_and_round_trips(stream, size, addr):
    key = free_key(stream, size, addr)
    assert key_fields(key) == (stream, size, addr)
    for other in [(stream, size, addr + 1), (stream, size + 1, 0), (stream + 1, 0, 0)]:
        assert (free_key(*other) > key) == (other > (stream, size, addr))
    if size:
        assert free_key(stream, size, 0) > free_key(stream, size - 1, 2**95)
