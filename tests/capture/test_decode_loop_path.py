"""The per-op path of a decode loop (issue 14, benchmarks/decode_loop_speed.py): the known-values
walk turned away early for a small device tensor of unknown values, and `index.Tensor` with
integer indices kept by the meta cache. Each is held to the plain way: the same answers, the
same ops dispatched, the same trace."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from peakmem.capture import capture_callable, known_values, meta_cache
from peakmem.capture.arg_tensors import tensors_in
from peakmem.capture.device_map import (
    _ASSUMED_TRUE,
    HOST_DATA_MAX_ELEMENTS,
    give_host_data,
    give_lazy_host_data,
    known_host_data,
)
from peakmem.capture.device_specs import is_cuda_spec
from peakmem.capture.meta_cache import MetaCache
from peakmem.cuda_rules.true_device import is_meta

aten = torch.ops.aten


def _plain_host_arguments(args: tuple, kwargs: dict, bound: int, known: Any) -> tuple | None:
    """`known_values._host_arguments` as it was before the early turn-away (the reference)."""
    tensors = tensors_in((args, kwargs) if kwargs else args)
    for tensor in tensors:
        if tensor.requires_grad or tensor.numel() > bound:
            return None
    device_named = "device" in kwargs and is_cuda_spec(kwargs["device"], ints=True)
    if not device_named and not any(is_meta(t) for t in tensors):
        return None

    def to_host(value: Any) -> Any:
        if isinstance(value, torch.Tensor) and is_meta(value):
            host = known(value)
            if host is None:
                raise known_values._Unknown
            return host
        return value

    try:
        host_args, host_kwargs = known_values._fast_tree_map(to_host, (args, kwargs))
    except known_values._Unknown:
        return None
    if device_named:
        host_kwargs["device"] = "cpu"
    return host_args, host_kwargs


class _Ops(TorchDispatchMode):
    """The aten ops dispatched while it is on (the walk's copies of known values)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def _device(values: list, dtype=torch.float32) -> torch.Tensor:
    """A fake device tensor (meta) holding `values` as known host values."""
    host = torch.tensor(values, dtype=dtype)
    tensor = torch.empty(host.shape, dtype=dtype, device="meta")
    give_host_data(tensor, host)
    return tensor


def _cases() -> dict[str, Any]:
    """name -> a function making (args, kwargs, reads): fresh tensors each call, and the count
    of lazy reads made (a list the lazily read tensor's reader appends to)."""

    def unknown(*shape):
        return torch.empty(shape or (4,), device="meta")

    def assumed(*shape):
        tensor = torch.empty(shape or (4,), dtype=torch.bool, device="meta")
        setattr(tensor, _ASSUMED_TRUE, True)
        return tensor

    def stale():
        tensor = _device([1.0, 2.0, 3.0, 4.0])
        tensor.add_(1)  # an in-place write: its values are no longer known
        return tensor

    def lazy(reads):
        tensor = torch.empty((4,), device="meta")
        give_lazy_host_data(tensor, lambda: reads.append(1) or torch.arange(4.0))
        return tensor

    def big():
        return torch.empty((HOST_DATA_MAX_ELEMENTS + 1,), device="meta")

    def needs_grad():
        return _device([1.0, 2.0, 3.0, 4.0]).requires_grad_()

    return {
        "unknown": lambda r: ((unknown(), unknown()), {}),
        "known": lambda r: ((_device([1.0, 2.0, 3.0, 4.0]), _device([0.5] * 4)), {}),
        "known then unknown": lambda r: ((_device([1.0, 2.0, 3.0, 4.0]), unknown()), {}),
        "unknown then known": lambda r: ((unknown(), _device([1.0, 2.0, 3.0, 4.0])), {}),
        "host then unknown": lambda r: ((torch.ones(4), unknown()), {}),
        "host then known": lambda r: ((torch.ones(4), _device([1.0, 2.0, 3.0, 4.0])), {}),
        "host only": lambda r: ((torch.ones(4), 2), {}),
        "view of known": lambda r: ((_device([1.0, 2.0, 3.0, 4.0])[1:3], 2), {}),
        "view of unknown": lambda r: ((unknown(2, 4)[0], 2), {}),
        "reinterpreting view": lambda r: ((_device([1.0, 2.0]).view(torch.int32), 1), {}),
        "stale then unknown": lambda r: ((stale(), unknown()), {}),
        "assumed true then unknown": lambda r: ((assumed(), unknown()), {}),
        "unknown then assumed true": lambda r: ((unknown(), assumed()), {}),
        "lazy then unknown": lambda r: ((lazy(r), unknown()), {}),
        "unknown then lazy": lambda r: ((unknown(), lazy(r)), {}),
        "nested list": lambda r: (([unknown(), _device([1.0] * 4)], 0), {}),
        "nested known list": lambda r: (([_device([1.0] * 4), _device([2.0] * 4)], 0), {}),
        "kwargs tensor": lambda r: ((_device([1.0] * 4),), {"other": unknown()}),
        "device factory": lambda r: ((3,), {"device": "cuda"}),
        "device factory, unknown": lambda r: ((unknown(),), {"device": "cuda"}),
        "too large": lambda r: ((big(), unknown()), {}),
        "needs grad": lambda r: ((needs_grad(), unknown()), {}),
        "no tensors": lambda r: ((1, 2.0), {}),
    }


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
                and a.device == b.device and a.dtype == b.dtype and a.shape == b.shape
                and (a.is_meta or torch.equal(a, b)))
    if isinstance(a, (tuple, list)):
        return (type(a) is type(b) and len(a) == len(b)
                and all(_same(x, y) for x, y in zip(a, b, strict=True)))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return a == b


