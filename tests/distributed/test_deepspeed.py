"""DeepSpeed ZeRO 1/2/3 under the fake process group (DeepSpeed itself runs): each rank holds its
partition of the optimizer state (ZeRO 1+), of the gradients (2+) and of the parameters (3)."""

import importlib.util
from collections import Counter

import pytest

from peakmem.estimate import estimate_command
from tests.capture.capture_helpers import allocations

# not imported here: DeepSpeed picks its accelerator when first imported, which must happen in
# the capture (where the fake GPU is)
if importlib.util.find_spec("deepspeed") is None:
    pytest.skip("deepspeed is not installed", allow_module_level=True)

WIDTH = 256
NUMEL = 2 * (WIDTH * WIDTH + WIDTH)  # two Linear(256, 256)


SCRIPT = """
import sys, torch, deepspeed
deepspeed.init_distributed()
model = torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU(),
                            torch.nn.Linear(WIDTH, WIDTH))
config = {"train_micro_batch_size_per_gpu": 8, "zero_optimization": {"stage": int(sys.argv[-1])},
          "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "torch_adam": True}}}
engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                       config=config)
for _ in range(2):
    loss = engine(torch.randn(8, WIDTH, device=engine.device)).sum()
    engine.backward(loss)
    engine.step()
""".replace("WIDTH", str(WIDTH))


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_zero_partitions_the_optimizer_state(tmp_path, stage):
    """Through the `deepspeed` launcher, in a child process of its own (DeepSpeed keeps its
    groups in module globals: one run per process, as in real use)."""
    world = 4
    script = tmp_path / "zero.py"
    script.write_text(SCRIPT)
    estimate = estimate_command(["deepspeed", "--num_gpus", str(world), str(script), str(stage)],
                                gpu="a100-40gb", torch_version="2.4.1", steps=2, mode="fake")
    result = estimate.capture
    assert estimate.distributed["launcher"] == "deepspeed"
    assert estimate.distributed["world_size"] == world
    partition = 4 * NUMEL // world
    totals = Counter()
    for size, tag in allocations(result.trace):
        totals[tag.category] += size
    # Adam's two moments of the rank's fp32 partition
    assert totals["optimizer_state"] == 2 * partition
    # the rank's fp32 partition of the parameters (the master copy the optimizer updates); ZeRO-3
    # also keeps the model's own partition (`fp16_partitioned_groups_flat`, fp32 here), which
    # it clones for the master: stage3.py shares it only where `tensor.device == self.device`,
    # a torch.device compared with the string "cuda:0" (never equal)
    sizes = Counter(size for size, tag in allocations(result.trace) if tag.category == "parameter")
    assert sizes[partition] == (2 if stage == 3 else 1)
    assert result.libraries.get("nccl", 0) > 0


BF16_SCRIPT = SCRIPT.replace('"optimizer"', '"bf16": {"enabled": True}, "optimizer"').replace(
    "torch.randn(8, WIDTH, device=engine.device)".replace("WIDTH", str(WIDTH)),
    f"torch.randn(8, {WIDTH}, device=engine.device, dtype=torch.bfloat16)")


def test_zero3_flat_partitions_are_parameters_and_gradients(tmp_path):
    """ZeRO-3's 16-bit parameter partition and its gradient partition are flat buffers no
    module owns (made by a host-to-device copy and a factory outside forward): labelled
    parameter and gradient, not input / other (capture/zero_partitions.py)."""
    world = 2
    script = tmp_path / "zero.py"
    script.write_text(BF16_SCRIPT)
    estimate = estimate_command(["deepspeed", "--num_gpus", str(world), str(script), "3"],
                                gpu="a100-40gb", torch_version="2.4.1", steps=2, mode="fake")
    result = estimate.capture
    assert result.error is None, result.error_text
    bf16_partition = 2 * NUMEL // world  # 65,792 elements a rank (each parameter split evenly)
    by_category: dict[str, Counter] = {}
    for size, tag in allocations(result.trace):
        by_category.setdefault(tag.category, Counter())[size] += 1
    assert by_category["optimizer_state"][2 * bf16_partition] == 2  # Adam's fp32 moments
    assert by_category["parameter"][2 * bf16_partition] == 1  # the fp32 master partition
    assert by_category["parameter"][bf16_partition] == 1  # the bf16 partition
    assert by_category["gradient"][bf16_partition] == 1  # the bf16 gradient partition
    assert by_category.get("input", Counter())[bf16_partition] == 0
