import torch
from torch.utils.flop_counter import flop_registry

from peakmem.utilization.op_costs import (
    CONV,
    ELEMENTWISE,
    FOREACH,
    GEMM,
    REDUCTION,
    family_of,
    op_cost,
)

aten = torch.ops.aten


def meta(*shape, dtype=torch.float32):
    return torch.empty(*shape, device="meta", dtype=dtype)


def test_matmul_flops_come_from_torch_registry_and_bytes_from_shapes():
    bias, x, w = meta(64), meta(32, 128), meta(128, 64)
    out = aten.addmm.default(bias, x, w)
    cost = op_cost(aten.addmm.default, (bias, x, w), {}, out)
    assert cost.family == GEMM
    assert cost.flops == flop_registry[aten.addmm](bias, x, w, out_val=out) == 2 * 32 * 128 * 64
    assert cost.bytes == 4 * (64 + 32 * 128 + 128 * 64 + 32 * 64)
    assert cost.work == 32 * 64 and cost.dtype == "f32"


def test_convolution_is_its_own_family_with_registry_flops():
    x, w = meta(2, 3, 8, 8), meta(16, 3, 3, 3)
    args = (x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    out = aten.convolution.default(*args)
    cost = op_cost(aten.convolution.default, args, {}, out)
    assert cost.family == CONV
    assert cost.flops == 2 * (2 * 16 * 8 * 8) * (3 * 3 * 3)


def test_pointwise_costs_one_flop_per_element_and_half_precision_is_named():
    x = meta(1000, dtype=torch.bfloat16)
    out = aten.relu.default(x)
    cost = op_cost(aten.relu.default, (x,), {}, out)
    assert cost.family == ELEMENTWISE and cost.flops == 1000 and cost.dtype == "bf16"
    assert cost.bytes == 2 * 2 * 1000


def test_in_place_op_writes_what_it_reads():
    x, y = meta(100), meta(100)
    cost = op_cost(aten.add_.Tensor, (x, y), {}, x)
    assert cost.bytes == 3 * 400  # reads x and y, writes x (the output is x itself)


def test_ops_without_a_kernel_cost_nothing():
    x = meta(4, 5)
    assert op_cost(aten.view.default, (x, [20]), {}, x.view(20)) is None
    assert op_cost(aten.t.default, (x,), {}, x.t()) is None
    assert op_cost(aten.detach.default, (x,), {}, x.detach()) is None
    assert op_cost(aten.empty.memory_format, ([3],), {}, meta(3)) is None


def test_foreach_ops_count_their_tensors_and_elements():
    params = [meta(10, 10), meta(10)]
    grads = [meta(10, 10), meta(10)]
    cost = op_cost(aten._foreach_add_.List, (params, grads), {}, None)
    assert cost.family == FOREACH and cost.tensors == 2 and cost.work == 110
    assert cost.bytes == 3 * 4 * 110


def test_family_registry_defaults_to_elementwise():
    assert family_of("native_layer_norm") == REDUCTION
    assert family_of("_foreach_mul_") == FOREACH
    assert family_of("some_new_pointwise_op") == ELEMENTWISE


def _cnn_job():
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, stride=2), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
        torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.Flatten(), torch.nn.LazyLinear(10),
    ).to("cuda")
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for step in range(3):
        x = torch.randn(4 + step % 2, 3, 17, 17, device="cuda")  # a new shape every other step
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), torch.zeros(len(x), dtype=torch.long,
                                                                       device="cuda"))
        loss.backward()
        optimizer.step()
        loss.item()


def _without_entry_memo(monkeypatch) -> None:
    """Captures without the observer's per-key memo in the meta cache's entries (the recorder
    hands the observer no cache entry), each with a fresh cache."""
    from peakmem.capture import meta_cache, recorder

    real = meta_cache.MetaCache.call_entry
    monkeypatch.setattr(meta_cache.MetaCache, "call_entry",
                        lambda self, func, args, kwargs: (real(self, func, args, kwargs)[0], None))
    monkeypatch.setattr(recorder, "SHARED_CACHE", meta_cache.MetaCache())


