"""The meta-kernel result cache: a hit makes outputs exactly like the kernel's, and only calls
whose result depends on nothing but the key are cached."""

import pytest
import torch

from peakmem.capture import capture_callable, meta_cache
from peakmem.capture.meta_cache import MetaCache, _rebuild, _recipe

aten = torch.ops.aten


def meta(*shape, dtype=torch.float32):
    return torch.empty(*shape, dtype=dtype, device="meta")


def layout(tensor):
    storage = tensor.untyped_storage()
    return (tuple(tensor.shape), tensor.stride(), tensor.storage_offset(), tensor.dtype,
            storage.nbytes(), tensor.device.type)


def same_outputs(made, expected):
    if isinstance(expected, torch.Tensor):
        assert layout(made) == layout(expected)
        return
    assert type(made) is type(expected) and len(made) == len(expected)
    for a, b in zip(made, expected, strict=True):
        if b is None:
            assert a is None
        else:
            assert layout(a) == layout(b)


CALLS = [
    (aten.add.Tensor, lambda: (meta(4, 8), meta(8)), {}),
    (aten.mm.default, lambda: (meta(4, 8), meta(8, 3)), {}),
    (aten.addmm.default, lambda: (meta(3), meta(4, 8), meta(8, 3)), {"beta": 0.5}),
    (aten.native_layer_norm.default, lambda: (meta(2, 5, 8), [8], meta(8), meta(8), 1e-5), {}),
    (aten.native_dropout.default, lambda: (meta(6, 7), 0.1, True), {}),
    # (aten.convolution has a peakmem fused kernel, cuda_rules/convolution.py
    # `convolution_output`, layout-pure: cached, but outside captures torch's own kernel runs;
    # test_layout_pure_fused_kernels_are_cached_and_keyed_by_cudnn below)
    (aten.avg_pool2d.default, lambda: (meta(2, 3, 9, 9), [3, 3], [2, 2], [1, 1]), {}),
    (aten.add.Tensor, lambda: (meta(4, 8).t(), meta(8, 4), ), {"alpha": 2}),  # transposed input
    (aten.sum.dim_IntList, lambda: (meta(4, 8, dtype=torch.float16), [1]), {"keepdim": True}),
    (aten._to_copy.default, lambda: (meta(4, 8),), {"dtype": torch.bfloat16}),
    (aten._foreach_sqrt.default, lambda: ([meta(3), meta(2, 2)],), {}),
    (aten.var_mean.correction, lambda: (meta(5, 6), [1]), {"correction": 1, "keepdim": False}),
]


@pytest.mark.parametrize("func,make_args,kwargs", CALLS, ids=[str(c[0]) for c in CALLS])
def test_a_hit_makes_the_kernels_outputs(func, make_args, kwargs):
    cache = MetaCache()
    first = cache.call(func, make_args(), kwargs)
    assert cache.misses == 1 and cache.hits == 0
    second = cache.call(func, make_args(), kwargs)
    assert cache.hits == 1
    same_outputs(second, func(*make_args(), **kwargs))
    same_outputs(second, first)
    # fresh storages: the hit shares nothing with the first call's outputs
    firsts = [first] if isinstance(first, torch.Tensor) else [t for t in first if t is not None]
    seconds = [second] if isinstance(second, torch.Tensor) else [t for t in second if t is not None]
    for a, b in zip(firsts, seconds, strict=True):
        assert a.untyped_storage() is not b.untyped_storage()


def test_layouts_dtypes_scalars_and_aliasing_are_part_of_the_key():
    cache = MetaCache()
    x = meta(4, 8)
    cache.call(aten.add.Tensor, (x, meta(4, 8)), {})
    cache.call(aten.add.Tensor, (meta(4, 8).t().contiguous().t(), meta(4, 8)), {})
    cache.call(aten.add.Tensor, (meta(4, 8, dtype=torch.float16), meta(4, 8)), {})
    cache.call(aten.add.Tensor, (meta(4, 8), meta(4, 8)), {"alpha": 2})
    cache.call(aten.add.Tensor, (meta(4, 8), meta(4, 8)), {"alpha": 2.0})
    cache.call(aten.add.Tensor, (x, x), {})  # both arguments on one storage
    assert cache.hits == 0 and cache.misses == 6
    out = cache.call(aten.add.Tensor, (meta(4, 8).t().contiguous().t(), meta(4, 8)), {})
    assert cache.hits == 1 and out.stride() == (1, 4)


