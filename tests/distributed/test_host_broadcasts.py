"""`broadcast_object_list` / `scatter_object_list` under the fake group (capture/host_broadcasts.py):
a rank other than the source gets plausible values (its own), never garbage, and nothing is
unpickled."""

import pytest

from peakmem.capture import capture_callable
from tests.distributed.test_ddp import set_world


@pytest.mark.parametrize("rank", [0, 3])
def test_object_collectives_keep_this_ranks_values(monkeypatch, a100, stack24, rank):
    seen = {}

    def job():
        import torch.distributed as dist

        dist.init_process_group("nccl")
        objects = [{"log_dir": "runs/7"}, 42]
        dist.broadcast_object_list(objects, src=0)
        seen["broadcast"] = objects
        placeholders = [None]
        dist.broadcast_object_list(placeholders, src=0)
        seen["placeholders"] = placeholders
        out = [None]
        dist.scatter_object_list(out, [f"for rank {r}" for r in range(4)], src=rank)
        seen["scattered"] = out[0]
        nothing = ["kept"]
        dist.scatter_object_list(nothing, None, src=0)
        seen["not the source"] = nothing[0]

    set_world(monkeypatch, 4, rank=rank)
    from torch.distributed import distributed_c10d

    def unpickled(*args, **kwargs):
        raise AssertionError("an object collective unpickled bytes")

    monkeypatch.setattr(distributed_c10d, "_tensor_to_object", unpickled)
    result = capture_callable(job, gpu=a100, stack=stack24, steps="all")
    assert result.error is None, result.error_text
    assert seen["broadcast"] == [{"log_dir": "runs/7"}, 42]
    assert seen["placeholders"] == [None]
    assert seen["scattered"] == f"for rank {rank}"
    assert seen["not the source"] == "kept"