def _capture_counting_costs(monkeypatch, job, a100, stack24, *, memo: bool):
    """`job` captured with a fresh meta cache (with or without the observer's per-key memo),
    and how many times the observer computed an op's cost (meta_op_cost)."""
    from peakmem.capture import capture_callable, meta_cache, recorder
    from peakmem.utilization import observer

    with monkeypatch.context() as patch:
        if memo:
            patch.setattr(recorder, "SHARED_CACHE", meta_cache.MetaCache())
        else:
            _without_entry_memo(patch)
        calls = []
        fresh = observer.meta_op_cost

        def counted(*args, **kwargs):
            calls.append(1)
            return fresh(*args, **kwargs)

        patch.setattr(observer, "meta_op_cost", counted)
        result = capture_callable(job, gpu=a100, stack=stack24, steps="all")
    assert result.error is None, result.error
    assert result.trace.meta["utilization"]["ops"]  # a steady step was recorded
    return result, len(calls)


def _lazy_batches_job() -> None:
    """Lazily drawn samples stacked into lazy batches (host data behind meta storages,
    capture.host_deferred's `collated`) moved to the device with the layout and options of a
    device copy made first: the same meta-cache key, one an input copy, the other a kernel."""
    from tests.capture.test_sample_draws_deferred import RandomImages

    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, stride=2), torch.nn.ReLU(),
                                torch.nn.Flatten(), torch.nn.LazyLinear(10)).cuda()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    loader = torch.utils.data.DataLoader(RandomImages(24, 40), batch_size=8)
    for x, y in loader:
        on_device = torch.empty(x.shape, device="cuda")
        on_device.to("cuda", copy=True)  # the key of the batch's copy, every tensor a device one
        x = x.to("cuda", copy=True)
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y.cuda()).backward()
        optimizer.step()


def test_the_cost_memo_in_the_meta_cache_gives_the_same_record(a100, stack24, monkeypatch):
    """The observer's memo kept in a meta-cache entry (the decision and cost of a call whose
    tensors are all device ones, a function of the key) gives the trace and the utilization
    record computed call by call, with lazily stacked host batches about (the full path's
    `collated` filter: a copy of one is input bytes, not a kernel, though its key is a device
    copy's), and computes far fewer costs."""
    from peakmem.utilization import observer

    refused = []
    real_check = observer.OpCostObserver._all_on_device

    def check(self, storages, out):
        answer = real_check(self, storages, out)
        refused.append(not answer)
        return answer

    monkeypatch.setattr(observer.OpCostObserver, "_all_on_device", check)
    for job in (_cnn_job, _lazy_batches_job):
        with_memo, costed = _capture_counting_costs(monkeypatch, job, a100, stack24, memo=True)
        without, costed_without = _capture_counting_costs(monkeypatch, job, a100, stack24,
                                                          memo=False)
        assert with_memo.trace.meta["utilization"] == without.trace.meta["utilization"], job
        assert with_memo.trace == without.trace
        assert with_memo.notes == without.notes
        assert costed < costed_without, job  # the memo answered calls
    assert any(refused)  # a lazy batch's copy was kept off the memo
    assert with_memo.trace.meta["utilization"]["input_bytes"] > 0


def test_remembered_op_costs_are_the_costs(a100, stack24, monkeypatch):
    """The observer's per-capture memo of op costs (op_cost_key) gives the utilization record
    computed without it."""
    from peakmem.capture import capture_callable
    from peakmem.utilization import observer

    _without_entry_memo(monkeypatch)  # the meta cache's per-key memo would answer first
    calls = []
    fresh = observer.meta_op_cost

    def counted(*args, **kwargs):
        calls.append(1)
        return fresh(*args, **kwargs)

    monkeypatch.setattr(observer, "meta_op_cost", counted)
    remembered = capture_callable(_cnn_job, gpu=a100, stack=stack24, steps="all")
    costed = len(calls)
    monkeypatch.setattr(observer, "op_cost_key", lambda *args: None)
    without = capture_callable(_cnn_job, gpu=a100, stack=stack24, steps="all")
    assert remembered.error is None and without.error is None
    assert remembered.trace.meta["utilization"]["ops"]  # a steady step was recorded
    assert remembered.trace.meta["utilization"] == without.trace.meta["utilization"]
    assert remembered.trace == without.trace
    assert costed < len(calls) - costed  # the memo was used


