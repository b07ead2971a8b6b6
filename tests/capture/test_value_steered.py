"""LBFGS in fake mode is a fake-mode limit, not a silent one-evaluation step (value_steered)."""

import torch

from peakmem.capture import capture_callable


def _lbfgs_job(seen):
    def job():
        model = torch.nn.Linear(32, 1).cuda()
        data, target = torch.randn(64, 32, device="cuda"), torch.randn(64, 1, device="cuda")
        optimizer = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=5, history_size=3)
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


def test_lbfgs_stops_fake_mode_with_a_fake_limit(a100, stack24):
    seen = {}
    result = capture_callable(_lbfgs_job(seen), gpu=a100, stack=stack24, mode="fake")
    assert result.reason == "fake_limit"
    assert "LBFGS" in result.error_text and "--mode eager" in result.error_text
    assert seen == {}


def test_lbfgs_runs_its_iterations_in_eager_mode(a100, stack24):
    seen = {}
    result = capture_callable(_lbfgs_job(seen), gpu=a100, stack=stack24, mode="eager")
    assert result.error is None, result.error_text
    assert seen["closure_calls"] > 1 and seen["history"] >= 1
    assert torch.optim.LBFGS.step.__qualname__ == "LBFGS.step"  # put back after the capture
