"""FSDP2's recommended initialisation under the fake group: the model built on the meta device,
`fully_shard`ed, then `to_empty(device="cuda")` and `reset_parameters()`: the init ops run on
sharded DTensor parameters (capture/dtensor_state.py: DTensor's RNG tracker state and the
sharding propagation of `uniform_` stay off the missing CUDA backend)."""

import math

import torch
from torch import nn

from peakmem.capture import capture_callable
from tests.distributed.test_ddp import set_world
from tests.distributed.test_fsdp import by_category

VOCAB, DIM = 250, 64


def test_meta_init_then_reset_parameters_on_shards(monkeypatch, a100, stack24):
    seen = {}

    def job():
        import torch.distributed as dist
        from torch.distributed.fsdp import fully_shard

        dist.init_process_group("nccl")
        with torch.device("meta"):
            model = nn.Sequential(nn.Embedding(VOCAB, DIM), nn.Linear(DIM, DIM), nn.LayerNorm(DIM))
        fully_shard(model[1])
        fully_shard(model)
        model.to_empty(device="cuda")
        for module in model:
            module.reset_parameters()  # normal_, kaiming_uniform_ / uniform_, ones_ / zeros_
        seen["local"] = [tuple(p.to_local().shape) for p in model.parameters()]
        optimizer = torch.optim.Adam(model.parameters())
        model(torch.randint(0, VOCAB, (4, 8), device="cuda")).sum().backward()
        optimizer.step()

    set_world(monkeypatch, 2, rank=1)
    result = capture_callable(job, gpu=a100, stack=stack24, steps="all")
    assert result.error is None, result.error_text
    # rank 1's rows of each parameter (dim 0 split in two)
    assert seen["local"] == [(125, DIM), (32, DIM), (32,), (32,), (32,)]
    shard = 4 * (math.ceil(VOCAB / 2) * DIM + 32 * DIM + 32 + 32 + 32)
    assert by_category(result)["parameter"] == shard