def test_the_observers_fast_path_costs_every_op_as_op_cost(a100, stack24, monkeypatch):
    """The observer's per-overload facts and device lists (meta_op_cost) give, op for op, what
    `op_cost` computes from the call alone, and no cost where op_cost has none."""
    from peakmem.capture import capture_callable
    from peakmem.utilization import observer
    from peakmem.utilization.op_costs import op_cost

    seen: list[str] = []
    fast = observer.OpCostObserver._cost

    def checked(self, facts, func, args, kwargs, out, inputs, outputs):
        cost = fast(self, facts, func, args, kwargs, out, inputs, outputs)
        assert cost == op_cost(func, args, kwargs, out), func
        seen.append(facts.family if cost is not None else "none")
        return cost

    monkeypatch.setattr(observer.OpCostObserver, "_cost", checked)
    result = capture_callable(_cnn_job, gpu=a100, stack=stack24, steps="all")
    assert result.error is None and result.trace.meta["utilization"]["ops"]
    assert not any("could not be recorded" in note for note in result.notes)
    assert {"conv", "elem", "red", "foreach", "none"} <= set(seen)


def test_the_cost_key_tells_apart_what_a_cost_reads():
    from peakmem.utilization.op_costs import op_cost_key

    x, w = meta(2, 3, 8, 8), meta(16, 3, 3, 3)
    args = (x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    key = op_cost_key(aten.convolution.default, args, {}, None)
    assert key == op_cost_key(aten.convolution.default, (meta(2, 3, 8, 8), *args[1:]), {}, None)
    strided = (x, w, None, [2, 2], *args[4:])
    assert key != op_cost_key(aten.convolution.default, strided, {}, None)
    assert key != op_cost_key(aten.convolution.default, (torch.empty(2, 3, 8, 8), *args[1:]),
                              {}, None)  # a real host tensor is no device traffic
    assert key != op_cost_key(aten.convolution.default, (meta(2, 3, 8, 8).to(torch.float16),
                                                         *args[1:]), {}, None)
    assert key != op_cost_key(aten.convolution.default, (x.transpose(2, 3), *args[1:]), {}, None)
    assert key != op_cost_key(aten.sum.dim_IntList, args, {}, None)
    assert op_cost_key(aten.add.Tensor, (x, object()), {}, None) is None


def test_the_observers_tensor_walk_finds_what_the_isinstance_walk_finds():
    """observer._tensors_of (exact types first): the tensors, in order, of plain values, lists,
    tuples, nested foreach lists, namedtuples, torch.Size and tensor subclasses."""
    import collections

    from peakmem.utilization.observer import _tensors_of

    class Sub(torch.Tensor):
        pass

    def reference(values):
        found = []
        for value in values:
            if isinstance(value, torch.Tensor):
                found.append(value)
            elif isinstance(value, (list, tuple)):
                for item in value:
                    if isinstance(item, torch.Tensor):
                        found.append(item)
                    elif isinstance(item, (list, tuple)):
                        found.extend(t for t in item if isinstance(t, torch.Tensor))
        return found

    pair = collections.namedtuple("pair", "a b")
    a, b, c = meta(2), torch.nn.Parameter(meta(3)), torch.empty(1).as_subclass(Sub)
    values = (a, 1, 2.0, None, torch.float32, [b, [c, a], 3], (c,), pair(a, [b]),
              torch.Size([2, 3]), "x", {"k": a}, c, [[[a]]])
    got = _tensors_of(values)
    assert [id(t) for t in got] == [id(t) for t in reference(values)]
    assert len(got) == 8  # two levels: the innermost [a] of [[[a]]] is not walked
