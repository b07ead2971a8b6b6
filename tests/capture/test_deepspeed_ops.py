"""DeepSpeed's JIT-built CUDA ops in the capture: FusedAdam (any DeepSpeed config naming an
optimizer, the Trainer's `--deepspeed ds_config.json`) loads a stand-in instead of compiling
with nvcc (no CUDA_HOME here: `OSError: CUDA_HOME environment variable is not set`)."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

if importlib.util.find_spec("deepspeed") is None:
    pytest.skip("deepspeed is not installed", allow_module_level=True)

SRC = Path(__file__).resolve().parents[2] / "src"

# in a child process: DeepSpeed picks its accelerator when first imported
CHILD = """
import torch
from peakmem.capture.deepspeed_ops import deepspeed_jit_ops
from deepspeed.ops.op_builder import FusedAdamBuilder
from deepspeed.ops.adam.multi_tensor_apply import MultiTensorApply

with deepspeed_jit_ops():
    fused_adam = FusedAdamBuilder().load()
torch.manual_seed(0)
params = [torch.randn(5, 3), torch.randn(7)]
grads = [torch.randn_like(p) for p in params]
reference = [p.clone().requires_grad_() for p in params]
for r, g in zip(reference, grads):
    r.grad = g.clone()
torch_adam = torch.optim.AdamW(reference, lr=0.1, weight_decay=0.01)
exp_avgs = [torch.zeros_like(p) for p in params]
exp_avg_sqs = [torch.zeros_like(p) for p in params]
for step in (1, 2):
    torch_adam.step()
    MultiTensorApply(2048 * 32)(fused_adam.multi_tensor_adam, torch.zeros(1, dtype=torch.int),
                                [grads, params, exp_avgs, exp_avg_sqs], 0.1, 0.9, 0.999, 1e-8,
                                step, 1, 1, 0.01)
for p, r in zip(params, reference):
    torch.testing.assert_close(p, r.detach(), rtol=1e-4, atol=1e-5)
for i, r in enumerate(reference):
    torch.testing.assert_close(exp_avgs[i], torch_adam.state[r]["exp_avg"])
    torch.testing.assert_close(exp_avg_sqs[i], torch_adam.state[r]["exp_avg_sq"])
print("stand-in ok")
"""


def test_fused_adam_loads_a_stand_in_that_steps_as_adamw():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(SRC), os.environ.get("PYTHONPATH")])))
    env.pop("CUDA_HOME", None)
    done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, env=env,
                          timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "stand-in ok" in done.stdout