def test_global_switches_are_part_of_the_key():
    cache = MetaCache()
    cache.call(aten.mul.Tensor, (meta(3, 3), meta(3, 3)), {})
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        cache.call(aten.mul.Tensor, (meta(3, 3), meta(3, 3)), {})
    finally:
        torch.set_default_dtype(previous)
    assert cache.misses == 2 and cache.hits == 0
    with torch.no_grad():
        cache.call(aten.mul.Tensor, (meta(3, 3), meta(3, 3)), {})
    assert cache.misses == 3


def test_in_place_view_and_data_dependent_ops_always_run_the_kernel():
    cache = MetaCache()
    x = meta(4, 8)
    for _ in range(2):
        assert cache.call(aten.add_.Tensor, (x, meta(4, 8)), {}) is x
        view = cache.call(aten.view.default, (x, [32]), {})
        assert view.untyped_storage() is x.untyped_storage()
        t = cache.call(aten.t.default, (x,), {})
        assert t.untyped_storage() is x.untyped_storage()
    assert cache.hits == 0 and cache.misses == 0
    assert not meta_cache._op_cacheable(aten.nonzero.default)
    assert not meta_cache._op_cacheable(aten.masked_select.default)


def test_in_place_foreach_checks_are_cached_and_return_nothing():
    cache = MetaCache()
    params = [meta(3), meta(2, 2)]
    for _ in range(2):
        assert cache.call(aten._foreach_add_.List, (params, [meta(3), meta(2, 2)]), {}) is None
    assert cache.hits == 1


def test_a_call_that_raises_is_not_cached_and_raises_again():
    cache = MetaCache()
    for _ in range(2):
        with pytest.raises(RuntimeError):
            cache.call(aten.mm.default, (meta(4, 8), meta(7, 3)), {})
    assert cache.hits == 0 and not cache._entries


def test_host_and_sparse_tensors_are_not_cached():
    cache = MetaCache()
    cache.call(aten.add.Tensor, (torch.ones(2), torch.ones(2)), {})
    cache.call(aten.add.Tensor, (torch.ones(2), torch.ones(2)), {})
    sparse = torch.sparse_coo_tensor(torch.zeros(1, 0, dtype=torch.long), torch.zeros(0), (3,))
    cache.call(aten.add.Tensor, (sparse, sparse), {})
    assert not cache._entries and cache.hits == 0


def test_outputs_on_one_storage_or_past_its_start_are_rebuilt_on_set_():
    base = torch.empty(64, dtype=torch.uint8, device="meta").untyped_storage()
    a = torch.empty(0, device="meta").set_(base, 2, (3,), (1,))
    b = torch.empty(0, device="meta").set_(base, 8, (2, 2), (2, 1))
    recipe = _recipe((a, None, b), {})
    made = _rebuild(recipe)
    assert made[1] is None
    assert layout(made[0]) == layout(a) and layout(made[2]) == layout(b)
    assert made[0].untyped_storage()._cdata == made[2].untyped_storage()._cdata
    assert made[0].untyped_storage()._cdata != base._cdata


def test_outputs_aliasing_an_input_are_not_cached():
    x = meta(4, 8)
    assert _recipe(x, {id(x.untyped_storage()): 0}) is None


def _mlp_job():
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(),
                                torch.nn.LayerNorm(64), torch.nn.Dropout(0.1),
                                torch.nn.Linear(64, 10)).to("cuda")
    optimizer = torch.optim.AdamW(model.parameters())
    for _ in range(3):
        x = torch.randn(8, 32).to("cuda")
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), torch.zeros(8, dtype=torch.long,
                                                                  device="cuda")).backward()
        optimizer.step()


def test_a_capture_with_the_cache_is_the_capture_without_it(a100, stack24, monkeypatch):
    with_cache = capture_callable(_mlp_job, gpu=a100, stack=stack24, steps=3)
    assert meta_cache.SHARED_CACHE.hits > 0
    monkeypatch.setattr(MetaCache, "call", lambda self, func, args, kwargs: func(*args, **kwargs))
    without = capture_callable(_mlp_job, gpu=a100, stack=stack24, steps=3)
    assert with_cache.error is None and without.error is None
    assert with_cache.trace == without.trace
    assert len(with_cache.trace) > 50


