"""LBFGS in fake mode (value_steered): without a line search each step runs at its memory bound
(max_iter closure evaluations, every (y, s) pair kept up to history_size), not a silent
one-evaluation step; with a strong-Wolfe line search it is a fake-mode limit."""

import torch

from peakmem.capture import capture_callable
from peakmem.estimate import estimate

MiB = 2**20


def _lbfgs_job(seen, line_search_fn=None):
    def job():
        model = torch.nn.Linear(32, 1).cuda()
        data, target = torch.randn(64, 32, device="cuda"), torch.randn(64, 1, device="cuda")
        optimizer = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=5, history_size=3,
                                      line_search_fn=line_search_fn)
        calls = []

        def closure():
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(data), target)
            loss.backward()
            calls.append(1)
            return loss

        optimizer.step(closure)
        seen["closure_calls"] = len(calls)
        seen["history"] = len(optimizer.state[model.weight].get("old_dirs", []))

    return job


def test_lbfgs_with_strong_wolfe_stops_fake_mode_with_a_fake_limit(a100, stack24):
    seen = {}
    result = capture_callable(_lbfgs_job(seen, "strong_wolfe"), gpu=a100, stack=stack24,
                              mode="fake")
    assert result.reason == "fake_limit"
    assert "LBFGS" in result.error_text and "--mode eager" in result.error_text
    assert seen == {}


def test_lbfgs_runs_its_iterations_in_eager_mode(a100, stack24):
    seen = {}
    result = capture_callable(_lbfgs_job(seen), gpu=a100, stack=stack24, mode="eager")
    assert result.error is None, result.error_text
    assert seen["closure_calls"] > 1 and seen["history"] >= 1
    assert torch.optim.LBFGS.step.__qualname__ == "LBFGS.step"  # put back after the capture


def _image_job(seen):
    """The neural style tutorial's shape of LBFGS use: one 1 MiB tensor optimized (fp32,
    262,144 elements), three steps of `optimizer.step(closure)`."""
    def train():
        image = torch.rand(1, 4, 256, 256, device="cuda").requires_grad_(True)
        optimizer = torch.optim.LBFGS([image], max_iter=5, history_size=3)
        calls = []

        def closure():
            optimizer.zero_grad()
            loss = (image.mean(1) - 0.5).square().sum()
            loss.backward()
            calls.append(1)
            return loss

        for _ in range(3):
            optimizer.step(closure)
        state = optimizer.state[image]
        seen.update(calls=len(calls), history=len(state["old_dirs"]),
                    pairs=sum(t.numel() * t.element_size()
                              for t in state["old_dirs"] + state["old_stps"]))

    return train


def test_lbfgs_in_fake_mode_runs_max_iter_and_keeps_its_history():
    seen = {}
    result = estimate(_image_job(seen), gpu="a100-40gb", torch_version="2.4.1", mode="fake",
                      steps="all")
    assert result.mode == "fake"
    # before: a fake-mode limit (and auto mode's eager rerun); zeros would have stopped it
    # after one evaluation with no history. Each step: the first evaluation plus one after
    # each of the max_iter - 1 moves (torch skips it after the last); 15 iterations store
    # 14 pairs, of which the last history_size = 3 are kept
    assert seen == {"calls": 15, "history": 3, "pairs": 6 * MiB}
    by_category = result.breakdown.by_category
    assert by_category["parameter"] == MiB
    # the kept pairs (3 y and 3 s, 1 MiB each) and their 0-d `ro` / `al` factors (512 B each)
    assert 6 * MiB <= by_category["optimizer_state"] <= 6 * MiB + 6 * 512
    # at the third step's history shift: the image, its gradient, the 3 kept pairs and the new
    # one, the flat gradient, the previous one, the direction d: 12 MiB at least
    assert result.peak_allocated_bytes - by_category.get("workspace", 0) >= 12 * MiB
    assert any("LBFGS" in note and "memory bound" in note for note in result.notes)
