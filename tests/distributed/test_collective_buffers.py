"""Buffers of collectives are `communication` in the breakdown (capture/collective_buffers.py):
DDP's buckets, FSDP's all-gather / reduce-scatter buffers, NCCL's flattened list buffers; the
parameters' `.grad` stay `gradient`."""

import math
from collections import Counter

import pytest
import torch

from peakmem.capture import capture_callable
from peakmem.estimate.breakdown import PeakBreakdown, rounded
from peakmem.trace.events import ALLOC_KINDS, EventKind
from tests.capture.capture_helpers import allocations, live_at_end
from tests.distributed.test_ddp import IN, PARAM_BYTES, set_world, train
from tests.distributed.test_fsdp import SHAPES, fsdp1_job, fsdp2_job

# the two Linear layers of test_ddp's model, in the order DDP's rebuilt buckets take them (the
# order their gradients become ready: the last layer's first)
LAYER2 = [4 * 10, 4 * 512 * 10]  # bias, weight of Linear(512, 10)
LAYER1 = [4 * 512, 4 * IN * 512]  # bias, weight of Linear(256, 512)
SMALL_CAP_MB = 0.01
"""10,485 bytes: the rebuild closes a bucket once it reaches the cap, so layer 2's bias and
weight (20,520 bytes) make the first bucket and layer 1's (526,336 bytes) the second."""


def peak_breakdown(trace) -> PeakBreakdown:
    """What is live where allocated memory (rounded as the allocator rounds) is highest."""
    live, total, best, best_index = {}, 0, -1, 0
    for index, (kind, ident, size, _stream, _tag) in enumerate(trace.events()):
        if kind in ALLOC_KINDS:
            live[ident] = rounded(size)
            total += live[ident]
        elif kind == EventKind.FREE and ident in live:
            total -= live.pop(ident)
        if total > best:
            best, best_index = total, index
    return PeakBreakdown.at(trace, best_index)


def category_sizes(result, category) -> Counter:
    return Counter(size for size, _ in allocations(result.trace, category))


def test_ddp_buckets_are_communication_and_gradients_stay_the_grads(monkeypatch, a100, stack24):
    plain = capture_callable(train(False), gpu=a100, stack=stack24, steps=3)
    set_world(monkeypatch, 2)
    ddp = capture_callable(train(True, bucket_cap_mb=SMALL_CAP_MB), gpu=a100, stack=stack24,
                           steps=3)
    assert plain.error is None and ddp.error is None, (plain.error_text, ddp.error_text)
    buckets = [sum(LAYER2), sum(LAYER1)]
    assert sum(buckets) == PARAM_BYTES  # the buckets hold every gradient once
    # the constructor's single bucket, the parameter sync's flat copy (one flat tensor each),
    # the buckets rebuilt at the first iteration, the rebuild's broadcast of the bucket order
    # (parameter indices plus one, bucket sizes: int32) and the shape check (sizes and strides
    # of the 4 parameters, int64)
    assert category_sizes(ddp, "communication") == Counter(
        [PARAM_BYTES, PARAM_BYTES, *buckets, 4 * (4 + 1), 4 * len(buckets), 8 * 2 * 6])
    # `.grad` allocations are the plain run's, to the byte; the activations too (the rebuilt
    # buckets, made in a forward, used to end up `activation`)
    for category in ("gradient", "activation", "parameter", "optimizer_state"):
        assert category_sizes(ddp, category) == category_sizes(plain, category), category
    at_peak = peak_breakdown(ddp.trace).by_category
    assert at_peak["communication"] == sum(rounded(size) for size in buckets)
    assert at_peak.get("gradient", 0) <= sum(rounded(size) for size in LAYER1 + LAYER2)


def test_gradient_as_bucket_view_buckets_are_the_gradients(monkeypatch, a100, stack24):
    """With `gradient_as_bucket_view=True` each `.grad` is a view of its bucket after the first
    backward: the buckets are the gradients' storage, `gradient`, and no communication buffer
    is kept."""
    set_world(monkeypatch, 2)
    view = capture_callable(train(True, gradient_as_bucket_view=True, bucket_cap_mb=SMALL_CAP_MB),
                            gpu=a100, stack=stack24, steps=3)
    assert view.error is None, view.error_text
    buckets = [sum(LAYER2), sum(LAYER1)]
    assert category_sizes(view, "gradient") == Counter([PARAM_BYTES, *buckets])
    # the parameter sync's flat copy and the small broadcasts (freed at once) only
    assert category_sizes(view, "communication") == Counter(
        [PARAM_BYTES, 4 * (4 + 1), 4 * len(buckets), 8 * 2 * 6])
    at_peak = peak_breakdown(view.trace).by_category
    assert at_peak.get("communication", 0) == 0
    assert at_peak["gradient"] == sum(rounded(size) for size in buckets)


