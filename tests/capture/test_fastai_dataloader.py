"""fastai's own DataLoader (`fastai.data.load.DataLoader`, not torch's) takes part in the
capture's epoch policy as torch's does (capture/fastai_dataloader.py): by default a long
training epoch is shortened to 3 full batches and its last, without loading the items skipped,
`len(loader)` says so, and the loop ends early so the validation after it still runs and sets
the peak, as with `steps="all"`.

The estimates run in a child Python: importing fastai patches torch for the whole process
(fastai.torch_core replaces `Tensor.as_subclass`), which must not leak into the other tests of
a pytest worker."""

import importlib.util
import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("fastai") is None,
                                reason="not installed: fastai")

JOB = """
import json
import torch
from torch import nn
from fastai.data.load import DataLoader
from peakmem.estimate import estimate

class Items:
    "A map-style dataset counting the items it loads."
    def __init__(self, count, features):
        self.count, self.features, self.loaded = count, features, 0
    def __len__(self):
        return self.count
    def __getitem__(self, index):
        self.loaded += 1
        return torch.randn(self.features), index % 4

def train(seen):
    train_items, valid_items = Items(20 * 8, 64), Items(512, 64)
    # 20 training batches of 8 (worker processes asked for), one validation batch of 512
    train_dl = DataLoader(train_items, bs=8, shuffle=True, num_workers=2, device="cuda")
    valid_dl = DataLoader(valid_items, bs=512, device="cuda")
    model = nn.Sequential(nn.Linear(64, 1024), nn.ReLU(), nn.Linear(1024, 4)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    seen["lengths"], seen["batches"] = [], []
    for epoch in range(2):
        seen["lengths"].append(len(train_dl))
        batches = 0
        for x, y in train_dl:
            batches += 1
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad()
        seen["batches"].append(batches)
        with torch.no_grad():
            for x, y in valid_dl:
                model(x).softmax(-1)
    seen["loaded"] = train_items.loaded

results = {}
for steps in (None, "all"):
    seen = {}
    result = estimate(train, seen, gpu="a100-40gb", torch_version="2.4.1", mode="fake",
                      steps=steps)
    results[str(steps)] = {"peak": result.peak_bytes, "steps": result.steps,
                           "phases": list(result.capture.trace.meta.get("phases_ran", [])),
                           "notes": list(result.notes), "seen": seen}
print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def results():
    done = subprocess.run([sys.executable, "-c", JOB], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_default_steps_reach_the_validation_that_sets_the_peak(results):
    default, everything = results["None"], results["all"]
    assert everything["steps"] == 40 and everything["seen"]["batches"] == [20, 20]
    assert everything["phases"] == ["training", "eval", "training", "eval"]
    # without the patch the default stopped the job after 3 steps, before any validation
    assert default["phases"] == ["training", "eval", "training", "eval"]
    assert "the peak was set by the evaluation after training" in "\n".join(default["notes"])
    assert abs(default["peak"] - everything["peak"]) <= 2 * 2**20


def test_a_long_fastai_epoch_is_shortened_without_loading_the_batches_skipped(results):
    seen = results["None"]["seen"]
    notes = "\n".join(results["None"]["notes"])
    # 3 full batches and the last, `len(loader)` agrees; then the steps limit (that epoch plus
    # 2): the second epoch ends after 2 batches, skipping to its last
    assert seen["lengths"][0] == 4 and seen["batches"] == [4, 3]
    assert "DataLoader epoch of 20 batches: traced 3 full batches, then its last batch" in notes
    assert seen["loaded"] == 7 * 8  # the 33 batches skipped loaded no item
    assert "num_workers=2 loaded its batches in the main process" in notes