@pytest.mark.parametrize("name", list(_cases()))
def test_the_early_turn_away_answers_as_the_walk_with_the_same_ops(name):
    make = _cases()[name]
    answers, dispatched, reads = [], [], []
    for host_arguments in (_plain_host_arguments, known_values._host_arguments):
        read: list = []
        args, kwargs = make(read)
        with _Ops() as ops:
            answers.append(host_arguments(args, kwargs, HOST_DATA_MAX_ELEMENTS, known_host_data))
        dispatched.append(ops.ops)
        reads.append(len(read))
    assert _same(answers[0], answers[1]), name
    assert dispatched[0] == dispatched[1], name  # the walk's copies of known values, if any
    assert reads[0] == reads[1], name  # a lazily read tensor read as often


def test_an_unknown_first_device_tensor_is_turned_away_without_the_walk(monkeypatch):
    walked = []
    monkeypatch.setattr(known_values, "_fast_tree_map",
                        lambda fn, value: walked.append(1) or (value[0], value[1]))
    unknown = torch.empty((4,), device="meta")
    known = _device([1.0, 2.0, 3.0, 4.0])
    bound = HOST_DATA_MAX_ELEMENTS
    assert known_values._host_arguments((unknown, known), {}, bound, known_host_data) is None
    assert walked == []
    known_values._host_arguments((known, unknown), {}, bound, known_host_data)
    assert walked == [1]  # a known first tensor: the walk decides


# index.Tensor with integer indices in the meta cache ------------------------------------------------

def _meta(*shape, dtype=torch.float32):
    return torch.empty(*shape, dtype=dtype, device="meta")


def _index(*shape, dtype=torch.int64):
    return torch.empty(*shape, dtype=dtype, device="meta")


INDEX_CALLS = {
    "v[:, [-1]]": lambda: (_meta(1, 10), [None, _index(1)]),
    "x[idx]": lambda: (_meta(6, 5), [_index(3)]),
    "x[idx] int32": lambda: (_meta(6, 5), [_index(3, dtype=torch.int32)]),
    "x[:, i, j] broadcast": lambda: (_meta(2, 6, 5, 3), [None, _index(4, 1), _index(1, 7)]),
    "x[i, :, j] apart": lambda: (_meta(6, 5, 3), [_index(2, 2), None, _index(2, 2)]),
    "transposed self": lambda: (_meta(5, 6).t(), [None, _index(3)]),
    "sliced self": lambda: (_meta(8, 6)[::2, 1:], [_index(2, 3)]),
    "channels_last self": lambda: (
        _meta(2, 3, 4, 5).contiguous(memory_format=torch.channels_last), [None, _index(2)]),
    "strided index": lambda: (_meta(6, 5), [_index(4, 3).t()]),
    "empty index": lambda: (_meta(6, 5), [_index(0)]),
    "half self": lambda: (_meta(6, 5, dtype=torch.float16), [None, _index(2)]),
}


def _layout(tensor):
    return (tuple(tensor.shape), tensor.stride(), tensor.storage_offset(), tensor.dtype,
            tensor.untyped_storage().nbytes())


