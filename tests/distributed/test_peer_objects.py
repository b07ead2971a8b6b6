"""Object collectives answer each peer's object where a library gathers what differs by rank by
construction (capture/peer_objects.py): FSDP1's optimizer state dict with use_orig_params, whose
ranks each hold optimizer state for the parameters their shard meets."""

import pytest
import torch

from peakmem.capture import capture_callable
from peakmem.capture.peer_objects import local_numel
from tests.distributed.test_ddp import set_world

# 64*256 + 256 + 256*256 + 256 + 4*256 + 4 = 83,460 elements: rank 0's half (41,730) ends inside
# the second weight: rank 0 holds no optimizer state for its bias or the last layer's
SHAPES = [(256, 64), (256, 256), (4, 256)]


def net() -> torch.nn.Module:
    return torch.nn.Sequential(*(torch.nn.Linear(cols, rows) for rows, cols in SHAPES))


@pytest.mark.parametrize("rank", [0, 1])
def test_fsdp1_full_optimizer_state_dict_gathers_every_ranks_keys(monkeypatch, a100, stack24, rank):
    seen = {}

    def job():
        import torch.distributed as dist
        from torch.distributed.fsdp import (
            FullOptimStateDictConfig,
            FullStateDictConfig,
            StateDictType,
        )
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        dist.init_process_group("nccl")
        model = FSDP(net().cuda(), use_orig_params=True, device_id=rank)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        for _ in range(2):
            model(torch.randn(8, 64, device="cuda")).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
        seen["local"] = sorted(name.removeprefix("_fsdp_wrapped_module.")
                               for name, p in model.named_parameters() if p.numel())
        seen["spans"] = [local_numel(model._flat_param, i, peer) for peer in (0, 1)
                         for i in range(6)]
        with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT,
                                  FullStateDictConfig(offload_to_cpu=True, rank0_only=False),
                                  FullOptimStateDictConfig(offload_to_cpu=True, rank0_only=False)):
            state = FSDP.optim_state_dict(model, optimizer)["state"]
        seen["state"] = {name: (tuple(s["exp_avg"].shape), float(s["step"])) for name, s in state.items()}

    set_world(monkeypatch, 2, rank=rank)
    result = capture_callable(job, gpu=a100, stack=stack24, steps="all")
    assert result.error is None, result.error_text
    # this rank's shard holds only some of the parameters...
    first = ["0.bias", "0.weight", "1.weight"]
    assert seen["local"] == (first if rank == 0 else ["1.bias", "1.weight", "2.bias", "2.weight"])
    # (each parameter's elements on rank 0 and rank 1 add up to the parameter)
    sizes = [256 * 64, 256, 256 * 256, 256, 4 * 256, 4]
    assert [a + b for a, b in zip(seen["spans"][:6], seen["spans"][6:], strict=True)] == sizes
    # ...but the full optimizer state dict has every parameter's, whole, with its step
    expected = {f"{i}.weight": ((rows, cols), 2.0) for i, (rows, cols) in enumerate(SHAPES)}
    expected.update({f"{i}.bias": ((rows,), 2.0) for i, (rows, _) in enumerate(SHAPES)})
    assert seen["state"] == expected


def test_a_peer_object_that_cannot_be_worked_out_is_noted(monkeypatch, a100, stack24):
    from peakmem.capture import peer_objects

    def unknown(frame, mine, peer):
        raise LookupError("no layout")

    def gather_keys():  # stands for a library function whose peers' objects differ
        import torch.distributed as dist

        found = [None, None]
        dist.all_gather_object(found, ["mine"])
        return found

    monkeypatch.setitem(peer_objects.PEER_ANSWERS, (__name__, "gather_keys"), unknown)
    seen = {}

    def job():
        import torch.distributed as dist

        dist.init_process_group("nccl")
        seen["objects"] = gather_keys()

    set_world(monkeypatch, 2, rank=0)
    result = capture_callable(job, gpu=a100, stack=stack24, steps="all")
    assert result.error is None, result.error_text
    assert seen["objects"] == [["mine"], ["mine"]]
    assert any("gather_keys could not be worked out (LookupError: no layout)" in note
               for note in result.notes), result.notes
