"""Launch shapes, occupancy and waves, each against numbers worked out by hand."""

import pytest
import torch

from peakmem.profiles import load_gpu
from peakmem.utilization import kernel_shapes as ks
from peakmem.utilization.kernel_shapes import Launch, OpView, SmLimits
from peakmem.utilization.model import StepOps, shapes_of
from peakmem.utilization.op_costs import op_cost

aten = torch.ops.aten


@pytest.fixture(scope="module")
def a100() -> SmLimits:
    return SmLimits.of(load_gpu("a100-40gb"))


def test_limits_come_from_the_profile():
    a100 = SmLimits.of(load_gpu("a100-40gb"))
    assert (a100.sms, a100.max_warps, a100.max_blocks) == (108, 64, 32)
    assert a100.shared_bytes == 164 * 1024 and a100.registers == 65536
    ada = SmLimits.of(load_gpu("rtx4060-8gb"))
    assert (ada.sms, ada.max_warps, ada.max_blocks, ada.shared_bytes) == (24, 48, 24, 100 * 1024)


def test_every_gpu_profile_with_throughput_has_shared_memory_per_sm():
    from peakmem.profiles.loader import _gpus

    for profile in _gpus().values():
        if profile.throughput:
            assert profile.throughput["shared_memory_kb_per_sm"] in (96, 100, 164, 228), profile.name


def test_reduce_config_full_reduction_splits_across_blocks(a100):
    # sum of 64000 floats: vectorised (dim0 = 16000), block 512 x 1, 125 values per thread
    # (< 256): one block
    assert ks.reduce_config(1, 64000, True, a100) == Launch(1, 512, 2048, 32)
    # 1e6 floats: 1954 values per thread >= 256 and grid 1 <= 108 x 4: split across
    # max(min(ceil(432 / 1), ceil(1954 / 16)), ceil(1954 / 256)) = 123 blocks
    assert ks.reduce_config(1, 1_000_000, True, a100).blocks == 123


def test_reduce_config_rows_and_columns(a100):
    # 64 rows of 1000 (the last dim): block 32 x 16 = 512; 32 values per thread < 16 x 16, so
    # each warp keeps its own output: 16 outputs per block, 4 blocks
    launch = ks.reduce_config(64, 1000, True, a100)
    assert (launch.blocks, launch.threads) == (4, 512)
    # a bias gradient: (256, 1024) summed over dim 0 -- outputs contiguous, 4-wide vectors:
    # at most 128 threads, block 32 x 4, 8 blocks of 32 lanes x 4 outputs
    launch = ks.reduce_config(1024, 256, False, a100)
    assert (launch.blocks, launch.threads) == (8, 128)


def test_softmax_persistent_and_block_per_row(a100):
    # 64 rows of 10 classes: 16 lanes per row, 2 rows per warp, 8 warps per 128-thread block
    small = ks.softmax_launch(OpView(0, 640, 10, True, 1, 0), a100)
    assert (small.blocks, small.threads) == (4, 128)
    # rows of 5000: one block per row, 1024 threads (5000 / ILP 4 >= 1024)
    big = ks.softmax_launch(OpView(0, 8 * 5000, 5000, True, 1, 0), a100)
    assert (big.blocks, big.threads) == (8, 1024)


def test_batch_norm_is_one_block_per_channel(a100):
    x = torch.empty(8, 16, 32, 32, device="meta")
    args = (x, None, None, None, None, True, 0.1, 1e-5)
    cost = op_cost(aten.native_batch_norm.default, args, {}, aten.native_batch_norm.default(*args))
    assert (cost.reduced, cost.inner) == (8 * 32 * 32, False)
    view = OpView(cost.flops, cost.work, cost.reduced, cost.inner, 1, cost.bytes)
    assert ks.batch_norm_launch(view, a100).blocks == 16


