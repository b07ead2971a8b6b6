"""`optimizer.step(closure)`: the closure's forward and backward run inside the step
(capture/phases.py). The forward is the training forward, so what its backward finds saved is
`activation`, as in a loop that calls them before the step; before, the whole closure ran in
the optimizer phase and its saved tensors were `temporary`."""

import torch

from peakmem.estimate import estimate

BATCH, HIDDEN = 4096, 4096


def _train(optimizer_name: str, seen: dict):
    def train():
        model = torch.nn.Sequential(torch.nn.Linear(256, HIDDEN), torch.nn.ReLU(),
                                    torch.nn.Linear(HIDDEN, 1)).cuda()
        data = torch.randn(BATCH, 256, device="cuda")
        if optimizer_name == "lbfgs":
            optimizer = torch.optim.LBFGS(model.parameters(), max_iter=3, history_size=2)
        else:
            optimizer = torch.optim.Adam(model.parameters())
        calls = []

        def closure():
            optimizer.zero_grad()
            loss = model(data).square().mean()
            loss.backward()
            calls.append(1)
            return loss

        for _ in range(3):
            if optimizer_name == "adam-plain":
                closure()
                optimizer.step()
            else:
                optimizer.step(closure)
        seen["closures"] = len(calls)

    return train


def _by_category(optimizer_name: str) -> tuple[dict, dict]:
    seen: dict = {}
    result = estimate(_train(optimizer_name, seen), gpu="a100-40gb", torch_version="2.4.1",
                      mode="fake", steps="all")
    return result.breakdown.by_category, seen


def test_adam_closure_breakdown_is_the_plain_loops():
    by_category, seen = _by_category("adam")
    assert seen["closures"] == 3
    # the ReLU's (4096, 4096) fp32 output, saved for the ReLU and the second Linear, is the
    # forward's activation (64 MiB), not the step's temporary
    assert by_category["activation"] >= BATCH * HIDDEN * 4
    # the same job calling the closure before `optimizer.step()`: the same peak and categories
    plain, _ = _by_category("adam-plain")
    assert by_category == plain


def test_lbfgs_closure_forward_saves_activations():
    by_category, seen = _by_category("lbfgs")
    assert seen["closures"] == 9  # 3 steps of max_iter = 3 evaluations (fake mode's bound)
    assert by_category["activation"] >= BATCH * HIDDEN * 4
