"""DTensor's sharding-propagation caches are reset around each capture (capture/dtensor_state.py):
ranks captured one after another in ONE process (`estimate_command(..., isolate=False)`, the
Python API) each get their own rank's shards. The caches key decisions by op schema, which holds
neither the rank nor its device, so without the reset the second rank reused the first's."""

from collections import Counter

from peakmem.capture import capture_callable
from tests.capture.capture_helpers import allocations
from tests.distributed.test_ddp import set_world
from tests.distributed.test_tensor_parallel import OUT, held, tp_job, tp_local_bytes


def totals(result) -> Counter:
    found = Counter()
    for size, tag in allocations(result.trace):
        found[tag.category] += size
    return found


def test_ranks_captured_in_one_process_get_their_own_shards(monkeypatch, a100, stack24):
    world = 4
    for rank in (0, world - 1, 0):
        set_world(monkeypatch, world, rank=rank)
        result = capture_callable(tp_job(world), gpu=a100, stack=stack24, steps=2)
        assert result.error is None, result.error_text
        found = totals(result)
        local = tp_local_bytes(world, rank)
        assert found["optimizer_state"] == 2 * local, rank
        assert found["gradient"] == 2 * local, rank
    assert held(OUT, world, world - 1) < held(OUT, world, 0)  # the ranks differ
