"""An optimizer the job drops after it stepped frees its state and parameters
(capture/phases.py).

The phase tracker kept every optimizer that stepped in a dict (to know the job has one), holding
it strongly: a job that trains a new model and optimizer per fold or per run (accelerate's
by_feature/cross_validation.py: three StratifiedKFold folds, `accelerator.free_memory()` after
each) kept every earlier optimizer alive with its parameters and its state, and the estimate
counted all the folds' models at the last fold's peak."""

from __future__ import annotations

from pathlib import Path

from peakmem.estimate import estimate_command
from peakmem.jobs.stop import parse_steps

RUN_PER_FOLD = """\
import gc, torch

for fold in range(3):
    model = torch.nn.Linear(1024, 1024).cuda()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _ in range(3):
        loss = model(torch.randn(8, 1024, device="cuda")).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
    del model, opt, loss
    gc.collect()
    torch.cuda.empty_cache()
    with open("folds.txt", "a") as f:
        f.write(f"{fold}\\n")
"""


def test_each_folds_optimizer_is_freed_before_the_next_fold(tmp_path: Path, monkeypatch):
    (tmp_path / "job.py").write_text(RUN_PER_FOLD)
    monkeypatch.chdir(tmp_path)
    result = estimate_command(["python", "job.py"], gpu="a100-40gb", mode="fake", timeout=120,
                              steps=parse_steps("all"))  # all three folds
    by_category = result.breakdown.by_category
    weights = 1024 * 1024 * 4 + 1024 * 4  # one fold's fp32 weight and bias
    # one fold's model at the peak, with Adam's two moments (its `step` counters stay on the
    # host: not capturable); before, the third fold's peak held all three folds' weights and
    # moments
    assert by_category.get("parameter") == weights, by_category
    assert by_category.get("optimizer_state") == 2 * weights, by_category
    assert (tmp_path / "folds.txt").read_text().split() == ["0", "1", "2"]
    assert result.steps == 3  # the most-stepped optimizer's steps: each fold's