def test_fsdp2_all_gather_and_reduce_scatter_buffers_are_communication(monkeypatch, a100,
                                                                       stack24):
    world, steps = 2, 2
    set_world(monkeypatch, world)
    result = capture_callable(fsdp2_job(steps=steps), gpu=a100, stack=stack24, steps=steps)
    assert result.error is None, result.error_text
    padded = [(math.ceil(rows / world), cols) for rows, cols in SHAPES]
    gathered = [4 * world * (rows * cols + rows) for rows, cols in padded]
    # each step, every layer: its forward all-gather, its backward all-gather (it resharded
    # after the forward) and its reduce-scatter input, each world x the layer's padded shard
    expected = Counter()
    for size in gathered:
        expected[size] += 3 * steps
    assert category_sizes(result, "communication") == expected
    by_phase = Counter(tag.phase for _size, tag in allocations(result.trace, "communication"))
    assert by_phase == {"forward": len(SHAPES) * steps, "backward": 2 * len(SHAPES) * steps}
    # the sharded gradients are views of the reduce-scatter outputs: still `gradient`
    shard = sum(4 * (rows * cols + rows) for rows, cols in padded)
    assert sum(category_sizes(result, "gradient").elements()) == steps * shard


@pytest.mark.filterwarnings("ignore:FSDP is switching to use `NO_SHARD`")
def test_fsdp1_unsharded_flat_parameter_is_communication(monkeypatch, a100, stack24):
    world = 3
    set_world(monkeypatch, world)
    result = capture_callable(fsdp1_job, gpu=a100, stack=stack24, steps=2)
    assert result.error is None, result.error_text
    numel = sum(rows * cols + rows for rows, cols in SHAPES)
    shard = 4 * math.ceil(numel / world)
    # the root unit gathers its flat parameter once per step and keeps it until the backward
    assert category_sizes(result, "communication") == Counter({world * shard: 2})
    assert sum(category_sizes(result, "gradient").elements()) == 2 * shard


def test_list_all_gather_flat_buffer_is_communication(monkeypatch, a100, stack24):
    set_world(monkeypatch, 4)

    def job():
        import torch.distributed as dist

        dist.init_process_group("nccl")
        tensor = torch.empty(1000, device="cuda")
        outputs = [torch.empty_like(tensor) for _ in range(4)]
        dist.all_gather(outputs, tensor)

    result = capture_callable(job, gpu=a100, stack=stack24, steps="all")
    assert result.error is None, result.error_text
    # ProcessGroupNCCL's newLikeFlat: one buffer of the four outputs, freed when it ends
    assert category_sizes(result, "communication") == Counter({4 * 4000: 1})
    assert 4 * 4000 not in live_at_end(result.trace)


def fsdp2_then_eval_job():
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    from tests.distributed.test_fsdp import model

    dist.init_process_group("nccl")
    net = model().cuda()
    for layer in net:
        fully_shard(layer)
    fully_shard(net)
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)
    net(torch.randn(8, SHAPES[0][1], device="cuda")).sum().backward()
    optimizer.step()
    net.eval()
    with torch.no_grad():  # an evaluation: its blocks are `activation` of the eval phase
        net(torch.randn(8, SHAPES[0][1], device="cuda"))


def test_fsdp2_all_gathers_in_an_evaluation_are_communication(monkeypatch, a100, stack24):
    world = 2
    set_world(monkeypatch, world)
    result = capture_callable(fsdp2_then_eval_job, gpu=a100, stack=stack24, steps="all")
    assert result.error is None, result.error_text
    padded = [(math.ceil(rows / world), cols) for rows, cols in SHAPES]
    gathered = [4 * world * (rows * cols + rows) for rows, cols in padded]
    # the evaluation's forward all-gathers every layer once, as the training forward does
    in_eval = Counter(size for size, tag in allocations(result.trace, "communication")
                      if tag.phase == "eval")
    assert in_eval == Counter(gathered)
    assert not [size for size, tag in allocations(result.trace, "activation", phase="eval")
                if size in gathered]
