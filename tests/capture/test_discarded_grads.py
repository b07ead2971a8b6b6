"""Backward passes whose gradients are cleared before any step: not an accumulation window
(capture/discarded_grads.py), so their DataLoader epoch is shortened as any other."""

from __future__ import annotations

import textwrap

from peakmem.capture.discarded_grads import DiscardWatch
from peakmem.capture.session import CaptureState
from peakmem.estimate import estimate_command
from tests.capture.test_stopping import GPU, input_rows


def test_a_zero_grad_after_a_backward_with_no_step_between_is_a_discard():
    state = CaptureState()
    watch = DiscardWatch(state)
    watch.zero_grad_called()  # before any backward
    state.backward_passes += 1
    watch.zero_grad_called()  # the backward's gradients cleared, no step: discarded
    assert state.grads_discarded == 1
    watch.zero_grad_called()  # again, with no backward since: nothing more was discarded
    assert state.grads_discarded == 1
    # an accumulation window: 4 backward passes, a step, then zero_grad
    state.backward_passes += 4
    state.steps += 1
    watch.zero_grad_called()
    # a manual in-place update is a step as well
    state.backward_passes += 1
    state.manual_steps += 1
    watch.zero_grad_called()
    assert state.grads_discarded == 1


ATTACK = """
    import torch
    model = torch.nn.Linear(32, 4).cuda().eval()
    data = torch.utils.data.TensorDataset(torch.randn(16 * 20 + 5, 32))
    loader = torch.utils.data.DataLoader(data, batch_size=16)
    for epsilon in (0.1, 0.2):
        seen = 0
        for (x,) in loader:
            x = x.cuda()
            x.requires_grad = True
            model.zero_grad()
            model(x).sum().backward()
            adversarial = x + epsilon * x.grad.sign()
            model(adversarial)
            seen += 1
        print("batches", seen, "of", len(loader))
"""


def test_an_input_gradient_loop_without_an_optimizer_is_shortened(tmp_path, capfd):
    """fgsm_tutorial.py's loop: each batch's backward is for the input's gradient, the
    parameters' gradients are cleared before the next one and nothing steps. Before, the epoch
    waited for optimizer steps (every one of its 21 batches traced, up to 513) while
    `len(loader)` said 4."""
    script = tmp_path / "attack.py"
    script.write_text(textwrap.dedent(ATTACK))
    result = estimate_command(["python", str(script)], **GPU)
    assert result.steps == 0 and result.capture.backward_passes == 2 * 4
    # each epoch: 3 full batches, then its last (5 rows), as an evaluation's would be
    assert input_rows(result.capture.trace, 32) == [16, 16, 16, 5] * 2
    # the loop counted as many batches as `len(loader)` said
    assert capfd.readouterr().err.count("batches 4 of 4") == 2  # the job prints to stderr


ACCUMULATION = """
    import torch
    model = torch.nn.Linear(32, 4).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.utils.data.TensorDataset(torch.randn(16 * 20 + 5, 32))
    for epoch in range(1):
        for i, (x,) in enumerate(torch.utils.data.DataLoader(data, batch_size=16)):
            model(x.cuda()).sum().backward()
            if (i + 1) % 4 == 0:
                optimizer.step()
                optimizer.zero_grad()
"""


def test_an_accumulation_window_still_waits_for_its_steps(tmp_path):
    script = tmp_path / "accumulate.py"
    script.write_text(textwrap.dedent(ACCUMULATION))
    result = estimate_command(["python", str(script)], **GPU)
    # two whole windows of 4 batches fed two steps before the epoch skipped to its last batch
    assert result.steps >= 2
    assert input_rows(result.capture.trace, 32)[:8] == [16] * 8
