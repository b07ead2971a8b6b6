"""The meta cache's key, read the cheaper way (`_tensor_key`: the conjugate bit only for complex
dtypes; `_key`: an int-only list found by `frozenset.issuperset`; `_kwargs_key`: plain keyword
values keyed inline), is the key read the plain way (`_tensor_key_plain`, `all(type(item) is
int ...)`, `_key` of the (name, value) pairs), and stays untracked by the collector."""

import gc

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from peakmem.capture import meta_cache
from peakmem.capture.meta_cache import _key, _kwargs_key, _tensor_key, _tensor_key_plain

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.bool,
          torch.complex64, torch.complex128]


def plain_key(values, storages, blind=False):
    """meta_cache._key as it read before: every tensor attribute, `all()` over the items."""
    parts = []
    for value in values:
        kind = type(value)
        if kind in meta_cache._PLAIN_TENSORS:
            parts.append(_tensor_key_plain(value, storages))
        elif kind is tuple or kind is list:
            if all(type(item) is int for item in value):
                parts.append((kind, tuple(value)))
            else:
                parts.append((kind, plain_key(value, storages, blind), None))
        elif blind and kind is float:
            parts.append(meta_cache._BLIND_FLOAT)
        elif kind in meta_cache._PLAIN_VALUES:
            parts.append((kind, value))
        else:
            raise meta_cache._NotCacheable
    return tuple(parts)


@st.composite
def meta_tensors(draw):
    dtype = draw(st.sampled_from(DTYPES))
    shape = draw(st.lists(st.integers(0, 4), min_size=0, max_size=3))
    tensor = torch.empty(shape, dtype=dtype, device="meta",
                         requires_grad=dtype.is_floating_point and draw(st.booleans()))
    view = draw(st.sampled_from(["none", "t", "neg", "conj", "slice"]))
    with torch.no_grad():
        if view == "t" and tensor.dim() >= 2:
            tensor = tensor.transpose(0, 1)
        elif view == "neg":
            tensor = torch._neg_view(tensor)  # the negative bit: any dtype
        elif view == "conj" and dtype.is_complex:
            tensor = tensor.conj()  # the conjugate bit: complex dtypes only
        elif view == "slice" and tensor.dim() >= 1 and tensor.shape[0] > 1:
            tensor = tensor[1:]
    return tensor


scalars = st.one_of(st.integers(-3, 3), st.floats(allow_nan=False), st.booleans(), st.none(),
                    st.sampled_from(DTYPES), st.just("mean"))
int_lists = st.lists(st.integers(-2, 9), max_size=4)


@st.composite
def arguments(draw):
    pool = draw(st.lists(meta_tensors(), min_size=1, max_size=3))
    items = st.one_of(st.sampled_from(pool), scalars, int_lists,
                      int_lists.map(tuple),
                      st.lists(st.one_of(st.sampled_from(pool), st.integers(0, 3), st.none()),
                               max_size=3))
    return tuple(draw(st.lists(items, max_size=6)))


@settings(max_examples=300, deadline=None)
@given(args=arguments(), blind=st.booleans())
def test_the_key_is_the_plain_key(args, blind):
    fast_storages, plain_storages = {}, {}
    fast = _key(args, fast_storages, blind)
    plain = plain_key(args, plain_storages, blind)
    assert fast == plain
    assert hash(fast) == hash(plain)
    assert fast_storages == plain_storages


@settings(max_examples=300, deadline=None)
@given(values=arguments(), names=st.lists(st.sampled_from(
    ["dtype", "device", "alpha", "out", "dim", "weight", "pin_memory", "memory_format"]),
    unique=True, max_size=8), blind=st.booleans())
def test_the_keyword_key_is_the_key_of_the_pairs(values, names, blind):
    kwargs = dict(zip(names, values + (torch.device("meta"), torch.strided,
                                       torch.contiguous_format, 0.5), strict=False))
    fast_storages, plain_storages = {}, {}
    fast = _kwargs_key(kwargs, fast_storages, blind)
    plain = plain_key(tuple(kwargs.items()), plain_storages, blind)
    assert fast == plain
    assert fast_storages == plain_storages


def test_the_conjugate_and_negative_bits_are_in_the_key():
    base = torch.empty(3, dtype=torch.complex64, device="meta")
    keys = {_tensor_key(t, {}) for t in (base, base.conj(), torch._neg_view(base))}
    assert len(keys) == 3
    real = torch.empty(3, device="meta")
    assert _tensor_key(real, {}) != _tensor_key(torch._neg_view(real), {})
    assert _tensor_key(real, {}) == _tensor_key_plain(real, {})


def test_a_key_of_plain_values_is_untracked_once_collected():
    """Each key is kept for the process: keys the collector untracks are never walked again
    by a bench worker's full collections (a torch.Size left in keeps the key tracked)."""
    # the process's other objects set aside (gc.freeze): the collections below walk only what
    # this test makes, not a worker's millions of library objects (0.15-0.3 s of CPU each)
    gc.freeze()
    try:
        x = torch.empty(2, 3, device="meta")
        key = (1, (torch.float32, False), _key((x, [0, 1], 2.0, None), {}), (), None)
        with_size = (1, (torch.float32, x.shape))
        for _ in range(4):  # one nesting level untracked per collection
            gc.collect()
        assert not gc.is_tracked(key)
        assert gc.is_tracked(with_size)
    finally:
        gc.unfreeze()
