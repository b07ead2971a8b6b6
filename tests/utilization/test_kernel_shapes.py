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
    # a 128x128 tile: 8 warps with 4 loads in flight each saturate their SM (block share
    # min(1, 8 x 4 / 16) = 1); 2 resident per SM: 216 blocks per wave, 2 block-times
    tile = (256, 48 * 1024, 128, 1.0, 4)
    assert ks.block_share(Launch(216, *tile)) == 1.0
    full = ks.waves_of(Launch(216, *tile), a100)
    assert (full.waves, full.sm_fill) == (1, 1.0)
    assert full.occupancy == pytest.approx(216 * 8 / 108 / 64)  # 0.25
    # one block more: a second wave of one block on one SM, alone on it: 1 block-time, not 2
    tail = ks.waves_of(Launch(217, *tile), a100)
    assert tail.waves == 2
    # busy SM-time 108 x 2 + 1 over 108 SMs x (2 + 1) block-times
    assert tail.sm_fill == pytest.approx(217 / (108 * 3))
    # resident warps x time: 216 blocks x 8 warps x 2 block-times + 1 x 8 x 1
    assert tail.occupancy == pytest.approx((216 * 2 + 1) * 8 / (108 * 3 * 64))
    # blocks that cannot saturate their SM (8 warps, one load each: share 0.5) run side by
    # side: both waves take one block-time, the tail keeps 1 of 108 SMs for half the kernel
    light = ks.waves_of(Launch(217, 256, 48 * 1024, 128), a100)
    assert light.sm_fill == pytest.approx((108 + 1) / (2 * 108))
    assert light.occupancy == pytest.approx(217 * 8 / (2 * 108 * 64))
    # a small kernel: 8 blocks keep 8 of 108 SMs
    small = ks.waves_of(Launch(8, 128, 0, 32), a100)
    assert small.sm_fill == pytest.approx(8 / 108)


def test_matrix_tile_by_wave_fill(a100):
    # 120 x 16384 outputs, K = 128 (no split-K). SM fill of each tile's waves:
    # 128x128: 120 blocks, 2 per SM: 12 SMs hold 2 (2 block-times), 96 hold 1: 120 / 216
    # 128x64: 240 blocks, 3 per SM: 24 SMs x 3 + 84 x 2 over 108 x 3 = 240 / 324
    # 64x64: 480 blocks, 4 per SM (shared memory): a full wave of 432 (4 block-times) and
    #   48 on their own SMs (1): 480 / (108 x 5)
    # 64x32: 960 blocks, 6 per SM: 648 (6 block-times), then 96 SMs x 3 + 12 x 2 (3):
    #   960 / (108 x 9) = 0.988
    # 32x32: 64 threads, share 2 x 4 / 16 = 0.5: fill 1.0, not 0.05 more than 0.988
    work = 120 * 16384
    launch = ks.matrix_launch(OpView(2 * work * 128, work, 1, True, 1, 0), a100)
    assert (launch.blocks, launch.threads) == (960, 128)
    assert ks.waves_of(launch, a100).sm_fill == pytest.approx(960 / (108 * 9))
    # 216 x 16384 outputs: the 128x128 tile fills two per SM exactly and is kept
    work = 216 * 16384
    launch = ks.matrix_launch(OpView(2 * work * 128, work, 1, True, 1, 0), a100)
    assert (launch.blocks, launch.threads) == (216, 256)


def test_output_vectorised_reductions_keep_four_loads_in_flight(a100):
    # a bias gradient (256 rows summed into 1024 contiguous outputs): Reduce.cuh's
    # thread_reduce_impl issues vt0 = 4 loads of 4 outputs before adding them
    column = ks.reduce_config(1024, 256, False, a100)
    assert column.loads_in_flight == 4
    # along a contiguous reduced dimension: one 4-wide load at a time
    assert ks.reduce_config(64, 1000, True, a100).loads_in_flight == 1
    record = {
        "version": 1,
        "ops": [["sum", "red", 1024.0, 256 * 1024 * 4 + 4096, 1024, "f32", 1, 256, 0]],
        "phases": ["backward"],
        "syncs_before": [0],
    }
    shapes = shapes_of(StepOps.from_meta(record), a100)
    # 8 blocks x 4 warps on 108 SMs: 32 / 108 resident warps per SM, each with 4 loads in
    # flight: 32 x 4 / (108 x 16) of the DRAM bandwidth (4x what single loads would draw)
    assert shapes.occupancy[0] == pytest.approx(32 / (108 * 64))
    assert shapes.memory_parallel[0] == pytest.approx(32 * 4 / (108 * 16))


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
    # the reduction: 123 blocks of 512 threads (16 warps: each saturates its SM), 4 resident per
    # SM: 15 SMs hold 2 blocks (2 block-times), 93 hold 1
    assert shapes.sm_fill[0] == pytest.approx(123 / 216)
    assert shapes.occupancy[0] == pytest.approx((15 * 2 * 2 + 93) * 16 / (108 * 2 * 64))
    # relu: 1954 blocks of 128 threads (share 4 / 16), 16 per SM (1728 a wave, 4 block-times),
    # then 226: 10 SMs with 3, 98 with 2, below saturation (1 block-time)
    assert shapes.sm_fill[1] == 1.0
    assert shapes.occupancy[1] == pytest.approx(
        (1728 * 4 + 10 * 3 + 98 * 2) * 4 / (108 * 5 * 64)
    )
