"""`UntypedStorage.resize_` on device storages is traced as CUDA's `resize_bytes_cuda` does it
(capture/storage_resize.py): FSDP's unsharded parameters are freed after their layer ran."""

import math

import pytest
import torch

from peakmem.capture import capture_callable
from peakmem.trace.events import EventKind
from tests.distributed.test_ddp import set_world
from tests.distributed.test_fsdp import SHAPES, model


def memory_events(trace) -> list[tuple[str, int]]:
    """("alloc", size) / ("free", size) of every allocation event, in order."""
    sizes, out = {}, []
    for kind, ident, size, _stream, _tag in trace.events():
        if kind == EventKind.ALLOC:
            sizes[ident] = size
            out.append(("alloc", size))
        elif kind == EventKind.FREE and ident in sizes:
            out.append(("free", sizes.pop(ident)))
    return out


def test_resize_frees_and_reallocates_a_device_storage(a100, stack24):
    kept = {}

    def job():
        tensor = torch.empty(1000, device="cuda")  # 4000 bytes
        storage = tensor.untyped_storage()
        storage.resize_(0)  # freed
        storage.resize_(4000)  # allocated again
        storage.resize_(8000)  # a new block, then the old one freed
        storage.resize_(8000)  # same size: nothing
        host = torch.empty(10)
        host.untyped_storage().resize_(0)  # host memory: not traced
        kept["tensor"] = tensor

    result = capture_callable(job, gpu=a100, stack=stack24, steps="all")
    assert result.error is None, result.error_text
    assert memory_events(result.trace) == [
        ("alloc", 4000), ("free", 4000), ("alloc", 4000), ("alloc", 8000), ("free", 4000),
    ]
    tags = [result.trace.tag_of(i) for i, kind in enumerate(result.trace.kinds)
            if kind == EventKind.ALLOC]
    assert [tag.op for tag in tags[1:]] == ["storage.resize_", "storage.resize_"]


def test_typed_storage_resize_is_traced_too(a100, stack24):
    """FSDP1 frees its flat parameter through `TypedStorage._resize_` (element counts)."""
    def job():
        tensor = torch.empty(100, device="cuda", dtype=torch.float16)
        tensor._typed_storage()._resize_(0)
        tensor._typed_storage()._resize_(300)

    result = capture_callable(job, gpu=a100, stack=stack24, steps="all")
    assert result.error is None, result.error_text
    assert memory_events(result.trace)[:3] == [("alloc", 200), ("free", 200), ("alloc", 600)]


def live_at_mark(trace, label: str) -> list[int]:
    """Sizes of the allocations live at the first MARK `label`."""
    live = {}
    for index, (kind, ident, size, _stream, _tag) in enumerate(trace.events()):
        if kind == EventKind.ALLOC:
            live[ident] = size
        elif kind == EventKind.FREE:
            live.pop(ident, None)
        elif kind == EventKind.MARK and trace.tag_of(index).op == label:
            return sorted(live.values())
    raise AssertionError(f"no mark {label!r}")


def fsdp2_one_step(reshard_after_forward: bool):
    def job():
        import torch.distributed as dist
        from torch.distributed.fsdp import fully_shard

        dist.init_process_group("nccl")
        net = model().cuda()
        for layer in net:
            fully_shard(layer, reshard_after_forward=reshard_after_forward)
        fully_shard(net, reshard_after_forward=reshard_after_forward)
        optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)
        net(torch.randn(8, SHAPES[0][1], device="cuda")).sum().backward()
        optimizer.step()
    return job


@pytest.mark.parametrize("reshard", [True, False])
def test_fsdp2_unsharded_parameters_are_freed_after_forward(monkeypatch, a100, stack24, reshard):
    """With reshard_after_forward=True, no layer's unsharded (all-gathered, padded) weight or
    bias is live when backward starts; with False, every one of them still is."""
    world = 4
    set_world(monkeypatch, world)
    result = capture_callable(fsdp2_one_step(reshard), gpu=a100, stack=stack24, steps=1)
    assert result.error is None, result.error_text
    live = live_at_mark(result.trace, "backward")
    unsharded = []
    for rows, cols in SHAPES:
        padded = math.ceil(rows / world)
        unsharded += [4 * world * padded * cols, 4 * world * padded]
    held = [size for size in unsharded if size in live]
    assert held == ([] if reshard else unsharded)
    # and after the optimizer step every layer is resharded in both cases
    assert not any(size in live_at_mark(result.trace, "step 1")
                   for size in unsharded if size > 4096)


@pytest.mark.filterwarnings("ignore:FSDP is switching to use `NO_SHARD`")
def test_fsdp1_unsharded_flat_parameter_is_freed_after_forward(monkeypatch, a100, stack24):
    world = 3
    set_world(monkeypatch, world)

    def job():
        import torch.distributed as dist
        from torch.distributed.fsdp import FullyShardedDataParallel
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        dist.init_process_group("nccl")
        net = FullyShardedDataParallel(model().cuda(), device_id=0,
                                       auto_wrap_policy=ModuleWrapPolicy({torch.nn.Linear}))
        net(torch.randn(8, SHAPES[0][1], device="cuda")).sum().backward()

    result = capture_callable(job, gpu=a100, stack=stack24, steps="all")
    assert result.error is None, result.error_text
    events = memory_events(result.trace)
    live = live_at_mark(result.trace, "backward")
    for rows, cols in SHAPES:  # each Linear is one FSDP unit: its padded flat parameter
        unsharded_flat = 4 * world * math.ceil((rows * cols + rows) / world)
        assert events.count(("alloc", unsharded_flat)) >= 2  # forward and backward all-gathers
        assert unsharded_flat not in live


def test_a_tensor_grown_in_place_gets_a_new_block(a100, stack24):
    """`Tensor.resize_` past its storage and an `out=` op into a too-small tensor grow the
    storage: a new block, then the old one freed; shrinking keeps the block (CUDA too)."""
    kept = {}

    def job():
        grown = torch.empty(10, device="cuda")  # 40 bytes
        grown.resize_(2000)  # 8000 bytes: a new block, the 40 freed
        grown.resize_(5)  # smaller: the storage keeps its 8000
        out = torch.empty(2, device="cuda")  # 8 bytes
        torch.mm(torch.ones(30, 40, device="cuda"), torch.ones(40, 50, device="cuda"), out=out)
        kept["tensors"] = (grown, out)

    result = capture_callable(job, gpu=a100, stack=stack24, steps="all")
    assert result.error is None, result.error_text
    events = [event for event in memory_events(result.trace) if event[1] < 2**20]
    assert events[:3] == [("alloc", 40), ("alloc", 8000), ("free", 40)]
    assert ("alloc", 6000) in events and events.index(("free", 8)) > events.index(("alloc", 6000))
