"""DeepSpeed's fused optimizers (FusedAdam, FusedLion, FusedLamb) load CUDA kernels through an op
builder that compiles them with nvcc when they are not prebuilt, and ZeRO-Offload's CPU optimizers
(cpu_adam, cpu_adagrad, cpu_lion) C++ ops it compiles with the host compiler: in the capture their
builders load stand-ins (capture/deepspeed_ops.py)."""

import importlib.util
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch

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


SRC = Path(__file__).resolve().parents[2] / "src"

# in a child process: DeepSpeed picks its accelerator when first imported
CHILD = """
import torch
from peakmem.capture.deepspeed_ops import deepspeed_fused_optimizer_ops
from deepspeed.ops.op_builder import FusedAdamBuilder
from deepspeed.ops.adam.multi_tensor_apply import MultiTensorApply

with deepspeed_fused_optimizer_ops():
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


def test_fused_lamb_allocates_the_kernels_reduction_buffers(tmp_path):
    """csrc/lamb/fused_lamb_cuda.cpp: per tensor and step two 512-float reduction buffers (freed
    on return) and the one-float trust ratio it returns; the moments are FusedLamb's own."""
    script = tmp_path / "fused.py"
    script.write_text(SCRIPT)
    estimate = estimate_command(["deepspeed", "--num_gpus", "1", str(script), "Lamb"],
                                gpu="a100-40gb", torch_version="2.4.1", steps=2, mode="fake")
    result = estimate.capture
    # it stopped at FusedLambBuilder().load(): "CUDA_HOME environment variable is not set"
    assert result.error is None, result.error_text
    state = sum(size for size, _ in allocations(result.trace, "optimizer_state"))
    assert state == 2 * 4 * NUMEL
    tensors, steps = 4, 2  # two weights, two biases
    temporaries = Counter(size for size, _ in allocations(result.trace, "temporary", phase="optimizer"))
    assert temporaries == Counter({512 * 4: 2 * tensors * steps, 4: tensors * steps})


OFFLOAD_SCRIPT = """
import sys, torch, deepspeed
deepspeed.init_distributed()
model = torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU(),
                            torch.nn.Linear(WIDTH, WIDTH))
stage, optimizer_type = [a for a in sys.argv[1:] if not a.startswith("--")]
config = {"train_micro_batch_size_per_gpu": 8, "fp16": {"enabled": True},
          "zero_optimization": {"stage": int(stage), "offload_optimizer": {"device": "cpu"},
                                "reduce_bucket_size": 4096, "allgather_bucket_size": 4096},
          "optimizer": {"type": optimizer_type, "params": {"lr": 1e-3}}}
engine, optimizer, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                               config=config)
host = optimizer.optimizer  # DeepSpeedCPUAdam / DeepSpeedCPUAdagrad / DeepSpeedCPULion
assert host.__class__.__name__.startswith("DeepSpeedCPU"), type(host)
for _ in range(2):
    loss = engine(torch.randn(8, WIDTH, device=engine.device, dtype=torch.half)).sum()
    engine.backward(loss)
    engine.step()
    # written every step: the capture may stop the job once the steps it traces have run
    masters = (optimizer.fp32_partitioned_groups_flat if int(stage) == 3  # fp32 master partitions
               else optimizer.single_partition_of_fp32_groups)
    states = [t for state in host.state.values() for t in state.values() if torch.is_tensor(t)]
    assert all(t.device.type == "cpu" and t.dtype == torch.float32 for t in masters + states)
    with open(__file__ + ".out", "w") as out:
        out.write(f"host master {sum(p.numel() for p in masters)} "
                  f"host state {sum(t.numel() for t in states)}")
""".replace("WIDTH", str(WIDTH))


@pytest.mark.parametrize(("stage", "optimizer", "moments"),
                         # DeepSpeedCPULion makes exp_avg_sq too (unused by its update)
                         [(2, "Adam", 2), (3, "Adam", 2), (2, "Lion", 2), (2, "Adagrad", 1)])
