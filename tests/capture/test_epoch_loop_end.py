"""The epoch loop around an ended DataLoader loop is ended too (capture/phases.py
`_end_epoch_loop`, capture/loop_ends.py `plan(epoch_loop=True)`): after LATER_EPOCHS_KEPT later
epochs, each with its per-epoch evaluation, the job's `for epoch in range(E):` / `while` is
ended at its head, so the code after it runs once and the job ends (round 22b: minDiffusion's
superminddpm.py ran ~34 of its 999-step samplings by default).

Each job is a small script run in this process (`runpy`: its frames are the job's own code).
The peaks compared are the simulated allocator's allocated bytes (A100, torch 2.4)."""

import runpy
import sys
import textwrap
import time

import pytest

from peakmem.capture import loop_ends
from peakmem.capture.phases import LATER_EPOCHS_KEPT
from peakmem.estimate import estimate

pytestmark = pytest.mark.skipif(
    sys.version_info[:2] not in loop_ends.VERIFIED_PYTHONS,
    reason="loops are ended only on the CPython versions capture/loop_exits.py was verified on")

# 40 rows in batches of 8 (5 batches: shortened to 3 + the last), EPOCHS epochs; each epoch
# followed by an evaluation of EVAL rows (a (EVAL, 1024) hidden: larger than training's), the
# evaluation's output kept until the next one (`last`); after the epochs, a final pass over
# FINAL rows (larger again).
PER_EPOCH_EVAL = """
    import torch
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 64)).cuda()
    opt = torch.optim.Adam(model.parameters())
    loader = torch.utils.data.DataLoader(torch.randn(40, 64), batch_size=8)
    EPOCHS, EVAL, FINAL = {epochs}, 512, 2048

    def evaluate(rows):
        model.eval()
        with torch.no_grad():
            out = model(torch.randn(rows, 64, device="cuda"))
        model.train()
        return out

    def train_epoch():
        for x in loader:
            model(x.cuda()).square().mean().backward()
            opt.step()
            opt.zero_grad()

    last = None
    {loop}
    final = evaluate(FINAL)
"""
IN_FRAME = """for epoch in range(EPOCHS):
        for x in loader:
            model(x.cuda()).square().mean().backward()
            opt.step()
            opt.zero_grad()
        last = evaluate(EVAL)"""
IN_CALLER = """epoch = 0
    while epoch < EPOCHS:
        train_epoch()
        last = evaluate(EVAL)
        epoch += 1"""


def run(tmp_path, loop, epochs, **kwargs):
    path = tmp_path / "job.py"
    path.write_text(textwrap.dedent(PER_EPOCH_EVAL.format(epochs=epochs, loop=loop)))
    start = time.monotonic()
    est = estimate(runpy.run_path, str(path), run_name="__main__", gpu="a100-40gb",
                   torch_version="2.4.1", **kwargs)
    assert est.capture is not None and est.capture.error is None, est.capture.error_text
    return est, time.monotonic() - start


@pytest.mark.parametrize("loop", [IN_FRAME, IN_CALLER], ids=["same-frame", "caller"])
def test_per_epoch_evaluation_then_code_after_the_epochs(tmp_path, loop):
    full, _ = run(tmp_path, loop, 12, steps="all")
    short, _ = run(tmp_path, loop, 12)
    assert full.steps == 12 * 5 and not full.capture.stopped
    # first epoch 4 steps, the second ended after its 3rd (the limit 4 + 2, then its last
    # batch), then LATER_EPOCHS_KEPT later epochs of one batch; the code after the loop ran
    assert short.steps == 4 + 3 + LATER_EPOCHS_KEPT and not short.capture.stopped
    assert any(note.startswith("ended the epoch loop around the training loop (job.py:")
               for note in short.capture.notes), short.capture.notes
    assert short.peak_allocated_bytes == full.peak_allocated_bytes
    assert short.peak_bytes == full.peak_bytes
    # the final pass over 2048 rows sets the peak: (2048, 1024) fp32 hidden = 8 MiB
    assert short.peak_allocated_bytes >= 2048 * 1024 * 4


def test_the_default_run_is_bounded_however_many_epochs(tmp_path):
    few, few_s = run(tmp_path, IN_FRAME, 12)
    many, many_s = run(tmp_path, IN_FRAME, 1000)
    assert few.steps == many.steps == 4 + 3 + LATER_EPOCHS_KEPT
    assert many.peak_allocated_bytes == few.peak_allocated_bytes
    assert many_s < few_s + 5  # not 1000 epochs' worth of evaluations


