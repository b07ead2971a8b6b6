"""op_costs._flops calls torch's shape-only FLOP formulas with the shapes it maps itself (no
pytree walk where the arguments are plain): the same FLOPs as torch's registered counter, for
every formula the capture meets (GEMMs, convolutions forward and backward, attention)."""

from __future__ import annotations

import collections

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils._pytree import tree_map
from torch.utils.flop_counter import get_shape

from peakmem.utilization import op_costs

aten = torch.ops.aten


def meta(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.empty(*shape, device="meta", dtype=dtype)


def _calls() -> list[tuple[str, object, tuple, dict]]:
    half = torch.float16
    q, k, v = meta(2, 4, 16, 8, dtype=half), meta(2, 4, 16, 8, dtype=half), meta(2, 4, 16, 8,
                                                                                 dtype=half)
    x, w = meta(2, 3, 9, 9), meta(6, 3, 3, 3)
    grad = aten.convolution.default(x, w, None, [2, 2], [1, 1], [1, 1], False, [0, 0], 1)
    return [
        ("mm", aten.mm.default, (meta(8, 16), meta(16, 4)), {}),
        ("addmm", aten.addmm.default, (meta(4), meta(8, 16), meta(16, 4)), {"beta": 1}),
        ("bmm", aten.bmm.default, (meta(3, 8, 16), meta(3, 16, 4)), {}),
        ("baddbmm", aten.baddbmm.default, (meta(3, 8, 4), meta(3, 8, 16), meta(3, 16, 4)), {}),
        ("conv", aten.convolution.default,
         (x, w, meta(6), [2, 2], [1, 1], [1, 1], False, [0, 0], 1), {}),
        ("conv-transposed", aten.convolution.default,
         (meta(2, 6, 5, 5), meta(6, 3, 3, 3), None, [2, 2], [1, 1], [1, 1], True, [1, 1], 1), {}),
        ("conv-grouped-1d", aten.convolution.default,
         (meta(2, 4, 17), meta(8, 2, 5), None, [1], [2], [1], False, [0], 2), {}),
        ("conv-backward", aten.convolution_backward.default,
         (grad, x, w, [6], [2, 2], [1, 1], [1, 1], False, [0, 0], 1, [True, True, True]), {}),
        ("conv-backward-input-only", aten.convolution_backward.default,
         (grad, x, w, None, [2, 2], [1, 1], [1, 1], False, [0, 0], 1, [True, False, False]), {}),
        ("sdpa-math-free", aten._scaled_dot_product_efficient_attention.default,
         (q, k, v, None, False), {}),
    ]


@pytest.mark.parametrize("name,func,args,kwargs", _calls(), ids=[c[0] for c in _calls()])
def test_flops_equal_the_registered_counter(name, func, args, kwargs):
    counter = op_costs.FLOP_REGISTRY[func.overloadpacket]
    assert counter.__code__ is op_costs._SHAPE_WRAPPER_CODE  # the fast path is taken
    out = func(*args, **kwargs)
    expected = float(counter(*args, **kwargs, out_val=out))
    assert expected > 0
    assert op_costs._flops(func, args, kwargs, out) == expected


def test_a_raw_formula_goes_through_the_counter(monkeypatch):
    """A formula registered raw (get_raw=True: it reads tensors, not shapes) is called as torch
    registered it."""
    seen = []

    def raw(*args, out_val=None, **kwargs):
        seen.append((args, out_val))
        return 7

    monkeypatch.setitem(op_costs.FLOP_REGISTRY, aten.mm, raw)
    a, b = meta(2, 3), meta(3, 4)
    assert op_costs._flops(aten.mm.default, (a, b), {}, None) == 7.0
    assert seen == [((a, b), None)]


Point = collections.namedtuple("Point", "x y")
_LEAVES = st.one_of(
    st.integers(-3, 3), st.floats(allow_nan=False), st.booleans(), st.none(),
    st.sampled_from([torch.float16, torch.device("meta"), torch.strided, "same"]),
    st.lists(st.integers(1, 4), max_size=3).map(lambda s: torch.empty(s, device="meta")),
    st.lists(st.integers(1, 4), max_size=3).map(torch.Size),
)
_VALUES = st.recursive(
    _LEAVES,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.lists(inner, max_size=3).map(tuple),
        st.dictionaries(st.sampled_from("abc"), inner, max_size=3),
        st.tuples(inner, inner).map(lambda pair: Point(*pair)),
        st.lists(inner, max_size=3).map(lambda items: collections.OrderedDict(enumerate(items))),
    ),
    max_leaves=8,
)


@settings(max_examples=200, deadline=None)
@given(_VALUES)
def test_the_shape_map_is_the_pytree_map(value):
    mapped, expected = op_costs._shapes(value), tree_map(get_shape, value)
    assert mapped == expected
    assert _types(mapped) == _types(expected)


def _types(value):
    """The value's container types all the way down (== alone takes a list for a tuple)."""
    if isinstance(value, (list, tuple)):
        return (type(value), [_types(item) for item in value])
    if isinstance(value, dict):
        return (type(value), [(name, _types(item)) for name, item in value.items()])
    return type(value)