def test_reduction_geometry_is_read_from_the_op():
    x = torch.empty(64, 1000, device="meta")
    soft = op_cost(aten._softmax.default, (x, 1, False), {}, aten._softmax.default(x, 1, False))
    assert (soft.reduced, soft.inner) == (1000, True)
    bias = op_cost(aten.sum.dim_IntList, (x, [0]), {}, aten.sum.dim_IntList(x, [0]))
    assert (bias.reduced, bias.inner, bias.work) == (64, False, 1000)
    norm_args = (x, [1000], None, None, 1e-5)
    norm = op_cost(aten.native_layer_norm.default, norm_args, {},
                   aten.native_layer_norm.default(*norm_args))
    assert (norm.reduced, norm.inner) == (1000, True)


def test_occupancy_limits(a100):
    # 128x128 tile: 256 threads (8 warps), 48 KiB, 128 registers: warps allow 8 blocks, shared
    # memory 3 (164 / 48), registers 2 (65536 / (4096 x 8))
    assert ks.resident_blocks(Launch(1, 256, 48 * 1024, 128), a100) == 2
    # TensorIterator: 4 warps, 32 registers: 16 by warps (64 / 4), 16 by registers
    assert ks.resident_blocks(Launch(1, 128, 0, 32), a100) == 16
    # the same on Ada (48 warps per SM): 12
    ada = SmLimits.of(load_gpu("rtx4060-8gb"))
    assert ks.resident_blocks(Launch(1, 128, 0, 32), ada) == 12


def test_wave_quantisation(a100):
    tile = (256, 48 * 1024, 128)  # 2 resident per SM: 216 blocks per wave
    full = ks.waves_of(Launch(216, *tile), a100)
    assert (full.waves, full.sm_fill) == (1, 1.0)
    assert full.occupancy == pytest.approx(216 * 8 / 108 / 64)  # 0.25
    # one block more: a second wave with one block on one SM
    tail = ks.waves_of(Launch(217, *tile), a100)
    assert tail.waves == 2
    assert tail.sm_fill == pytest.approx((108 + 1) / (2 * 108))
    assert tail.occupancy == pytest.approx(217 * 8 / (2 * 108 * 64))
    # a small kernel: 8 blocks keep 8 of 108 SMs
    small = ks.waves_of(Launch(8, 128, 0, 32), a100)
    assert small.sm_fill == pytest.approx(8 / 108)


def test_foreach_launches_48_tensors_at_a_time(a100):
    launch = ks.foreach_launch(OpView(0, 100 * 1000, 0, True, 100, 0), a100)
    # ceil(100 / 48) = 3 launches; blocks: a chunk per tensor plus one per 65536 elements of
    # the whole list (a bound on the partial chunks): 100 + 1
    assert launch.launches == 3 and launch.blocks == 101


def test_kinds_by_name_then_family():
    assert ks.kind_of("_softmax", "red") == ks.SOFTMAX
    assert ks.kind_of("native_batch_norm", "red") == ks.BATCH_NORM
    assert ks.kind_of("sum", "red") == ks.REDUCE
    assert ks.kind_of("convolution", "conv") == ks.MATRIX
    assert ks.kind_of("relu", "elem") == ks.ELEMENTWISE


def test_step_shapes_use_the_rules(a100):
    record = {
        "version": 1,
        "ops": [["sum", "red", 1.0, 4e6, 1, "f32", 1, 1_000_000, 1],
                ["relu", "elem", 1e6, 8e6, 1e6, "f32", 1]],  # an old 7-field row still parses
        "phases": ["forward", "forward"],
        "syncs_before": [0, 0],
    }
    ops = StepOps.from_meta(record)
    shapes = shapes_of(ops, a100)
    # the reduction: 123 blocks of 512 threads, 4 resident per SM: one wave over 108 SMs
    assert shapes.sm_fill[0] == 1.0
    assert shapes.occupancy[0] == pytest.approx(123 * 16 / 108 / 64)
    # relu: 1954 blocks of 128 threads, 16 per SM (1728 a wave): 2 waves, the second with 226
    assert shapes.sm_fill[1] == 1.0
    assert shapes.occupancy[1] == pytest.approx(1954 * 4 / (2 * 108 * 64))
