"""A job that fails because the default step policy shortened its epochs (`len(loader)` said
the shortened epoch's length before any batch was skipped, and the job sized a schedule from
it) is rerun with its epochs as they are, stopped after the step limit (estimate/api.py,
`_capture_with_mode`; capture/dataloader.py, `LoaderEpochs.length_shortened`). Round 19a:
peft's AdaLoRA example sets `total_step = len(train_dataloader) * num_epochs`, and its
`update_and_allocate` entered its final phase at step 0 with no rank pattern."""

from __future__ import annotations

import textwrap

import pytest

from peakmem.estimate import EstimateError, estimate_command
from tests.capture.test_stopping import GPU, input_rows

SCHEDULE = """
    import torch
    model = torch.nn.Linear(32, 4).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.utils.data.TensorDataset(torch.randn(16 * 20 + 5, 32))
    loader = torch.utils.data.DataLoader(data, batch_size=16)
    total_steps = len(loader) * 2
    print("total steps", total_steps)
    warmup = 10  # a phase that must end before the schedule does (AdaLoRA's tfinal)
    step = 0
    for epoch in range(2):
        for (x,) in loader:
            if total_steps - warmup < step:
                raise RuntimeError(f"step {step} is past the schedule of {total_steps} steps")
            model(x.cuda()).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
            step += 1
"""


def test_a_schedule_sized_from_the_shortened_length_is_rerun_unshortened(tmp_path, capfd):
    """In this process (the child-process path reads the same flag from the child's result:
    tests/jobs/test_result_io.py)."""
    script = tmp_path / "schedule.py"
    script.write_text(textwrap.dedent(SCHEDULE))
    result = estimate_command(["python", str(script)], isolate=False, **GPU)
    # the first run saw len(loader) == 4 (8 steps, past 8 - 10 at step 0) and failed; the
    # rerun saw the loader's own 21 and was stopped after 3 steps, with no batch skipped
    out = capfd.readouterr().out
    assert "total steps 8" in out and "total steps 42" in out
    assert result.steps == 3 and result.capture.stopped
    assert input_rows(result.capture.trace, 32) == [16, 16, 16]
    note = result.notes[0]
    assert note.startswith("the job failed (RuntimeError: step 0 is past the schedule of 8 steps)")
    assert "stopped after 3 optimizer steps (as --steps 3)" in note
    assert result.capture.mode == "fake" and "rerun unshortened" in result.capture.mode_reason


def test_no_rerun_under_an_explicit_step_limit_or_when_the_rerun_fails_too(tmp_path, capfd):
    script = tmp_path / "schedule.py"
    script.write_text(textwrap.dedent(SCHEDULE))
    # --steps N shortens nothing: the job runs as written, and stops at step 3
    result = estimate_command(["python", str(script)], steps=3, isolate=False, **GPU)
    assert result.steps == 3 and not any("rerun" in note for note in result.notes)
    assert capfd.readouterr().out.count("total steps 42") == 1  # in this process: stdout
    # a job that fails with its true lengths too: the first error stands, with its hint
    failing = tmp_path / "failing.py"
    failing.write_text(textwrap.dedent(SCHEDULE).replace("warmup = 10", "warmup = 100"))
    with pytest.raises(EstimateError) as caught:
        estimate_command(["python", str(failing)], isolate=False, **GPU)
    assert "step 0 is past the schedule of 8 steps" in str(caught.value)
    assert "--steps all runs the job unchanged" in str(caught.value)


def test_a_launchers_rank_is_rerun_unshortened_too(tmp_path, capfd):
    script = tmp_path / "schedule.py"
    script.write_text(textwrap.dedent(SCHEDULE))
    result = estimate_command(["torchrun", "--nproc-per-node", "2", str(script)], isolate=False,
                              **GPU)
    assert result.steps == 3 and any("it was rerun with its epochs as they are" in note
                                     for note in result.notes)
    assert "total steps 42" in capfd.readouterr().out


MISSING_PACKAGE = """
    import torch
    data = torch.utils.data.TensorDataset(torch.randn(16 * 20 + 5, 32))
    loader = torch.utils.data.DataLoader(data, batch_size=16)
    print("steps per epoch", len(loader))  # transformers' Trainer: the schedule's length
    raise ImportError("You need to install `galore_torch` in order to use GaLore optimizers.")
"""
"""transformers' Trainer with `--optim galore_adamw` and no galore-torch: `len(loader)` is read
(the shortened length) before the optimizer is built, which raises."""


def test_an_error_the_unshortened_rerun_repeats_stands_without_the_hint(tmp_path, capfd):
    script = tmp_path / "missing.py"
    script.write_text(textwrap.dedent(MISSING_PACKAGE))
    with pytest.raises(EstimateError) as caught:
        estimate_command(["python", str(script)], isolate=False, **GPU)
    # the first run read the shortened length (4), the rerun the loader's own (21): both
    # failed alike, so the shortening was not the cause and no --steps all hint is given
    out = capfd.readouterr().out
    assert "steps per epoch 4" in out and "steps per epoch 21" in out
    message = str(caught.value)
    assert "ImportError: You need to install `galore_torch`" in message
    assert "--steps all" not in message
    assert "peakmem shortened" not in message