def test_ops_with_a_peakmem_fused_kernel_registered_always_run_their_kernel(monkeypatch):
    from peakmem.cuda_rules import registry

    cache = MetaCache()
    func = aten.log_sigmoid_forward.default
    monkeypatch.delitem(registry.FUSED_KERNELS, "log_sigmoid_forward")
    cache.call(func, (meta(3, 4),), {})
    cache.call(func, (meta(3, 4),), {})
    assert cache.hits == 1  # the op's own meta kernel: cached
    monkeypatch.setitem(registry.FUSED_KERNELS, "log_sigmoid_forward", lambda x: x)
    cache.call(func, (meta(3, 4),), {})
    assert cache.hits == 1  # peakmem's kernel is installed for captures: never from the cache


def test_layout_pure_fused_kernels_are_cached_and_keyed_by_cudnn(monkeypatch):
    from peakmem.cuda_rules import registry

    calls = []

    def kernel(x):
        calls.append(torch.backends.cudnn.enabled)
        return torch.empty_like(x)

    cache = MetaCache()
    func = aten.log_sigmoid_forward.default
    monkeypatch.setitem(registry.FUSED_KERNELS, "log_sigmoid_forward", kernel)
    monkeypatch.setattr(registry, "LAYOUT_PURE_FUSED_KERNELS", {"log_sigmoid_forward"})
    monkeypatch.setattr(meta_cache, "LAYOUT_PURE_FUSED_KERNELS", registry.LAYOUT_PURE_FUSED_KERNELS)
    # the fused kernel is the op's Meta kernel during a capture; here it stands in for it
    monkeypatch.setattr(meta_cache, "fast_layout", lambda *a: pytest.fail("fast layout asked"))
    op = _Kernel(func, kernel)
    first = cache.call(op, (meta(3, 4),), {})
    second = cache.call(op, (meta(3, 4),), {})
    assert cache.hits == 1 and len(calls) == 1
    assert first.shape == second.shape == (3, 4)
    with torch.backends.cudnn.flags(enabled=not torch.backends.cudnn.enabled):
        cache.call(op, (meta(3, 4),), {})
    assert cache.hits == 1 and len(calls) == 2  # cuDNN's switch is part of the key


class _Kernel:
    """An op overload whose call runs `kernel` (the fused kernel installed as its Meta kernel)."""

    def __init__(self, op, kernel):
        self._op, self._kernel = op, kernel
        self.overloadpacket, self._overloadname = op.overloadpacket, op._overloadname
        self._schema, self.tags = op._schema, op.tags
        self.namespace = op.namespace

    def __call__(self, *args, **kwargs):
        return self._kernel(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._op, name)


def _convnet_job():
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(),
        torch.nn.Conv2d(8, 8, 3, padding=1, groups=8), torch.nn.Conv2d(8, 4, 1),
    ).to("cuda").to(memory_format=torch.channels_last)
    plain = torch.nn.Conv2d(3, 4, 3).to("cuda")
    optimizer = torch.optim.SGD([*model.parameters(), *plain.parameters()], lr=0.1)
    for _ in range(3):
        x = torch.randn(2, 3, 16, 16).to("cuda")
        optimizer.zero_grad()
        (model(x.contiguous(memory_format=torch.channels_last)).sum() + plain(x).sum()).backward()
        optimizer.step()


def test_a_convolution_capture_with_the_cache_is_the_capture_without_it(a100, stack24, monkeypatch):
    with_cache = capture_callable(_convnet_job, gpu=a100, stack=stack24, steps=3)
    assert meta_cache.SHARED_CACHE.hits > 0
    monkeypatch.setattr(MetaCache, "call", lambda self, func, args, kwargs: func(*args, **kwargs))
    without = capture_callable(_convnet_job, gpu=a100, stack=stack24, steps=3)
    assert with_cache.error is None and without.error is None
    assert with_cache.trace == without.trace


def test_custom_ops_are_not_cached():
    assert meta_cache._op_cacheable(torch.ops.aten.add.Tensor)
    lib = torch.library.Library("peakmem_test_cache", "DEF")
    lib.define("twice(Tensor x) -> Tensor")
    lib.impl("twice", lambda x: torch.empty_like(x), "Meta")
    try:
        assert not meta_cache._op_cacheable(torch.ops.peakmem_test_cache.twice.default)
    finally:
        lib._destroy()


_FLOATS = [0.0, -0.0, 1.0, -1.0, 0.5, 2.5, 1e300, -1e-300, float("nan"), float("inf"),
           float("-inf")]
_DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.complex64,
           torch.int64, torch.int32, torch.uint8, torch.bool]


