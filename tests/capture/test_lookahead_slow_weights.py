"""A wrapping optimizer's slow weights (timm's Lookahead) are optimizer state, not `ema`.

Lookahead steps its inner optimizer (whose step hooks end the optimizer phase), then makes and
syncs a slow copy of each trained weight in the inner optimizer's state
(`slow.add_(fast - slow, alpha=a)`; `fast.copy_(slow)`): a copy kept in sync from the trained
weights, as an EMA is, but held by the optimizer. capture.phases re-tags what an optimizer's
state holds at its next step, `ema` included."""

from __future__ import annotations

from pathlib import Path

from peakmem.estimate import estimate_command

LOOKAHEAD_JOB = """\
import torch
model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256))
model.cuda()
base = torch.optim.SGD(model.parameters(), lr=0.1)  # no momentum: no state of its own


def lookahead_step():  # timm.optim.Lookahead.step / update_slow, k = 1
    base.step()
    with torch.no_grad():
        for p in model.parameters():
            state = base.state[p]
            if "lookahead_slow_buff" not in state:
                state["lookahead_slow_buff"] = torch.empty_like(p)
                state["lookahead_slow_buff"].copy_(p)
            slow = state["lookahead_slow_buff"]
            slow.add_(p - slow, alpha=0.5)
            p.copy_(slow)


for step in range(4):
    loss = model(torch.randn(64, 256, device="cuda")).square().mean()
    loss.backward()
    lookahead_step()
    base.zero_grad()
"""


def _block(nbytes: int) -> int:
    return max(512, -(-nbytes // 512) * 512)


MODEL = 2 * (_block(256 * 256 * 4) + _block(256 * 4))


def test_lookahead_slow_weights_are_optimizer_state(tmp_path: Path, monkeypatch):
    (tmp_path / "lookahead_job.py").write_text(LOOKAHEAD_JOB)
    monkeypatch.chdir(tmp_path)
    result = estimate_command(["python", "lookahead_job.py"], gpu="a100-40gb", mode="fake",
                              timeout=120)
    by_category = result.breakdown.by_category
    assert by_category.get("optimizer_state") == MODEL, by_category
    assert "ema" not in by_category, by_category
    assert by_category.get("parameter") == MODEL, by_category
