"""An optimizer's parameters are parameters in the breakdown even when no module forward claimed
them: a module whose `forward` is called directly (pytorch/examples mnist_forward_forward)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from peakmem.estimate import estimate_command

DIRECT_FORWARD = """\
import sys, torch
lin = torch.nn.Linear(1024, 1024)
if "--opt-first" in sys.argv:
    opt = torch.optim.Adam(lin.parameters())
    lin = lin.to("cuda")
else:
    lin = lin.to("cuda")
    opt = torch.optim.Adam(lin.parameters())
x = torch.randn(64, 1024, device="cuda")
for _ in range(3):
    loss = lin.forward(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


@pytest.mark.parametrize("order", [[], ["--opt-first"]], ids=["move-then-optimizer",
                                                              "optimizer-then-move"])
def test_parameters_of_a_module_called_through_forward(tmp_path: Path, monkeypatch, order):
    (tmp_path / "direct.py").write_text(DIRECT_FORWARD)
    monkeypatch.chdir(tmp_path)
    result = estimate_command(["python", "direct.py", *order], gpu="a100-40gb", mode="fake",
                              timeout=120)
    weight, bias = 1024 * 1024 * 4, 4096
    by_category = result.breakdown.by_category
    # before: moved host tensors stayed "input" (4 MiB + 4 KiB) and there was no "parameter"
    assert by_category.get("parameter") == weight + bias, by_category
    assert by_category.get("input", 0) < weight, by_category
    assert by_category.get("optimizer_state") == 2 * (weight + bias)


HOST_MADE_STATE = """\
import torch

class FactoredMoments(torch.optim.Optimizer):
    '''transformers' Adafactor: its factored second moments are made on the host and moved
    (`torch.zeros(shape[:-1]).to(grad)`), the update's RMS is a device scalar it keeps.'''
    def __init__(self, params):
        super().__init__(params, {"lr": 1e-3})

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            for p in group["params"]:
                state = self.state[p]
                if not state:
                    state["row"] = torch.zeros(p.shape[:-1]).to(p.grad)
                    state["col"] = torch.zeros(p.shape[-1:]).to(p.grad)
                state["RMS"] = p.norm(2) / p.numel() ** 0.5
                p.add_(p.grad, alpha=-group["lr"])

lin = torch.nn.Linear(1024, 512, bias=False).to("cuda")
opt = FactoredMoments(lin.parameters())
x = torch.randn(64, 1024, device="cuda")
for _ in range(2):
    lin(x).pow(2).mean().backward()
    opt.step()
    opt.zero_grad()
"""


def test_optimizer_state_made_on_the_host_is_optimizer_state(tmp_path: Path, monkeypatch):
    (tmp_path / "factored.py").write_text(HOST_MADE_STATE)
    monkeypatch.chdir(tmp_path)
    result = estimate_command(["python", "factored.py"], gpu="a100-40gb", mode="fake", timeout=120)
    by_category = result.breakdown.by_category
    # row (512 fp32), col (1024 fp32) and the RMS scalar (a 512-byte block): before, the moved
    # moments stayed "input" and only the RMS was optimizer state
    assert by_category.get("optimizer_state") == 2048 + 4096 + 512, by_category
    assert by_category.get("input", 0) == 0, by_category


def test_optimizer_state_held_in_lists_is_optimizer_state(a100, stack24):
    # timm's Kron (PSGD) keeps one preconditioner per dimension in `state["Q"]`, a list;
    # Shampoo-style optimizers hold lists / dicts of factors the same way
    from peakmem.capture import capture_callable
    from tests.capture.capture_helpers import allocations

    class Preconditioned(torch.optim.Optimizer):
        def __init__(self, params):
            super().__init__(params, {"lr": 1e-3})

        @torch.no_grad()
        def step(self):
            for group in self.param_groups:
                for p in group["params"]:
                    state = self.state[p]
                    if not state:
                        state["step"] = 0
                        state["momentum"] = torch.zeros_like(p)
                        state["Q"] = [torch.eye(n, device=p.device) for n in p.shape]
                        state["stats"] = {"norms": [torch.zeros(1, device=p.device)]}
                    state["step"] += 1
                    state["momentum"].mul_(0.9).add_(p.grad)
                    p.add_(state["momentum"], alpha=-group["lr"])

    def job():
        lin = torch.nn.Linear(256, 128, bias=False).cuda()
        opt = Preconditioned(lin.parameters())
        for _ in range(2):
            lin(torch.randn(8, 256, device="cuda")).sum().backward()
            opt.step()
            opt.zero_grad()

    result = capture_callable(job, gpu=a100, stack=stack24, steps="all", mode="fake")
    assert result.error is None, result.error_text
    state = sorted(size for size, _tag in allocations(result.trace, category="optimizer_state"))
    # momentum 128 x 256, Q: eye(128) and eye(256), the norm (4 bytes requested)
    assert state == sorted([128 * 256 * 4, 128 * 128 * 4, 256 * 256 * 4, 4])