def _blind_overloads():
    for name in sorted(meta_cache.VALUE_BLIND_OPS):
        packet = getattr(aten, name.split("::")[1])
        for overload in packet.overloads():
            func = getattr(packet, overload)
            if any(str(a.type) in ("number", "List[number]") for a in func._schema.arguments):
                yield func


def _call_args(func, dtype, value):
    args, kwargs = [], {}
    for argument in func._schema.arguments:
        kind = str(argument.type)
        if kind == "List[Tensor]":
            made = [meta(3, dtype=dtype), meta(2, 2, dtype=dtype)]
        elif kind == "List[number]":
            made = [value, value]
        elif kind == "number":
            made = value
        elif kind == "Tensor":
            made = meta((), dtype=torch.float32)
        else:
            raise AssertionError(f"unexpected argument {argument} of {func}")
        if argument.kwarg_only:
            kwargs[argument.name] = made
        else:
            args.append(made)
    return args, kwargs


def _outcome(func, dtype, value):
    args, kwargs = _call_args(func, dtype, value)
    try:
        func(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - the outcome compared is the exception's type
        return type(exc)
    return None


@pytest.mark.parametrize("func", list(_blind_overloads()), ids=str)
def test_value_blind_ops_check_the_same_for_every_float_value(func):
    """What keying their floats by type rests on: the kernel accepts or rejects a call the
    same way whatever the float values, for every dtype."""
    assert meta_cache._value_blind(func)
    for dtype in _DTYPES:
        outcomes = {_outcome(func, dtype, value) for value in _FLOATS}
        assert len(outcomes) == 1, (func, dtype, outcomes)


def test_an_optimizers_new_floats_each_step_hit_the_cache():
    cache = MetaCache()
    params, avgs, denoms = [meta(3), meta(2, 2)], [meta(3), meta(2, 2)], [meta(3), meta(2, 2)]
    for step in range(1, 4):  # Adam's step sizes: new floats every step
        sizes = [-1e-3 / (1 - 0.9 ** step)] * 2
        assert cache.call(aten._foreach_addcdiv_.ScalarList, (params, avgs, denoms, sizes),
                          {}) is None
    assert (cache.misses, cache.hits) == (1, 2)
    # ints keep their values; other ops keep their floats' values
    cache.call(aten._foreach_add_.ScalarList, (params, [1, 1]), {})
    cache.call(aten._foreach_add_.ScalarList, (params, [2, 2]), {})
    cache.call(aten._foreach_pow_.ScalarList, (params, [1.0, 1.0]), {})
    cache.call(aten._foreach_pow_.ScalarList, (params, [2.0, 2.0]), {})
    assert (cache.misses, cache.hits) == (5, 2)
    # and a float where an int was is another key
    cache.call(aten._foreach_add_.ScalarList, (params, [1.0, 1.0]), {})
    assert cache.misses == 6


def test_call_entry_hands_every_call_of_a_key_the_same_entry():
    """`call_entry`: the entry a miss stored is the one every later call of the key gets (its
    memo kept), with that call's own tensor arguments' storage ids; calls not cached get None."""
    cache = MetaCache()
    x, y = meta(4, 8), meta(8)
    out, (entry, storages) = cache.call_entry(aten.add.Tensor, (x, y), {})
    assert cache.misses == 1 and entry.memo is None
    assert set(storages) == {id(x.untyped_storage()), id(y.untyped_storage())}
    entry.memo = "kept"
    a = meta(4, 8)
    again, (same, shared) = cache.call_entry(aten.add.Tensor, (a, a[0]), {})
    assert cache.hits == 0 and same is not entry  # a[0] shares a's storage: another key
    again, (same, storages) = cache.call_entry(aten.add.Tensor, (a, meta(8)), {})
    assert cache.hits == 1 and same is entry and same.memo == "kept"
    assert id(a.untyped_storage()) in storages and len(storages) == 2
    same_outputs(again, out)
    assert len(shared) == 1
    other = cache.call_entry(aten.add.Tensor, (meta(4, 9), meta(9)), {})[1][0]
    assert other is not entry and other.memo is None
    assert cache.call_entry(aten.add_.Tensor, (meta(4, 8), meta(8)), {})[1] is None  # in place
    assert cache.call_entry(aten.view.default, (meta(4, 8), [32]), {})[1] is None  # a view
    assert cache.call(aten.add.Tensor, (meta(4, 8), meta(8)), {}).shape == (4, 8)
