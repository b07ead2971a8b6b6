"""A model the job deletes after running it frees its device memory (capture/modules.py).

The capture registered every module whose forward ran as a root, holding it strongly: a model
the job ran and then deleted stayed alive with its device weights to the end of the capture.
diffusers' DreamBooth scripts generate the class images with a whole pipeline, `del pipeline`,
then train: the deleted pipeline's weights were counted in the training peak."""

from __future__ import annotations

from pathlib import Path

from peakmem.estimate import estimate_command

RUN_THEN_DELETE = """\
import gc, torch

generator = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.Linear(2048, 512)).cuda().half()
with torch.no_grad():
    samples = generator(torch.randn(4, 512, device="cuda", dtype=torch.half)).float().cpu()
del generator
gc.collect()
torch.cuda.empty_cache()

model = torch.nn.Linear(512, 512).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(3):
    loss = model(samples.cuda()).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
"""


def test_a_model_run_then_deleted_is_not_in_the_training_peak(tmp_path: Path, monkeypatch):
    (tmp_path / "job.py").write_text(RUN_THEN_DELETE)
    monkeypatch.chdir(tmp_path)
    result = estimate_command(["python", "job.py"], gpu="a100-40gb", mode="fake", timeout=120)
    by_category = result.breakdown.by_category
    weights = 512 * 512 * 4 + 512 * 4
    # the generator's fp16 weights (4 MiB) were freed before training began
    assert by_category.get("parameter") == weights, by_category
