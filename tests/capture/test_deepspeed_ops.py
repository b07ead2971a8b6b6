"""DeepSpeed's fused optimizers (FusedAdam, FusedLion) load CUDA kernels through an op builder
that compiles them with nvcc when they are not prebuilt: in the capture their builders load an
in-place stand-in (capture/deepspeed_ops.py)."""

import importlib.util

import pytest

from peakmem.estimate import estimate_command
from tests.capture.capture_helpers import allocations

if importlib.util.find_spec("deepspeed") is None:
    pytest.skip("deepspeed is not installed", allow_module_level=True)

WIDTH = 256
NUMEL = 2 * (WIDTH * WIDTH + WIDTH)  # two Linear(256, 256)

SCRIPT = """
import sys, torch, deepspeed
model = torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU(),
                            torch.nn.Linear(WIDTH, WIDTH))
config = {"train_micro_batch_size_per_gpu": 8,
          "optimizer": {"type": [a for a in sys.argv[1:] if not a.startswith("--")][0],
                        "params": {"lr": 1e-3}}}
engine, optimizer, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                               config=config)
assert type(optimizer).__name__ == "Fused" + config["optimizer"]["type"], type(optimizer)
for _ in range(2):
    loss = engine(torch.randn(8, WIDTH, device=engine.device)).sum()
    engine.backward(loss)
    engine.step()
""".replace("WIDTH", str(WIDTH))


@pytest.mark.parametrize(("optimizer", "moments"), [("Adam", 2), ("Lion", 1)])
def test_fused_optimizer_from_the_config_steps_without_nvcc(tmp_path, optimizer, moments):
    script = tmp_path / "fused.py"
    script.write_text(SCRIPT)
    estimate = estimate_command(["deepspeed", "--num_gpus", "1", str(script), optimizer],
                                gpu="a100-40gb", torch_version="2.4.1", steps=2, mode="fake")
    result = estimate.capture
    # it stopped at FusedAdamBuilder().load(): "CUDA_HOME environment variable is not set"
    assert result.error is None, result.error_text
    state = sum(size for size, _ in allocations(result.trace, "optimizer_state"))
    assert state == moments * 4 * NUMEL  # exp_avg (and exp_avg_sq) per fp32 parameter
    assert allocations(result.trace, "temporary", phase="optimizer") == []  # the kernel's in place
