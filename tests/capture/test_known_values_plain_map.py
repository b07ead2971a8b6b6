"""known_values' plain walk of an op's arguments (`_fast_tree_map`, `_fast_leaves`) gives what
pytree's `tree_map` / `tree_flatten` give: the same structure, the same leaves in the same
order, the same calls of the function, the same exception where it raises."""

from __future__ import annotations

import collections

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils._pytree import tree_flatten, tree_map

from peakmem.capture.known_values import _fast_leaves, _fast_tree_map

Pair = collections.namedtuple("Pair", "a b")

_leaves = st.one_of(
    st.integers(-3, 3), st.floats(allow_nan=False, width=16), st.none(), st.booleans(),
    st.sampled_from(["cpu", "cuda", torch.float16, torch.device("cpu")]),
    st.builds(lambda n: torch.arange(n), st.integers(0, 3)),
    st.builds(lambda n: torch.nn.Parameter(torch.ones(n)), st.integers(0, 2)),
)
_trees = st.recursive(
    _leaves,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.lists(inner, max_size=3).map(tuple),
        st.dictionaries(st.sampled_from(["x", "dim", "out", "alpha"]), inner, max_size=3),
        st.builds(Pair, inner, inner),
        st.lists(st.integers(0, 4), max_size=3).map(torch.Size),
        st.dictionaries(st.sampled_from(["p", "q"]), inner, max_size=2)
        .map(collections.OrderedDict),
    ),
    max_leaves=8,
)


def _same(a, b) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, torch.Tensor):
        return a is b
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b or a is b


@settings(max_examples=150, deadline=None)
@given(_trees)
def test_the_plain_walk_is_tree_map(tree):
    seen_fast, seen_pytree = [], []

    def tag(seen):
        def fn(leaf):
            seen.append(leaf)
            return ("mapped", leaf) if not isinstance(leaf, torch.Tensor) else leaf + 0
        return fn

    fast = _fast_tree_map(tag(seen_fast), tree)
    plain = tree_map(tag(seen_pytree), tree)
    assert tree_flatten(fast)[1] == tree_flatten(plain)[1]  # the same structure
    assert len(seen_fast) == len(seen_pytree)
    assert all(a is b for a, b in zip(seen_fast, seen_pytree, strict=True))  # same calls, order
    assert _same(_fast_leaves(tree), tree_flatten(tree)[0])


@settings(max_examples=60, deadline=None)
@given(_trees, st.integers(0, 7))
def test_an_exception_stops_both_at_the_same_leaf(tree, at):
    class Stop(Exception):
        pass

    def stopping(seen):
        def fn(leaf):
            seen.append(leaf)
            if len(seen) > at:
                raise Stop
            return leaf
        return fn

    outcomes = []
    for walk in (_fast_tree_map, tree_map):
        seen = []
        try:
            walk(stopping(seen), tree)
            outcomes.append(("done", len(seen)))
        except Stop:
            outcomes.append(("stopped", len(seen)))
    fast, plain = outcomes
    assert fast[0] == plain[0]
    if fast[0] == "done":
        assert fast == plain
