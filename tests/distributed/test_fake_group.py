"""The fake process group: collectives are shape-correct no-ops on device tensors, plausible on
host tensors; NCCL's own buffers are allocated; groups do not outlive a capture."""

from collections import Counter

import torch

from peakmem.capture import capture_callable
from tests.capture.capture_helpers import allocations
from tests.distributed.test_ddp import set_world


def test_collectives_and_groups(monkeypatch, a100, stack24):
    set_world(monkeypatch, 4, rank=2)
    seen = {}

    def job():
        import torch.distributed as dist

        dist.init_process_group(backend="cpu:gloo,cuda:nccl")
        seen["rank"], seen["size"] = dist.get_rank(), dist.get_world_size()
        seen["backend"] = dist.get_backend()
        host = torch.tensor([1.0, 2.0])
        dist.all_reduce(host)
        seen["sum"] = host.tolist()
        gathered = [torch.zeros(2) for _ in range(4)]
        dist.all_gather(gathered, torch.tensor([3.0, 4.0]))
        seen["gathered"] = [t.tolist() for t in gathered]
        objects = [None] * 4
        dist.all_gather_object(objects, {"rank": dist.get_rank()})
        seen["objects"] = objects
        box = [{"from": 2}]
        dist.broadcast_object_list(box, src=2)  # this rank's own objects
        seen["box"] = box
        device = torch.ones(1000, device="cuda")  # 4000 bytes
        dist.all_reduce(device)
        outputs = [torch.empty(1000, device="cuda") for _ in range(4)]
        dist.all_gather(outputs, device)  # NCCL flattens the list: 4 x 4000 bytes, freed
        out = torch.empty(4000, device="cuda")
        dist.all_gather_into_tensor(out, device)
        shard = torch.empty(250, device="cuda")
        dist.reduce_scatter_tensor(shard, device)
        pair = dist.new_group([0, 2])
        dist.all_reduce(device, group=pair)
        seen["pair"] = dist.get_world_size(pair)
        dist.barrier()

    result = capture_callable(job, gpu=a100, stack=stack24)
    assert result.error is None, result.error_text
    assert (seen["rank"], seen["size"], seen["backend"]) == (2, 4, "nccl")
    assert seen["sum"] == [4.0, 8.0]  # every rank held the same values
    assert seen["gathered"] == [[3.0, 4.0]] * 4
    assert seen["objects"] == [{"rank": 2}] * 4
    assert seen["pair"] == 2 and seen["box"] == [{"from": 2}]
    sizes = Counter(size for size, _ in allocations(result.trace))
    assert sizes[4 * 4000] == 2  # the flattened all-gather scratch and `out`
    # two communicators (the world and the pair), each with NCCL's buffers outside the allocator
    each = int(stack24.library_bytes_for(a100, "nccl").value)
    assert result.libraries["nccl"] == 2 * each
    # the group is gone after the capture: the next capture initialises its own
    again = capture_callable(job, gpu=a100, stack=stack24)
    assert again.error is None, again.error_text
    import torch.distributed as dist

    assert not dist.is_initialized()


def test_nccl_memory_is_that_of_the_live_nccl_communicators(monkeypatch, a100, stack24):
    """NCCL's buffers outside the allocator belong to NCCL communicators: a gloo group's
    collectives on device tensors (gloo stages them through host memory) make none, and a
    destroyed group's communicator is freed (`ncclCommDestroy`). pytorch/examples' ddp
    main.py runs its demos one after another, each with `init_process_group("gloo")` and
    `destroy_process_group()`: 0 bytes of NCCL memory, not 3 communicators' worth."""
    set_world(monkeypatch, 2)
    each = int(stack24.library_bytes_for(a100, "nccl").value)

    def demos(backend: str, times: int):
        def job():
            import torch.distributed as dist
            from torch.nn.parallel import DistributedDataParallel

            for _ in range(times):
                dist.init_process_group(backend)
                model = DistributedDataParallel(torch.nn.Linear(8, 8).cuda(), device_ids=[0])
                model(torch.randn(2, 8)).sum().backward()
                dist.destroy_process_group()

        return job

    gloo = capture_callable(demos("gloo", 3), gpu=a100, stack=stack24)
    assert gloo.error is None, gloo.error_text
    assert gloo.libraries.get("nccl", 0) == 0
    nccl = capture_callable(demos("nccl", 3), gpu=a100, stack=stack24)
    assert nccl.error is None, nccl.error_text
    assert nccl.libraries["nccl"] == each  # one live at a time

    def pair_after_destroy():
        import torch.distributed as dist

        dist.init_process_group("nccl")
        device = torch.ones(8, device="cuda")
        dist.all_reduce(device)
        pair = dist.new_group([0, 1])
        dist.all_reduce(device, group=pair)  # two live: the world's and the pair's
        dist.destroy_process_group(pair)
        dist.destroy_process_group()
        dist.init_process_group("nccl")
        dist.all_reduce(device)  # one live again

    both = capture_callable(pair_after_destroy, gpu=a100, stack=stack24)
    assert both.error is None, both.error_text
    assert both.libraries["nccl"] == 2 * each


def test_world_size_one_without_a_launcher(monkeypatch, a100, stack24):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)

    def job():
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel

        dist.init_process_group("nccl", init_method="tcp://127.0.0.1:1?rank=0&world_size=1")
        model = DistributedDataParallel(torch.nn.Linear(8, 8).cuda())
        model(torch.randn(2, 8, device="cuda")).sum().backward()

    for _ in range(2):  # twice in one process: no "initialize the default process group twice"
        result = capture_callable(job, gpu=a100, stack=stack24)
        assert result.error is None, result.error_text
        assert "nccl" not in result.libraries  # one rank: no communicator buffers


def test_device_all_gather_of_host_built_sizes_reads_back_every_ranks_sizes(monkeypatch, a100, stack24):
    """accelerate's `pad_across_processes` (the Trainer's evaluation loop, under DeepSpeed or
    DDP) all-gathers `torch.tensor(t.shape, device=...)` and reads the sizes back to pad to the
    largest: zeros there made it pad to size 0 and fail ("expanded size of the tensor (0)")."""
    set_world(monkeypatch, 2, rank=1)
    seen = {}

    def job():
        import torch.distributed as dist

        dist.init_process_group(backend="nccl")
        size = torch.tensor([4, 32], device="cuda")[None]
        into = torch.empty(2 * size.numel(), dtype=size.dtype, device="cuda")
        dist.all_gather_into_tensor(into, size)
        seen["into"] = into.view(-1, 2).cpu().tolist()
        listed = [torch.empty_like(size) for _ in range(2)]
        dist.all_gather(listed, size)
        seen["listed"] = [t.cpu().tolist() for t in listed]
        unknown = torch.randint(1, 3, (2,), device="cuda")
        written = torch.tensor([1, 2], device="cuda").mul_(unknown)  # written with unknown values
        out = torch.empty(4, dtype=written.dtype, device="cuda")
        dist.all_gather_into_tensor(out, written)
        seen["written"] = out.cpu().tolist()

    result = capture_callable(job, gpu=a100, stack=stack24)
    assert result.error is None, result.error_text
    assert seen["into"] == [[4, 32], [4, 32]]
    assert seen["listed"] == [[[4, 32]], [[4, 32]]]
    assert seen["written"] == [0, 0, 0, 0]
