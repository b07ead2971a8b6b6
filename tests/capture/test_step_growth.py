"""Under the default policy a loop without a DataLoader whose peak still grows at the step
limit keeps going, one step at a time, while each step raises the peak by more than 2 MiB
(capture/step_growth.py): an optimizer history that fills (LBFGS), tensors kept across steps.

Bytes worked out from the shapes: fp32 tensors in 512-byte blocks, allocated bytes (the 2 MiB
segments do not enter)."""

import pytest

from peakmem.capture import step_growth
from tests.capture.test_loops_without_dataloader import fp32, run, verified_python

MiB = 1 << 20

# A history of (1024, 1024) fp32 pairs (4 MiB each) that fills up to 6 entries, one per step,
# then shifts (the oldest dropped): the peak grows for 6 steps, then stays.
FILLING_HISTORY = """
    import torch
    model = torch.nn.Linear(64, 64).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    history = []
    for step in range(40):
        model(torch.randn(8, 64, device="cuda")).sum().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        history.append(torch.zeros(1024, 1024, device="cuda"))
        if len(history) > 6:
            history.pop(0)
    print("trained", step + 1, "steps")
"""


@verified_python
def test_a_filling_history_is_traced_until_it_is_full(tmp_path, a100, stack24, capfd):
    result = run(tmp_path, FILLING_HISTORY, a100, stack24)
    full = run(tmp_path, FILLING_HISTORY, a100, stack24, steps="all")
    # a step's rise is seen at the next step (each optimizer step marks one): iterations 1-6
    # each add 4 MiB, the 7th allocates its 7th entry before popping the oldest (+4 MiB, the
    # last rise, seen at step 8); step 9 raises nothing: the loop ends at its head after it
    assert result.steps == 9, result.notes
    assert result.peak_allocated == full.peak_allocated
    assert result.peak_allocated >= 7 * fp32(1024, 1024)
    assert any(n.startswith("kept training 6 optimizer steps past the step limit") for n in result.notes), result.notes
    assert not any("may be low for a longer run" in n for n in result.notes)
    # an explicit step count is never extended
    three = run(tmp_path, FILLING_HISTORY, a100, stack24, steps=3)
    assert three.steps == 3
    # (stopped at its 4th forward: 3 entries kept, where the full run peaks with 7)
    assert full.peak_allocated - three.peak_allocated >= 4 * fp32(1024, 1024)
    capfd.readouterr()


# Each step keeps a 4 MiB tensor for good (a leak): the peak never stops growing.
LEAK = """
    import torch
    model = torch.nn.Linear(64, 64).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    kept = []
    for step in range(200):
        model(torch.randn(8, 64, device="cuda")).sum().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        kept.append(torch.zeros(1024, 1024, device="cuda"))
"""


@verified_python
def test_a_leak_is_traced_to_the_cap_and_said_to_grow(tmp_path, a100, stack24):
    result = run(tmp_path, LEAK, a100, stack24)
    cap = step_growth.MAX_GROWING_STEPS
    assert result.steps == 3 + cap
    assert result.peak_allocated >= (3 + cap) * fp32(1024, 1024)
    (note,) = [n for n in result.notes if n.startswith("the peak still grew")]
    assert note.startswith(f"the peak still grew at step {3 + cap} (+4.0 MiB in that step, "
                           f"{cap} steps past the limit)")
    assert "--steps all" in note


# A steady loop (Adam: its state appears at step 1, the same every step after): 3 steps, as
# before, and no note about growth.
STEADY = """
    import torch
    model = torch.nn.Linear(1024, 1024).cuda()
    opt = torch.optim.Adam(model.parameters())
    for step in range(100):
        model(torch.randn(64, 1024, device="cuda")).sum().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
"""


@verified_python
def test_a_steady_loop_stops_at_the_limit(tmp_path, a100, stack24):
    result = run(tmp_path, STEADY, a100, stack24)
    assert result.steps == 3
    assert not any("past the step limit" in n or "still grew" in n for n in result.notes)


@pytest.mark.parametrize("growth, extra", [(0, 0), (step_growth.GROWTH_BYTES, 0),
                                           (step_growth.GROWTH_BYTES + 1, 1)])
def test_only_a_rise_above_the_bar_takes_another_step(growth, extra):
    class Session:
        max_allocated_bytes = 100 * MiB

    session = Session()
    growth_tracker = step_growth.StepGrowth(session)
    growth_tracker.step_taken()
    session.max_allocated_bytes += growth
    growth_tracker.step_taken()
    assert growth_tracker.keep_going(3) is bool(extra)
    assert growth_tracker.extra_steps == extra
