"""capture.arg_tensors.tensors_in finds exactly the tensors a pytree flatten finds, in its order."""

from __future__ import annotations

import collections
from dataclasses import dataclass

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils._pytree import register_dataclass, tree_flatten

from peakmem.capture.arg_tensors import tensors_in

Pair = collections.namedtuple("Pair", "first second")


class SizeLike(tuple):
    """A tuple subclass that is no pytree node: a leaf, whatever it holds."""


@dataclass
class Registered:
    payload: object


register_dataclass(Registered)


class Sub(torch.Tensor):
    pass


def _reference(value) -> list[torch.Tensor]:
    return [leaf for leaf in tree_flatten(value)[0] if isinstance(leaf, torch.Tensor)]


_leaves = st.one_of(
    st.integers(-3, 3), st.floats(allow_nan=False), st.booleans(), st.none(), st.text(max_size=3),
    st.sampled_from([torch.float32, torch.device("cpu"), torch.strided, torch.contiguous_format]),
    st.builds(lambda n: torch.zeros(n), st.integers(0, 3)),
    st.builds(lambda n: torch.nn.Parameter(torch.zeros(n)), st.integers(0, 3)),
    st.builds(lambda n: torch.zeros(n, device="meta"), st.integers(0, 3)),
    st.builds(lambda n: torch.zeros(n).as_subclass(Sub), st.integers(0, 3)),
    st.builds(lambda n: torch.Size([n, 2]), st.integers(0, 3)),
)


def _containers(children):
    return st.one_of(
        st.lists(children, max_size=4),
        st.lists(children, max_size=4).map(tuple),
        st.dictionaries(st.text(max_size=2), children, max_size=3),
        st.builds(Pair, children, children),
        st.dictionaries(st.text(max_size=2), children, max_size=3).map(collections.OrderedDict),
        st.lists(children, max_size=3).map(collections.deque),
        st.lists(children, max_size=3).map(SizeLike),
        st.builds(Registered, children),
    )


_trees = st.recursive(_leaves, _containers, max_leaves=30)


@settings(max_examples=100, deadline=None)  # worked cases below: an op call, a foreach call
@given(_trees)
def test_same_tensors_in_the_same_order_as_a_pytree_flatten(tree):
    found = tensors_in(tree)
    assert [id(t) for t in found] == [id(t) for t in _reference(tree)]


def test_an_op_call_and_a_foreach_call():
    params = [torch.zeros(2, device="meta") for _ in range(5)]
    grads = [torch.ones(2) for _ in range(5)]
    args = ((params, grads, [0.1] * 5), {"alpha": 2, "out": None})
    assert [id(t) for t in tensors_in(args)] == [id(t) for t in params + grads]
    assert tensors_in(((), {})) == []
    single = torch.zeros(1)
    assert tensors_in(single) == [single]
