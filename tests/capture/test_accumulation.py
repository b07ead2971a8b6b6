"""Gradient accumulation reaches the steady state: at least two optimizer steps with the
optimizer state live, across whole accumulation windows, in every loop shape (a hand loop, HF
Trainer, Lightning, accelerate's accumulate())."""

import textwrap

import pytest
import torch

from peakmem.capture import capture_callable
from peakmem.capture.accumulation import STEADY_STEPS, window_in_callers
from peakmem.estimate import estimate_command
from tests.capture.capture_helpers import allocations

GPU = {"gpu": "a100-40gb", "torch_version": "2.4.1"}
BATCHES = 300  # batches per epoch (+1 smaller last one in the hand loop)


def write(tmp_path, body, name="train.py"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return str(path)


def accumulation_note(notes):
    return [note for note in notes if note.startswith("traced ") and "accumulation window" in note]


def hand_loop(accum, epochs):
    def job():
        model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.GELU(), torch.nn.Linear(64, 4))
        model.cuda()
        optimizer = torch.optim.AdamW(model.parameters())
        data = torch.utils.data.TensorDataset(torch.randn(4 * BATCHES + 3, 16))
        loader = torch.utils.data.DataLoader(data, batch_size=4)
        for _epoch in range(epochs):
            for i, (x,) in enumerate(loader):
                (model(x.cuda()).square().mean() / accum).backward()
                if (i + 1) % accum == 0:
                    optimizer.step()
                    optimizer.zero_grad()

    return job


def optimizer_state_allocs(trace):
    return allocations(trace, "optimizer_state")


@pytest.mark.parametrize("accum", [4, 64])
def test_a_hand_loop_with_accumulation_traces_two_steps(a100, stack24, accum):
    result = capture_callable(hand_loop(accum, epochs=1), gpu=a100, stack=stack24)
    assert result.error is None, result.error_text
    assert result.steps == STEADY_STEPS
    assert result.backward_passes == STEADY_STEPS * accum + 1  # two windows, then the last batch
    assert accumulation_note(result.notes) == [
        f"traced 2 optimizer steps over {2 * accum + 1} batches (accumulation window {accum})"
    ]
    assert any(f"traced {2 * accum} full batches, then its last batch" in n for n in result.notes)
    # the second window's forward and backward ran with the optimizer state allocated
    assert optimizer_state_allocs(result.trace)
    assert not any("only 1 optimizer step" in n for n in result.notes)


def test_accumulation_across_epochs_ends_the_loop_after_the_measured_epoch(a100, stack24):
    result = capture_callable(hand_loop(4, epochs=5), gpu=a100, stack=stack24)
    assert result.error is None, result.error_text
    # epoch 1: 2 steps over 9 batches; epoch 2: 2 more (the limit: epoch + 2), then its last
    # batch; later epochs yield their last batch only
    assert result.steps == 4
    assert result.trace.meta["loop_ended"]


def test_without_accumulation_the_epoch_is_shortened_as_before(a100, stack24):
    result = capture_callable(hand_loop(1, epochs=1), gpu=a100, stack=stack24)
    assert result.steps == 4  # 3 full batches and the last
    assert accumulation_note(result.notes) == []


def test_a_window_larger_than_the_epoch_says_the_steady_state_was_not_seen(a100, stack24):
    def job():
        model = torch.nn.Linear(16, 4).cuda()
        optimizer = torch.optim.Adam(model.parameters())
        loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(40, 16)), batch_size=4)
        for i, (x,) in enumerate(loader):
            model(x.cuda()).sum().backward()
            if (i + 1) % 8 == 0 or i + 1 == 10:
                optimizer.step()
                optimizer.zero_grad()
                break

    result = capture_callable(job, gpu=a100, stack=stack24)
    assert result.steps == 1
    assert any(n.startswith("only 1 optimizer step was traced over 8 backward passes") for n in result.notes)


def test_window_sources_read_the_frameworks_declared_window():
    class TrainingArguments:  # noqa: D401  (the name is what the source looks for)
        gradient_accumulation_steps = 16

    class Other:
        gradient_accumulation_steps = 16

    def asks(args):
        return window_in_callers(skip=1)

    class SFTConfig(TrainingArguments):  # TRL's configs subclass TrainingArguments
        pass

    assert asks(TrainingArguments()) == 16
    assert asks(SFTConfig()) == 16
    assert asks(Other()) is None
    TrainingArguments.gradient_accumulation_steps = 10**6
    assert asks(TrainingArguments()) == 256  # capped


