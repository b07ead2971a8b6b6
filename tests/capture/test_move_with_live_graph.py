"""`net.cpu()` while the last iteration's graph is alive (pix2pix's save_networks: `net.cpu()`,
`torch.save`, `net.cuda()` at an epoch's end, its loss still referenced): on CUDA `set_data`
changes the parameters' TensorImpls in place, so their device blocks are freed at once; the
capture's impl swap used to leave them alive, held by the graph's AccumulateGrad nodes."""

from __future__ import annotations

from pathlib import Path

import pytest

from peakmem.estimate import estimate_command

ROUND_TRIP = """\
import sys, torch
net = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256)).cuda()
opt = torch.optim.SGD(net.parameters(), lr=0.1)
x = torch.randn(8, 256, device="cuda")
state = 2 * 2 * (256 * 256 + 256) * 4  # two layers: parameters and gradients (512-byte multiples)
for step in range(2):
    out = net(x)
    loss = out.sum()
    opt.zero_grad()
    loss.backward()
    opt.step()
    if "--drop-graph" in sys.argv:
        del out, loss
    before = torch.cuda.memory_allocated()
    net.cpu()
    freed = before - torch.cuda.memory_allocated()
    assert freed == state, (freed, state)
    net.cuda()
    assert torch.cuda.memory_allocated() == before
"""


@pytest.mark.parametrize("graph", [[], ["--drop-graph"]], ids=["graph-alive", "graph-dropped"])
def test_parameters_move_off_the_device_in_place(tmp_path: Path, monkeypatch, graph):
    (tmp_path / "round_trip.py").write_text(ROUND_TRIP)
    monkeypatch.chdir(tmp_path)
    # the job checks memory_allocated itself: an assertion there fails the estimate
    result = estimate_command(["python", "round_trip.py", *graph], gpu="a100-40gb", mode="fake",
                              timeout=120)
    assert result.estimate_kind == "training"