def test_the_later_epochs_kept_hold_what_they_hold(tmp_path):
    """Epochs that each keep more on the device (a list of every evaluation's output): the
    default runs 4 epochs (the first, the ended one and LATER_EPOCHS_KEPT later ones), so its
    peak is that of the job run to its end with 4 epochs, below the 12 epochs' (noted: the
    epochs after them "repeat the same allocations" is the assumption)."""
    grows = "kept = []\n    " + IN_FRAME.replace("last = evaluate(EVAL)",
                                                  "kept.append(evaluate(EVAL))")
    short, _ = run(tmp_path, grows, 12)
    four, _ = run(tmp_path, grows, 2 + LATER_EPOCHS_KEPT, steps="all")
    twelve, _ = run(tmp_path, grows, 12, steps="all")
    assert short.peak_allocated_bytes == four.peak_allocated_bytes
    # 8 more (512, 64) fp32 outputs kept by the 12 epochs' run
    assert twelve.peak_allocated_bytes - four.peak_allocated_bytes == 8 * 512 * 64 * 4


TWO_CALLS = """
    import torch
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 64)).cuda()
    loader = torch.utils.data.DataLoader(torch.randn(40, 64), batch_size=8)

    def train_model(epochs):
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        for epoch in range(epochs):
            for x in loader:
                model(x.cuda()).square().mean().backward()
                opt.step()
                opt.zero_grad()
            with torch.no_grad():
                model(torch.randn(256, 64, device="cuda"))
        print("done", epoch)

    train_model(12)
    train_model(12)
    with torch.no_grad():
        model(torch.randn(4096, 64, device="cuda"))
"""


def test_a_second_epoch_loop_is_ended_after_its_own_limit(tmp_path, capsys):
    path = tmp_path / "job.py"
    path.write_text(textwrap.dedent(TWO_CALLS))
    est = estimate(runpy.run_path, str(path), run_name="__main__", gpu="a100-40gb",
                   torch_version="2.4.1")
    assert est.capture is not None and est.capture.error is None, est.capture.error_text
    # the first call: 4 + 3 steps, then 2 later epochs (epochs 0-3); the second call's new
    # optimizer takes the limit (6) again, one batch an epoch (the loop was ended), then its
    # epoch loop ends (epochs 0-5); `steps` is the most-stepped optimizer's
    assert est.steps == 4 + 3 + LATER_EPOCHS_KEPT and not est.capture.stopped
    assert capsys.readouterr().out.split("\n")[-3:] == ["done 3", "done 5", ""]
    line = TWO_CALLS.count("\n", 0, TWO_CALLS.index("for epoch in range(epochs)")) + 1
    assert any(note.startswith(f"ended the epoch loop around the training loop (job.py:{line}, "
                               f"job.py:{line})") for note in est.capture.notes), est.capture.notes
    # the final pass ran: a (4096, 1024) fp32 hidden
    assert est.peak_allocated_bytes >= 4096 * 1024 * 4


def test_code_after_the_epochs_sized_by_their_count_is_rerun_with_every_epoch(tmp_path):
    """The PyTorch fine-tuning tutorial plots its per-epoch history against `range(1,
    num_epochs + 1)`: with its epoch loop ended the lengths differ and matplotlib raises. The
    job is rerun with every epoch (estimate/api.py `_every_epoch_on_failure`), not stopped at
    the first run's step count (the unshortened rerun: the code after the epochs, here the
    final pass that sets the peak, would not run)."""
    sized = "history = []\n    " + IN_FRAME.replace(
        "last = evaluate(EVAL)", "last = evaluate(EVAL)\n        history.append(epoch)") + (
        "\n    if len(history) != EPOCHS:"
        "\n        raise ValueError('x and y must have same first dimension')")
    full, _ = run(tmp_path, sized, 12, steps="all")
    est, _ = run(tmp_path, sized, 12)
    # the first epoch 4 steps, the ended one 3, then every later epoch its last batch (10)
    assert est.steps == 4 + 3 + 10 and not est.capture.stopped
    assert est.capture.trace.meta["steps_policy"] == "auto-every-epoch"
    assert est.capture.notes[0].startswith(
        "the job failed (ValueError: x and y must have same first dimension) after peakmem "
        "ended its epoch loop early"), est.capture.notes
    assert not any(note.startswith("ended the epoch loop") for note in est.capture.notes)
    # the final pass over 2048 rows ran and sets the peak, as in the job run to its end
    assert est.peak_allocated_bytes == full.peak_allocated_bytes >= 2048 * 1024 * 4