HF_TRAINER = """
    import sys, tempfile, torch
    from transformers import Trainer, TrainingArguments

    class Tokens(torch.utils.data.Dataset):
        def __len__(self):
            return 2 * 300
        def __getitem__(self, i):
            return {"x": torch.randn(16)}

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.GELU(), torch.nn.Linear(64, 4))
        def forward(self, x):
            return {"loss": self.net(x).square().mean()}

    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(output_dir=out, num_train_epochs=1, per_device_train_batch_size=2,
            gradient_accumulation_steps=int(sys.argv[1]), report_to=[], save_strategy="no",
            dataloader_num_workers=0, remove_unused_columns=False, use_cpu=False)
        Trainer(model=Net(), args=args, train_dataset=Tokens()).train()
"""

LIGHTNING = """
    import sys, torch, lightning as L

    class M(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
        def training_step(self, batch, i):
            return self.net(batch[0]).square().mean()
        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters())

    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(4 * 300, 16)), batch_size=4)
    L.Trainer(accelerator="gpu", devices=1, max_epochs=1, accumulate_grad_batches=int(sys.argv[1]),
              enable_checkpointing=False, logger=False, enable_progress_bar=False,
              enable_model_summary=False).fit(M(), loader)
"""

ACCELERATE = """
    import sys, torch
    from accelerate import Accelerator

    accelerator = Accelerator(gradient_accumulation_steps=int(sys.argv[1]))
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    optimizer = torch.optim.AdamW(model.parameters())
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(4 * 300, 16)), batch_size=4)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for (x,) in loader:
        with accelerator.accumulate(model):
            accelerator.backward(model(x).square().mean())
            optimizer.step()
            optimizer.zero_grad()
"""


@pytest.mark.parametrize("accum", [4, 64])
@pytest.mark.parametrize("script", [HF_TRAINER, LIGHTNING, ACCELERATE], ids=["hf", "lightning", "accelerate"])
def test_framework_accumulation_traces_two_steps_with_the_state_live(tmp_path, script, accum):
    try:  # in-process (the libraries are imported once): their process-wide state is reset after
        result = estimate_command(["python", write(tmp_path, script), str(accum)], isolate=False, **GPU)
    finally:
        _reset_accelerate()
    assert result.steps >= STEADY_STEPS, result.notes
    assert result.estimate_kind == "training"
    [note] = accumulation_note(result.notes)
    assert note.endswith(f"(accumulation window {accum})")
    assert result.breakdown.by_category.get("optimizer_state", 0) > 0


def _reset_accelerate():
    """accelerate's process-wide AcceleratorState (HF Trainer and accelerate jobs make one): a
    later job in this process may ask for another precision."""
    import sys

    state = sys.modules.get("accelerate.state")
    if state is not None:
        state.AcceleratorState._reset_state(reset_partial_state=True)
        state.GradientState._reset_state()


def test_reading_windows_never_keeps_a_callers_locals_alive():
    """Python < 3.13 keeps a snapshot of `f_locals` on the frame: looking for a window in a
    training loop's frame must not keep its previous batch alive after the loop rebinds it."""
    import gc
    import weakref

    from peakmem.capture.accumulation import window_in_callers

    class Batch:
        pass

    def ask():
        return window_in_callers(skip=2)

    def loop_without_source_names():
        batch = Batch()
        seen = weakref.ref(batch)
        assert ask() is None
        batch = None  # the loop moves on
        gc.collect()
        return seen() is None

    class Loop:
        def run(self):
            batch = Batch()
            seen = weakref.ref(batch)
            assert ask() is None  # a frame with `self` is read (a framework's could answer)
            batch = None
            gc.collect()
            return seen() is None

    assert loop_without_source_names()
    assert Loop().run()


@pytest.mark.parametrize("accum", [2, 4])
def test_len_of_a_waiting_epoch_stays_above_the_batch_index(a100, stack24, accum):
    """MAE's engine sets the lr each window from `step / len(loader) + epoch`: an epoch that
    yields full batches past its shortened length (waiting for its accumulation steps) said
    `len(loader)` = 4 while it yielded 5 or more, so the schedule passed its warm-up epoch
    (MAE divided by zero there)."""
    seen = []

    def job():
        model = torch.nn.Linear(16, 4).cuda()
        optimizer = torch.optim.AdamW(model.parameters())
        data = torch.utils.data.TensorDataset(torch.randn(4 * BATCHES, 16))
        loader = torch.utils.data.DataLoader(data, batch_size=4)
        for i, (x,) in enumerate(loader):
            seen.append((i, len(loader)))
            (model(x.cuda()).square().mean() / accum).backward()
            if (i + 1) % accum == 0:
                optimizer.step()
                optimizer.zero_grad()

    result = capture_callable(job, gpu=a100, stack=stack24)
    assert result.error is None, result.error_text
    assert len(seen) > 4  # it waited for two whole windows
    assert all(i < length for i, length in seen), seen
    assert seen[-1][0] == seen[-1][1] - 1  # the last batch is the last of the epoch it says
