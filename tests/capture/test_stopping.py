"""How long a captured job runs: the training loop ended early (what follows it still runs),
stopped where it cannot be ended, `steps="all"`, training without torch.optim, honest notes."""

import json
import textwrap

import pytest
import torch
from click.testing import CliRunner

from peakmem.capture import capture_callable, capture_command
from peakmem.capture.compiled_code import CUDA_GRAPH_POOLS
from peakmem.capture.phases import MAX_BARE_EPOCHS, MAX_STEPS_AFTER_END
from peakmem.capture.runner import NO_DEVICE_NOTE
from peakmem.cli.main import main
from peakmem.estimate import estimate, estimate_command
from peakmem.trace.events import EventKind
from tests.capture.capture_helpers import allocations

GPU = {"gpu": "a100-40gb", "torch_version": "2.4.1"}


def job_notes(result):
    """The notes about the job (not the one about torchvision's ops, present once an earlier
    test in this process imported torchvision)."""
    return [note for note in result.notes if not note.startswith("torchvision's compiled ops")]


def write(tmp_path, body, name="train.py"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return str(path)


def marks(trace):
    return [trace.tag_of(i).op for i, kind in enumerate(trace.kinds) if kind == EventKind.MARK]


def input_rows(trace, width):
    return [size // (width * 4) for size, _ in allocations(trace, "input") if size % (width * 4) == 0]


def stop_note(steps, where, unit="optimizer steps"):
    return (
        f"stopped after {steps} {unit} ({where}); what the script does after that — later "
        "epochs, evaluation, saving — did not run; --steps all runs it to the end"
    )


def ended_note(at, epoch, total, unit="optimizer steps"):
    return (
        f"training loop ended early after {at} {unit} (in epoch {epoch}): its DataLoader "
        "skipped to the epoch's last batch and stopped, and each later epoch ran its last batch "
        f"only ({total} steps in all); the code after the training loop ran; --steps all runs "
        "every batch"
    )


EVAL_NOTE = "an evaluation phase (forward passes without gradients) ran after training and was traced"
EVAL_PEAK = "the peak was set by the evaluation after training"
TRAIN_PEAK = "the peak was set during training, not by the evaluation after it"
NO_LOADER = ("its training loop does not iterate a DataLoader and could not be ended early: no "
             "loop of the job's own code encloses its steps")
"""Where the default policy cannot end a loop without a DataLoader (capture/loop_ends.py): here
the jobs are exec'd strings, not files of the job's own."""


def low_note(steps, where, unit="optimizer steps"):
    """The stop note where what follows the loop did not run: the estimate may be low."""
    return (
        f"stopped after {steps} {unit} ({where}); what the script does after that — later "
        "loops, evaluation, sampling, saving — did not run: the estimate may be low if that "
        "reaches a higher peak; --steps all runs it to the end (and checks it)"
    )

# A training set of 84 rows in batches of 8 (11 batches, the last of 4 rows), 3 epochs, then an
# evaluation in batches of EVAL_BATCH rows, much larger than the training batches.
TRAIN_THEN_EVAL = """
    import torch
    torch.manual_seed(0)
    EVAL_BATCH = {eval_batch}
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10)).to("cuda")
    opt = torch.optim.Adam(model.parameters())
    train = torch.utils.data.TensorDataset(torch.randn(84, 64), torch.randint(0, 10, (84,)))
    val = torch.utils.data.TensorDataset(torch.randn(4 * EVAL_BATCH, 64), torch.randint(0, 10, (4 * EVAL_BATCH,)))
    train_loader = torch.utils.data.DataLoader(train, batch_size=8, shuffle=True)
    val_loader = torch.utils.data.DataLoader(val, batch_size=EVAL_BATCH)
    for epoch in range(3):
        model.train()
        losses = []
        for x, y in train_loader:
            loss = torch.nn.functional.cross_entropy(model(x.cuda()), y.cuda())
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        print("epoch", epoch, sum(losses) / len(losses))
    model.eval()
    with torch.no_grad():
        for x, y in val_loader:
            model(x.cuda()).argmax(1)
"""


def test_an_evaluation_after_training_is_run_and_sets_the_peak_by_default(tmp_path):
    script = write(tmp_path, TRAIN_THEN_EVAL.format(eval_batch=4096))
    result = estimate_command(["python", script], **GPU)
    notes = result.notes
    assert ended_note(6, 2, 8) in notes
    assert EVAL_NOTE in notes and EVAL_PEAK in notes
    assert not result.capture.stopped and result.estimate_kind == "training"
    trace = result.capture.trace
    assert trace.meta["phases_ran"] == ["training", "eval"] and trace.meta["loop_ended"]
    labels = marks(trace)
    assert labels.index("training loop ended") < labels.index("eval")
    # the evaluation's activations are at the peak: 4096 x 1024 floats (`activation` of the
    # eval phase: capture/phases.py)
    assert result.breakdown.by_category["activation"] >= 4096 * 1024 * 4
    assert "temporary" not in result.breakdown.by_category
    # running everything gives the same peak
    full = estimate_command(["python", script], steps="all", **GPU)
    assert full.peak_bytes == result.peak_bytes
    assert full.peak_allocated_bytes == result.peak_allocated_bytes
    # stopping after 3 steps misses it, and says so
    stopped = estimate_command(["python", script], steps=3, **GPU)
    assert stopped.peak_allocated_bytes < result.peak_allocated_bytes / 2
    assert stop_note(3, "--steps 3, in epoch 1 of its DataLoader") in stopped.notes
    assert EVAL_NOTE not in stopped.notes and stopped.capture.stopped
    assert stopped.to_json()["stopped"] and stopped.to_json()["phases_ran"] == ["training"]
    payload = result.to_json()
    assert not payload["stopped"] and payload["phases_ran"] == ["training", "eval"]


def test_a_small_evaluation_is_seen_and_training_keeps_the_peak(tmp_path):
    script = write(tmp_path, TRAIN_THEN_EVAL.format(eval_batch=2))
    result = estimate_command(["python", script], **GPU)
    assert EVAL_NOTE in result.notes and TRAIN_PEAK in result.notes


def test_steps_all_runs_every_batch_of_every_epoch(a100, stack24):
    def job():
        model = torch.nn.Linear(8, 2).cuda()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        data = torch.utils.data.TensorDataset(torch.randn(8 * 9 + 3, 8))
        for _epoch in range(2):
            for (x,) in torch.utils.data.DataLoader(data, batch_size=8):
                model(x.cuda()).sum().backward()
                optimizer.step()

    result = capture_callable(job, gpu=a100, stack=stack24, steps="all")
    assert result.error is None, result.error_text
    assert input_rows(result.trace, 8) == ([8] * 9 + [3]) * 2
    assert result.steps == 20 and not result.stopped
    assert job_notes(result) == []
    assert result.trace.meta["steps_policy"] == "all"
    # the default shortens each epoch (3 full batches and the last) and ends the loop
    short = capture_callable(job, gpu=a100, stack=stack24)
    assert input_rows(short.trace, 8) == [8, 8, 8, 3, 8, 8, 3]
    assert ended_note(6, 2, 7) in short.notes


SHORTENED_EPOCHS = """
    import torch
    model = torch.nn.Sequential(torch.nn.Linear(32, 512), torch.nn.GELU(), torch.nn.Linear(512, 4)).cuda()
    opt = torch.optim.AdamW(model.parameters())
    data = torch.utils.data.TensorDataset(torch.randn(16 * 20 + 5, 32))
    loader = torch.utils.data.DataLoader(data, batch_size=16, shuffle=True)
    for epoch in range(4):
        for (x,) in loader:
            model(x.cuda()).square().mean().backward()
            opt.step()
            opt.zero_grad(set_to_none=epoch % 2 == 0)
        with torch.no_grad():
            for (x,) in loader:
                model(x.cuda()).sum()
"""


def test_the_exact_shortening_gives_the_peak_of_the_whole_run(tmp_path):
    script = write(tmp_path, SHORTENED_EPOCHS)
    short = estimate_command(["python", script], **GPU)
    full = estimate_command(["python", script], steps="all", **GPU)
    assert full.steps == 4 * 21 and short.steps == 6 + 1 + 2
    assert short.peak_bytes == full.peak_bytes
    assert short.peak_allocated_bytes == full.peak_allocated_bytes
    assert (
        "DataLoader epoch of 21 batches: traced 3 full batches, then its last batch (the 17 "
        "between repeat the same allocations when every batch has the same shapes)"
    ) in short.notes
    # the evaluation over the same loader (under no_grad) is shortened, not ended
    rows = input_rows(short.capture.trace, 32)
    assert rows == [16, 16, 16, 5] * 2 + [16, 16, 5] + [16, 16, 16, 5] + [5, 16, 16, 16, 5] * 2


@pytest.mark.parametrize(
    "update",
    [
        "p.data -= 0.1 * p.grad",
        "p.data.add_(p.grad, alpha=-0.1)",
        "p.data = p.data - 0.1 * p.grad",
        "with torch.no_grad():\n                        p -= 0.1 * p.grad",
    ],
)
def test_manual_parameter_updates_are_training_steps(a100, stack24, update):
    body = f"""
        def job():
            model = torch.nn.Linear(16, 4).cuda()
            for step in range(100):
                model(torch.randn(8, 16, device="cuda")).sum().backward()
                for p in model.parameters():
                    {update}
                    p.grad = None
    """
    scope = {"torch": torch}
    exec(textwrap.dedent(body), scope)  # noqa: S102  (the test's own job)
    result = capture_callable(scope["job"], gpu=a100, stack=stack24)
    assert result.error is None, result.error_text
    assert result.steps == 3 and result.stopped
    assert job_notes(result) == [
        "training recognised from in-place parameter updates after backward (no torch.optim "
        "optimizer): each update after a backward counts as a step",
        low_note(3, NO_LOADER, unit="parameter updates"),
    ]
    # it stops where the 4th step's forward starts
    assert marks(result.trace)[-3:] == ["backward", "step 3", "stopped"]


def test_foreach_updates_over_a_dataloader_end_its_loop(tmp_path):
    script = write(tmp_path, """
        import torch
        model = torch.nn.Linear(16, 4).cuda()
        params = list(model.parameters())
        data = torch.utils.data.TensorDataset(torch.randn(8 * 10, 16))
        for epoch in range(3):
            for (x,) in torch.utils.data.DataLoader(data, batch_size=8):
                model(x.cuda()).sum().backward()
                with torch.no_grad():
                    torch._foreach_add_(params, [p.grad for p in params], alpha=-0.1)
                model.zero_grad()
        with torch.no_grad():
            model(torch.randn(512, 16, device="cuda"))
    """)
    result = estimate_command(["python", script], **GPU)
    assert result.estimate_kind == "training" and result.steps == 8
    assert ended_note(6, 2, 8, unit="parameter updates") in result.notes
    assert EVAL_NOTE in result.notes


def test_backward_without_an_update_is_noted(a100, stack24):
    def job():
        model = torch.nn.Linear(16, 4).cuda()
        for _ in range(5):
            model(torch.randn(8, 16, device="cuda")).sum().backward()

    result = capture_callable(job, gpu=a100, stack=stack24)
    assert result.steps == 0 and not result.stopped and result.backward_passes == 5
    assert job_notes(result) == [
        "training (no parameter update seen): the job ran 5 backward pass(es) but no optimizer "
        "step and no in-place update of a parameter after a backward"
    ]
    # parameter initialisation before any backward is no update
    est = estimate(job, **GPU)
    assert est.estimate_kind == "training" and est.to_json()["estimate_kind"] == "training"


def test_a_forward_only_job_is_a_forward_estimate(a100, stack24):
    def job():
        model = torch.nn.Linear(16, 4).cuda()
        with torch.no_grad():
            model(torch.randn(8, 16, device="cuda"))

    result = capture_callable(job, gpu=a100, stack=stack24)
    assert job_notes(result) == ["the job never ran a backward pass: this is a forward/inference estimate"]
    assert estimate(job, **GPU).estimate_kind == "forward"


def test_a_job_that_never_uses_the_gpu_gets_a_warning_and_no_phantom_memory(tmp_path):
    script = write(tmp_path, """
        import torch
        model = torch.nn.Sequential(
            torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.Flatten(),
            torch.nn.Linear(4 * 6 * 6, 2))
        opt = torch.optim.Adam(model.parameters())
        for i in range(5):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = torch.nn.functional.scaled_dot_product_attention(
                    *[torch.randn(1, 2, 4, 8)] * 3).sum() + model(torch.randn(2, 3, 8, 8)).sum()
            loss.backward()
            opt.step()
            opt.zero_grad()
        torch.nn.functional.embedding(torch.tensor([1, 2]), torch.randn(4, 4, requires_grad=True)).sum().backward()
    """)
    result = estimate_command(["python", script], **GPU)
    assert NO_DEVICE_NOTE in result.notes
    assert NO_DEVICE_NOTE == (
        "WARNING: the job made no device allocations: it never used the GPU (did it run on the "
        "CPU?); the estimate is the CUDA context alone"
    )
    assert result.peak_reserved_bytes == 0 and result.libraries == {}
    assert result.peak_bytes == result.context_bytes
    assert len(result.capture.trace.kinds) == result.capture.trace.kinds.count(EventKind.MARK)


def test_a_gpu_job_gets_no_warning(a100, stack24):
    def job():
        torch.nn.Linear(4, 4).cuda()(torch.randn(2, 4, device="cuda"))

    assert NO_DEVICE_NOTE not in capture_callable(job, gpu=a100, stack=stack24).notes


NANOGPT = """
    import torch
    model = torch.nn.Linear(32, 32).cuda()
    optimizer = torch.optim.AdamW(model.parameters())
    data = torch.randn(1000, 32)
    def get_batch():
        ix = torch.randint(0, 990, (4,))
        return data[ix].cuda(), data[ix + 1].cuda()
    iter_num, max_iters = 0, 5000
    while True:
        X, Y = get_batch()
        loss = torch.nn.functional.mse_loss(model(X), Y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        iter_num += 1
        if iter_num > max_iters:
            break
    torch.save(model.state_dict(), "after.pt")
    print("saved at", iter_num)
"""


def test_a_loop_without_a_dataloader_is_ended_and_what_follows_runs(tmp_path, a100, stack24,
                                                                    monkeypatch, capfd):
    monkeypatch.chdir(tmp_path)
    script = write(tmp_path, NANOGPT)
    result = capture_command(["python", script], gpu=a100, stack=stack24)
    assert result.error is None, result.error_text
    # `while True` ended after 3 steps (capture/loop_ends.py): the save after it ran, with
    # the job's own counter where the loop was left
    assert result.steps == 3 and not result.stopped
    saved, ended = job_notes(result)
    # the save went to a scratch directory, not the user's file
    assert saved.startswith("the job saved 1 file(s) of fake device data") and "after.pt" in saved
    assert not (tmp_path / "after.pt").exists()
    assert [ended] == [
        "ended 1 training loop(s) without a DataLoader at the step limit (train.py:11): each "
        "finished the iteration that took its last step, then the script went on after the "
        "loop (its remaining iterations did not run; the code after it — later loops, "
        "evaluation, sampling — ran); --steps all runs every iteration"
    ]
    assert "saved at 3" in "".join(capfd.readouterr())
    assert "training loop ended" in marks(result.trace) and not result.trace.meta["stopped"]
    explicit = capture_command(["python", script], gpu=a100, stack=stack24, steps=5)
    assert job_notes(explicit) == [stop_note(5, "--steps 5")]
    assert explicit.stopped and "saved at" not in "".join(capfd.readouterr())


def runaway_note(steps):
    return (
        f"stopped after {steps} optimizer steps: the job kept training after peakmem ended its "
        "training loop early at step 6 (more epochs with nothing else between them, or a loop "
        "over a step count that re-iterates its DataLoader); what the script does after that — "
        "later epochs, evaluation, saving — did not run; --steps all runs it to the end"
    )


def test_a_loop_that_reiterates_its_dataloader_until_a_step_count_is_stopped(a100, stack24):
    def job():
        model = torch.nn.Linear(8, 2).cuda()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        loader = torch.utils.data.DataLoader(torch.randn(80, 8), batch_size=8)
        step = 0
        while step < 10_000:
            for x in loader:
                model(x.cuda()).sum().backward()
                optimizer.step()
                step += 1

    result = capture_callable(job, gpu=a100, stack=stack24)
    # 4 + 3 steps, then later epochs of one batch: the 4th of them in a row with nothing else
    # between them stops the job
    assert result.steps == 7 + MAX_BARE_EPOCHS + 1 and result.stopped
    assert result.notes[-1] == runaway_note(11)


def test_per_epoch_evaluation_keeps_later_epochs_running_to_the_end(a100, stack24):
    def job(epochs):
        model = torch.nn.Linear(8, 2).cuda()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        loader = torch.utils.data.DataLoader(torch.randn(80, 8), batch_size=8)
        for _epoch in range(epochs):
            for x in loader:
                model(x.cuda()).sum().backward()
                optimizer.step()
            with torch.no_grad():
                model(torch.randn(64, 8, device="cuda"))
        torch.cuda.synchronize()
        model(torch.randn(1000, 8, device="cuda"))  # after the last epoch

    result = capture_callable(job, 12, gpu=a100, stack=stack24)
    assert result.steps == 7 + 10 and not result.stopped
    assert marks(result.trace)[-1] == "forward"
    # an epoch loop long enough runs into the step budget after the end
    long = capture_callable(job, 100, gpu=a100, stack=stack24)
    assert long.steps == 6 + MAX_STEPS_AFTER_END and long.notes[-2] == runaway_note(38)


def test_a_next_past_a_shortened_epoch_keeps_the_estimate_and_says_so(a100, stack24):
    def job():
        model = torch.nn.Linear(8, 2).cuda()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        loader = torch.utils.data.DataLoader(torch.randn(80, 8), batch_size=8)
        for _epoch in range(2):
            batches = iter(loader)
            for _ in range(len(loader)):
                model(next(batches).cuda()).sum().backward()
                optimizer.step()

    result = capture_callable(job, gpu=a100, stack=stack24)
    assert result.error is None and result.exit_code == 0
    # len(loader) is the shortened epoch's (4): the ended epoch (3 batches) runs out first
    assert result.stopped and result.steps == 4 + 3
    assert job_notes(result) == [
        "DataLoader epoch of 10 batches: traced 3 full batches, then its last batch (the 6 "
        "between repeat the same allocations when every batch has the same shapes)",
        ended_note(6, 2, 7),
        "the job raised StopIteration after peakmem shortened its DataLoader epochs (a next() "
        "on an iterator that ended early); the estimate covers what ran until then (what "
        "follows did not run); --steps all runs the job unchanged",
    ]
    assert capture_callable(job, gpu=a100, stack=stack24, steps="all").steps == 20


def test_the_jobs_own_error_after_shortening_fails_with_a_hint(a100, stack24):
    def job():
        model = torch.nn.Linear(8, 2).cuda()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        loader = torch.utils.data.DataLoader(torch.randn(80, 8), batch_size=8)
        for _epoch in range(2):
            seen = 0
            for x in loader:
                model(x.cuda()).sum().backward()
                optimizer.step()
                seen += 1
            if seen != len(loader):
                raise RuntimeError(f"saw {seen} of {len(loader)} batches")

    result = capture_callable(job, gpu=a100, stack=stack24)
    assert result.exit_code == 1 and "RuntimeError: saw 3 of 4 batches" in result.error_text
    assert result.error_text.endswith(
        "peakmem: the job failed after peakmem shortened its DataLoader epochs (3 full batches "
        "and the last, the training loop ended after a few steps); if that caused it, --steps "
        "all runs the job unchanged"
    )
    assert capture_callable(job, gpu=a100, stack=stack24, steps="all").error is None

    def failing():  # an error before any shortening: no hint
        raise RuntimeError("broken")

    failed = capture_callable(failing, gpu=a100, stack=stack24)
    assert failed.exit_code == 1 and "--steps all" not in failed.error_text


def test_a_multi_worker_loader_loads_in_the_main_process(a100, stack24):
    def job():
        model = torch.nn.Linear(8, 2).cuda()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        loader = torch.utils.data.DataLoader(
            torch.randn(8 * 30 + 2, 8), batch_size=8, num_workers=2, persistent_workers=True
        )
        for _epoch in range(2):
            for x in loader:
                model(x.cuda()).sum().backward()
                optimizer.step()

    result = capture_callable(job, gpu=a100, stack=stack24)
    assert result.error is None, result.error_text
    assert input_rows(result.trace, 8) == [8, 8, 8, 2, 8, 8, 2]
    assert (
        "a DataLoader with num_workers=2 loaded its batches in the main process during the "
        "capture (GPU memory does not depend on it)"
    ) in result.notes


def test_batches_of_varying_shapes_are_noted(a100, stack24):
    def collate(rows):
        return torch.stack(rows)[:, : 4 + len(rows) % 3 + int(rows[0][0].abs() * 3)]

    def job():
        model = torch.nn.Linear(8, 2).cuda()
        data = [torch.full((8,), float(i % 5) / 5) for i in range(8 * 12)]
        loader = torch.utils.data.DataLoader(data, batch_size=8, collate_fn=collate)
        with torch.no_grad():
            for x in loader:
                torch.nn.functional.pad(x.cuda(), (0, 8 - x.shape[1])) @ model.weight.T

    result = capture_callable(job, gpu=a100, stack=stack24)
    assert result.error is None, result.error_text
    assert any(
        note.startswith("a DataLoader's batches vary in shape (")
        and note.endswith("the 8 batches skipped may be larger than those traced; --steps all runs every batch")
        for note in result.notes
    ), result.notes


def test_the_cli_takes_a_step_count_or_all():
    def run(*args):
        return CliRunner().invoke(main, ["estimate", *args], catch_exceptions=False)

    small = ["--in-features", "8", "--hidden", "16", "--depth", "1", "--batch-size", "4",
             "--samples", "40", "--epochs", "2"]
    result = run("--gpu", "l4", "--json", "--steps", "all", "--", "python", "-m",
                 "peakmem.examples.mlp_train", *small)
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    environment_notes = ("torchvision's compiled ops", "torch 2.13.0 has no stack profile")
    assert payload["steps"] == 20
    assert [n for n in payload["notes"] if not n.startswith(environment_notes)] == []
    for bad in ("0", "-2", "many", "2.5"):
        result = run("--steps", bad, "--", "python", "-m", "peakmem.examples.mlp_train")
        assert result.exit_code == 2 and "steps must be an integer >= 1 or 'all'" in result.output
    with pytest.raises(Exception, match="steps must be an integer >= 1 or 'all'") as info:
        estimate(lambda: None, steps=0, **GPU)
    assert info.value.exit_code == 2


def test_torch_compile_note_leaves_out_compiled_functions_never_called(a100, stack24):
    """A library compiles its own functions at import (DeepSpeed's Muon update, under the
    Trainer's --deepspeed): the note named them as having run eagerly though nothing called them."""

    def job():
        @torch.compile
        def never_called(x):
            return x * 2

        @torch.compile
        def called(x):
            return x + 1

        called(torch.randn(4, device="cuda"))

    result = capture_callable(job, gpu=a100, stack=stack24)
    assert result.error is None, result.error_text
    compile_notes = [note for note in result.notes if note.startswith("torch.compile")]
    assert len(compile_notes) == 1 and "<locals>.never_called" not in compile_notes[0], compile_notes
    assert "<locals>.called ran eagerly" in compile_notes[0], compile_notes

    def import_only():
        @torch.compile
        def update(x):
            return x * 2

    result = capture_callable(import_only, gpu=a100, stack=stack24)
    assert not any(note.startswith("torch.compile") for note in result.notes), result.notes


def test_torch_compile_note_names_what_was_compiled_and_bounds_the_fusion(a100, stack24):
    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(256, 256)

        def forward(self, x):
            h = self.linear(x)
            y = h * torch.sigmoid(h)  # saves h and sigmoid(h)
            return (y * y).sum()  # saves y

    def job():
        model = torch.compile(Block().cuda())

        @torch.compile(mode="reduce-overhead")
        def double(x):
            return x * 2

        assert isinstance(model._orig_mod, Block) and double.__name__ == "double"
        double(torch.randn(4, device="cuda"))
        model(torch.randn(8192, 256, device="cuda")).backward()

    result = capture_callable(job, gpu=a100, stack=stack24)
    assert result.error is None, result.error_text
    compile_notes = [note for note in result.notes if note.startswith("torch.compile")]
    assert compile_notes == [
        "torch.compile was not applied: Block, test_torch_compile_note_names_what_was_compiled_"
        "and_bounds_the_fusion.<locals>.job.<locals>.double ran eagerly; Inductor fuses chains of "
        "elementwise ops and frees (or recomputes in backward) their intermediates, so the "
        "activations traced are an upper bound for the compiled run; mode='reduce-overhead' also "
        "records CUDA graphs, whose private memory pools are not modelled" + CUDA_GRAPH_POOLS
    ]
    labels = marks(result.trace)
    assert labels.count("compiled region") == labels.count("compiled region end") == 2
    est = estimate(job, **GPU)
    bound = [note for note in est.notes if note.startswith("torch.compile: ")]
    assert len(bound) == 1
    # sigmoid's output and y are saved for backward: 2 x 8192 x 256 floats = 16 MiB
    assert bound[0].startswith(
        "torch.compile: 16.0 MiB live at the peak are outputs of elementwise ops in compiled "
        "regions, which Inductor may fuse away or recompute; the compiled run's peak allocated "
        "memory is likely between "
    )


def test_an_iterable_dataset_loop_is_ended_and_later_epochs_keep_one_batch(a100, stack24):
    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            for i in range(40):
                yield torch.full((8,), float(i))

    def job():
        model = torch.nn.Linear(8, 2).cuda()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        loader = torch.utils.data.DataLoader(Stream(), batch_size=4)
        for _epoch in range(4):
            losses = []
            for x in loader:
                loss = model(x.cuda()).sum()
                loss.backward()
                optimizer.step()
                losses.append(loss.item())
            print(sum(losses) / len(losses))  # an empty epoch would divide by zero

    result = capture_callable(job, gpu=a100, stack=stack24)
    assert result.error is None, result.error_text
    # 3 steps (no epoch length), the epoch ends; each later epoch runs its first batch
    assert result.steps == 3 + 3 and not result.stopped and result.trace.meta["loop_ended"]
    assert input_rows(result.trace, 8) == [4] * 6
    assert (
        "training loop ended early after 3 optimizer steps (in epoch 1): its DataLoader stopped "
        "(it cannot skip to its last batch: an iterable dataset), and each later epoch ran its "
        "first batch only (6 steps in all); the code after the training loop ran; --steps all "
        "runs every batch"
    ) in result.notes


def test_closure_steps_count_once_and_end_the_loop(a100, stack24):
    def job():
        model = torch.nn.Linear(8, 2).cuda()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        loader = torch.utils.data.DataLoader(torch.randn(80, 8), batch_size=8)
        for _epoch in range(3):
            for x in loader:
                def closure(x=x):
                    optimizer.zero_grad()
                    loss = model(x.cuda()).sum()
                    loss.backward()
                    return loss

                optimizer.step(closure)
                with torch.no_grad():  # not a training step: the optimizer's steps are
                    model.weight.clamp_(-1, 1)

    result = capture_callable(job, gpu=a100, stack=stack24)
    assert result.error is None, result.error_text
    assert result.steps == 4 + 3 + 1 and not result.stopped
    assert ended_note(6, 2, 8) in result.notes


# Knowledge distillation: a large frozen teacher runs under no_grad on each training batch, a
# small student learns from its logits; then a small evaluation of the student.
DISTILL = """
    import torch
    torch.manual_seed(0)
    teacher = torch.nn.Sequential(
        torch.nn.Linear(64, 8192), torch.nn.ReLU(), torch.nn.Linear(8192, 10)).to("cuda").eval()
    student = torch.nn.Linear(64, 10).to("cuda")
    opt = torch.optim.SGD(student.parameters(), lr=0.1)
    train = torch.utils.data.TensorDataset(torch.randn(512, 64))
    val = torch.utils.data.TensorDataset(torch.randn(16, 64))
    for x, in torch.utils.data.DataLoader(train, batch_size=128):
        x = x.cuda()
        opt.zero_grad()
        with torch.no_grad():
            soft = torch.softmax(teacher(x), dim=-1)
        loss = torch.nn.functional.cross_entropy(student(x), soft)
        loss.backward()
        opt.step()
    with torch.no_grad():
        for x, in torch.utils.data.DataLoader(val, batch_size=16):
            student(x.cuda())
"""


def test_a_no_grad_teacher_forward_on_the_training_batch_is_training(tmp_path):
    result = estimate_command(["python", write(tmp_path, DISTILL)], **GPU)
    assert result.estimate_kind == "training"
    # the teacher's 128 x 8192 hidden activations (4 MiB) set the peak, inside each step;
    # before, every teacher forward after the first backward was read as an evaluation
    assert result.capture.trace.meta["phases_ran"] == ["training", "eval"]
    assert TRAIN_PEAK in result.notes and EVAL_PEAK not in result.notes
    assert marks(result.capture.trace).count("eval") == 1


def test_an_epoch_too_long_to_skip_through_is_ended_where_it_is(a100, stack24):
    """karpathy/makemore's InfiniteDataLoader: a RandomSampler drawing 1e10 indices with
    replacement, read by `next()` with a StopIteration reset. Skipping to its last batch would
    draw 1e10 indices from the sampler (hours): the epoch is neither shortened nor skipped."""
    from peakmem.capture.dataloader import MAX_SKIPPED_SAMPLES

    batches = int(1e10) // 8
    assert (batches - 1) * 8 > MAX_SKIPPED_SAMPLES
    lengths = []

    def job():
        model = torch.nn.Linear(8, 2).cuda()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        data = torch.randn(80, 8)
        sampler = torch.utils.data.RandomSampler(data, replacement=True, num_samples=int(1e10))
        loader = torch.utils.data.DataLoader(data, batch_size=8, sampler=sampler)
        lengths.append(len(loader))
        batches = iter(loader)
        for _step in range(100):
            try:
                x = next(batches)
            except StopIteration:
                batches = iter(loader)
                x = next(batches)
            model(x.cuda()).sum().backward()
            optimizer.step()
        with torch.no_grad():  # after the loop: not reached when the loop is stopped
            model(torch.randn(4096, 8).cuda())

    result = capture_callable(job, gpu=a100, stack=stack24)
    assert result.error is None, result.error_text
    assert lengths == [batches]  # its true length: not shortened
    assert (
        f"a DataLoader epoch of {batches} batches is too long to skip through (its sampler draws "
        "every skipped batch's indices): not shortened; an ended training loop stops at the "
        "batch it is on"
    ) in result.notes
    # the loop was ended at step 3 (the epoch stopped at its 4th batch); each re-iteration gives
    # one batch, until the (MAX_BARE_EPOCHS + 1)th bare repeat in a row stops the job
    assert result.trace.meta["loop_ended"] and result.stopped
    assert result.steps == 3 + MAX_BARE_EPOCHS + 1 == 7
    assert input_rows(result.trace, 8) == [8] * result.steps
