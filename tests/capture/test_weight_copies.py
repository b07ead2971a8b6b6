"""EMA / averaged copies of the trained weights are labelled `ema` in the breakdown.

They were tagged as what made their blocks: a host-to-device copy (`input`: DiT's
`deepcopy(model).to(device)`, diffusers' EMAModel shadow tensors moved with `.to(device)`) or a
clone between steps (`other`: timm's ModelEmaV3, swa_utils.AveragedModel deep-copying a model on
the device). capture.weight_copies re-tags them once they are seen kept in sync with the trained
weights."""

from __future__ import annotations

from pathlib import Path

import pytest

from peakmem.estimate import estimate_command

EMA_JOB = """\
import copy, sys, torch
kind = sys.argv[1]
model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256))
if kind == "deepcopy":  # DiT: the copy is moved before the model, then frozen
    ema = copy.deepcopy(model).to("cuda")
    ema.requires_grad_(False)
model.cuda()
if kind == "swa":
    avg = torch.optim.swa_utils.get_ema_multi_avg_fn(0.99)
    ema = torch.optim.swa_utils.AveragedModel(model, multi_avg_fn=avg)
elif kind == "shadow":  # diffusers' EMAModel: plain tensors, `s.sub_(w * (s - p))`
    shadow = [p.clone().detach() for p in model.parameters()]
elif kind == "timm_v2":  # timm's ModelEmaV2: a deepcopy on the device (timm needs torchvision)
    ema = copy.deepcopy(model)
elif kind == "teacher":  # DINO: a frozen copy that runs a forward each step
    teacher = copy.deepcopy(model)
    teacher.requires_grad_(False)
elif kind == "momentum":  # MoCo / BYOL: a frozen copy whose data is replaced each step
    key = copy.deepcopy(model).requires_grad_(False)
elif kind == "frozen":  # a frozen second model never synced: its weights stay parameters
    teacher = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(),
                                  torch.nn.Linear(256, 256)).cuda().requires_grad_(False)
opt = torch.optim.AdamW(model.parameters())
for step in range(3):
    x = torch.randn(64, 256, device="cuda")
    if kind in ("teacher", "frozen"):
        with torch.no_grad():
            target = teacher(x)
        loss = (model(x) - target).square().mean()
    else:
        loss = model(x).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    with torch.no_grad():
        if kind == "deepcopy":
            for e, p in zip(ema.parameters(), model.parameters()):
                e.mul_(0.99).add_(p.data, alpha=0.01)
        elif kind == "swa":
            ema.update_parameters(model)
        elif kind == "shadow":
            for s, p in zip(shadow, model.parameters()):
                s.sub_(0.01 * (s - p))
        elif kind == "timm_v2":
            for ema_v, model_v in zip(ema.state_dict().values(), model.state_dict().values()):
                ema_v.copy_(0.99 * ema_v + (1. - 0.99) * model_v)
        elif kind == "teacher":
            for t, s in zip(teacher.parameters(), model.parameters()):
                t.data.mul_(0.99).add_((1 - 0.99) * s.detach().data)
        elif kind == "momentum":
            for k, q in zip(key.parameters(), model.parameters()):
                k.data = k.data * 0.99 + q.data * (1.0 - 0.99)
"""


def _block(nbytes: int) -> int:
    return max(512, -(-nbytes // 512) * 512)


MODEL = 2 * (_block(256 * 256 * 4) + _block(256 * 4))


def _breakdown(tmp_path: Path, monkeypatch, kind: str) -> dict[str, int]:
    (tmp_path / "ema_job.py").write_text(EMA_JOB)
    monkeypatch.chdir(tmp_path)
    # in this process (isolate=False): a torch-only job; the supervised child path is what
    # every tests/library_jobs estimate runs
    result = estimate_command(["python", "ema_job.py", kind], gpu="a100-40gb", mode="fake",
                              timeout=120, isolate=False)
    return result.breakdown.by_category


@pytest.mark.parametrize("kind", ["deepcopy", "swa", "shadow", "timm_v2", "teacher", "momentum"])
def test_ema_copies_are_labelled_ema(tmp_path: Path, monkeypatch, kind: str):
    by_category = _breakdown(tmp_path, monkeypatch, kind)
    # the copy of both layers' weights and biases; the trained model stays the parameters
    assert by_category.get("ema") == MODEL, by_category
    assert by_category.get("parameter") == MODEL, by_category
    assert by_category.get("input", 0) + by_category.get("other", 0) < MODEL, by_category


def test_a_frozen_model_never_synced_is_not_ema(tmp_path: Path, monkeypatch):
    by_category = _breakdown(tmp_path, monkeypatch, "frozen")
    assert "ema" not in by_category, by_category
    assert by_category.get("parameter") == 2 * MODEL, by_category