def test_zero_offload_keeps_master_weights_and_optimizer_state_on_the_host(
        tmp_path, monkeypatch, stage, optimizer, moments):
    """ZeRO-Offload: the CPU optimizer (cpu_adam / cpu_lion / cpu_adagrad, C++ ops the builder
    compiles with the host compiler) updates the fp32 master weights on the host; the device holds
    the fp16 parameters (and gradient buckets) only."""
    # no JIT build to fall back on: an empty extensions folder and a compiler that fails
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "torch_extensions"))
    monkeypatch.setenv("CXX", "false")
    script = tmp_path / "offload.py"
    script.write_text(OFFLOAD_SCRIPT)
    estimate = estimate_command(["deepspeed", "--num_gpus", "1", str(script), str(stage), optimizer],
                                gpu="a100-40gb", torch_version="2.4.1", steps=2, mode="fake")
    result = estimate.capture
    assert result.error is None, result.error_text  # it stopped at CPUAdamBuilder().load()
    assert allocations(result.trace, "optimizer_state") == []  # the moments are host tensors
    # the fp16 parameters (2 B/element): ZeRO-2's flat group; ZeRO-3's per-parameter partitions,
    # then the flat buffer they are copied into (`defragment`: lp_param_buffer, a parameter too
    # since capture/zero_partitions.py) once they are freed: allocated twice, live once
    copies = 2 if stage == 3 else 1
    assert sum(size for size, _ in allocations(result.trace, "parameter")) == copies * 2 * NUMEL
    # no fp32 master copy (4 B/element) is on the device (cuBLAS's workspaces aside)
    assert all(size < 4 * NUMEL for size, tag in allocations(result.trace) if tag.category != "workspace")
    # the rank's fp32 master weights and their moments: host tensors (the job's own count)
    host = (tmp_path / "offload.py.out").read_text()
    assert host == f"host master {NUMEL} host state {moments * NUMEL}"


def test_cpu_optimizer_stand_ins_step_as_torch_optimizers():
    """The ZeRO-Offload ops' stand-ins update host tensors as DeepSpeed's C++ (AdamW, Adagrad,
    Lion), so the job's eager values stay right."""
    from peakmem.capture.deepspeed_ops import IN_PLACE_OPS

    torch.manual_seed(0)
    param, grad = torch.randn(6, 4), torch.randn(6, 4)
    cpu_adam = IN_PLACE_OPS["cpu_adam"]()
    cpu_adam["create_adam"](0, 0.1, 0.9, 0.999, 1e-8, 0.01, True)
    reference = param.clone().requires_grad_()
    reference.grad = grad.clone()
    torch_adam = torch.optim.AdamW([reference], lr=0.1, weight_decay=0.01)
    mine, exp_avg, exp_avg_sq = param.clone(), torch.zeros_like(param), torch.zeros_like(param)
    for step in (1, 2):
        torch_adam.step()
        cpu_adam["adam_update"](0, step, 0.1, 0.9, 0.999, 1e-8, 0.01, True, mine, grad, exp_avg,
                                exp_avg_sq)
    torch.testing.assert_close(mine, reference.detach())
    torch.testing.assert_close(exp_avg_sq, torch_adam.state[reference]["exp_avg_sq"])

    cpu_adagrad = IN_PLACE_OPS["cpu_adagrad"]()
    reference = param.clone().requires_grad_()
    reference.grad = grad.clone()
    torch_adagrad = torch.optim.Adagrad([reference], lr=0.1, eps=1e-10)
    mine, state_sum = param.clone(), torch.zeros_like(param)
    for step in (1, 2):
        torch_adagrad.step()
        cpu_adagrad["adagrad_update"](0, step, 0.1, 1e-10, 0.0, mine, grad, state_sum)
    torch.testing.assert_close(mine, reference.detach())

    cpu_lion = IN_PLACE_OPS["cpu_lion"]()
    mine, exp_avg = param.clone(), torch.zeros_like(param)
    cpu_lion["lion_update"](0, 1, 0.1, 0.9, 0.99, 0.0, mine, grad, exp_avg)
    torch.testing.assert_close(mine, param - 0.1 * grad.sign())  # sign((1 - beta1) * grad)
    torch.testing.assert_close(exp_avg, 0.01 * grad)