@pytest.mark.parametrize("name", list(INDEX_CALLS))
def test_index_with_integer_indices_is_cached_with_the_kernels_layout(name):
    make = INDEX_CALLS[name]
    cache = MetaCache()
    first = cache.call(aten.index.Tensor, make(), {})
    second = cache.call(aten.index.Tensor, make(), {})
    assert (cache.misses, cache.hits) == (1, 1)
    expected = aten.index.Tensor(*make())
    assert _layout(first) == _layout(expected) == _layout(second)
    assert second.untyped_storage() is not first.untyped_storage()


@pytest.mark.parametrize("dtype", [torch.bool, torch.int8])
def test_index_with_a_mask_always_runs_the_kernel(dtype, monkeypatch):
    from torch.fx.experimental import _config

    # as under a capture; raising=False: torch's ConfigModule hides an option after a
    # `delattr` (unittest.mock's undo), which one CI worker saw (cuda_rules/data_dependent.py
    # reads it with a default for that reason); setting it shows it again
    monkeypatch.setattr(_config, "meta_nonzero_assume_all_nonzero", True, raising=False)
    cache = MetaCache()
    for _ in range(2):
        cache.call(aten.index.Tensor, (_meta(6, 5), [_index(6, dtype=dtype)]), {})
        cache.call(aten.index.Tensor, (_meta(6, 5), [None, _index(5, dtype=dtype)]), {})
    assert (cache.misses, cache.hits) == (0, 0)


def test_index_guard_reads_only_plain_integer_indices():
    guard = meta_cache.CALL_GUARDED_OPS[aten.index.Tensor]
    assert guard((_meta(3), [_index(2)]), {})
    assert guard((_meta(3, 3), (None, _index(2, dtype=torch.int32))), {})
    assert not guard((_meta(3), []), {})
    assert not guard((_meta(3), [_index(2, dtype=torch.float32)]), {})
    assert not guard((_meta(3), [_index(2)]), {"unexpected": 1})
    assert not meta_cache._op_cacheable(aten.nonzero.default)
    assert not meta_cache._op_cacheable(aten.masked_select.default)


# the whole decode loop, both ways ------------------------------------------------------------------

def _decode_job():
    """A key/value-cache decode with nanoGPT's top-k cut, under no_grad."""
    torch.manual_seed(0)
    width, heads = 16, 2
    embed = torch.nn.Embedding(11, width).cuda()
    qkv = torch.nn.Linear(width, 3 * width).cuda()
    head = torch.nn.Linear(width, 11).cuda()
    keys, values = [], []
    token = torch.tensor([[1]], device="cuda")
    out = [token]
    with torch.no_grad():
        for step in range(6):
            q, k, v = qkv(embed(token)).split(width, dim=2)
            q, k, v = (t.view(1, 1, heads, width // heads).transpose(1, 2) for t in (q, k, v))
            keys.append(k)
            values.append(v)
            y = torch.nn.functional.scaled_dot_product_attention(
                q, torch.cat(keys, dim=2), torch.cat(values, dim=2))
            logits = head(y.transpose(1, 2).reshape(1, 1, width))[:, -1, :] / (1.0 + step)
            top, _ = torch.topk(logits, 3)
            logits[logits < top[:, [-1]]] = -float("inf")
            token = torch.multinomial(torch.softmax(logits, dim=-1), num_samples=1)
            out.append(token)
    return torch.cat(out, dim=1)


def test_a_decode_loop_is_captured_the_same_with_either_shortcut_off(a100, stack24, monkeypatch):
    both = capture_callable(_decode_job, gpu=a100, stack=stack24, steps="all")
    assert both.error is None, both.error_text
    with monkeypatch.context() as patched:  # the known-values walk every time
        patched.setattr(known_values, "_holds_no_values", lambda tensor: False)
        walked = capture_callable(_decode_job, gpu=a100, stack=stack24, steps="all")
    with monkeypatch.context() as patched:  # index.Tensor's kernel every time
        patched.setattr(meta_cache, "CALL_GUARDED_OPS", {})
        patched.setattr(meta_cache, "SHARED_CACHE", MetaCache())
        patched.setattr("peakmem.capture.recorder.SHARED_CACHE", meta_cache.SHARED_CACHE)
        uncached = capture_callable(_decode_job, gpu=a100, stack=stack24, steps="all")
    for other in (walked, uncached):
        assert other.error is None, other.error_text
        assert other.trace == both.trace
        assert other.trace.meta.get("utilization") == both.trace.meta.get("utilization")
    assert len(both.trace) > 100
