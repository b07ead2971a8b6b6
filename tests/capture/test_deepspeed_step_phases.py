"""DeepSpeed's ZeRO optimizer step and backward epilogue are optimizer / backward work.

`engine.step()` runs the ZeRO optimizer's `step`, which does much around the inner torch
optimizer's step (gradient norms, overflow checks, the fp32 copy of the gradient partition, the
bf16 copy of the updated master weights); `engine.backward()` reduces the gradients after
autograd's backward returned. Both ran in the phase `other`, so their blocks were labelled
`other` in the breakdown; a plain torch optimizer's step temporaries are `temporary`
(capture/zero_partitions.py, `PhaseTracker.outer_step` / `outer_backward`)."""

from __future__ import annotations

import importlib.util
from collections import Counter
from pathlib import Path

import pytest

from peakmem.estimate import estimate_command
from tests.capture.capture_helpers import allocations

if importlib.util.find_spec("deepspeed") is None:
    pytest.skip("deepspeed is not installed", allow_module_level=True)

ZERO_JOB = """\
import sys, deepspeed, torch
stage = int(sys.argv[-1])
model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256))
config = {"train_micro_batch_size_per_gpu": 8,
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
          "bf16": {"enabled": True}, "zero_optimization": {"stage": stage}}
engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
for step in range(3):
    x = torch.randn(8, 256, device=engine.device, dtype=torch.bfloat16)
    loss = engine(x).float().square().mean()
    engine.backward(loss)
    engine.step()
"""

OTHER_LEFT = 8 * 256 * 2 + 512
"""What is left `other`: the bf16 batch made on the device between steps (and ZeRO-3's 1-byte
flag made while the engine is built, one 512-byte block)."""


@pytest.mark.slow
@pytest.mark.parametrize("stage", [2, 3])
def test_zero_step_and_backward_epilogue_are_not_other(tmp_path: Path, monkeypatch, stage: int):
    (tmp_path / "zero_job.py").write_text(ZERO_JOB)
    monkeypatch.chdir(tmp_path)
    result = estimate_command(["deepspeed", "--num_gpus", "1", "zero_job.py", str(stage)],
                              gpu="a100-40gb", mode="fake", timeout=240)
    by_category = result.breakdown.by_category
    assert result.capture.steps == 3
    assert by_category.get("other", 0) <= OTHER_LEFT, by_category
    trace = result.capture.trace
    # the ZeRO step's gradient norm and overflow check (outside the inner AdamW's step)
    step_ops = Counter((tag.category, tag.phase) for _size, tag in allocations(trace)
                       if tag.op.startswith(("linalg_vector_norm", "isinf", "isnan")))
    assert step_ops and set(step_ops) == {("temporary", "optimizer")}, step_ops
    assert allocations(trace, "other", phase="optimizer") == []
