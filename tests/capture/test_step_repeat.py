"""Steady-state step repetition (capture.step_repeat): the estimate and every trace event are
those of the run that ran every step; it repeats only where the steps are the same."""

import pytest
import torch
from torch import nn

from peakmem.capture.phases import PhaseTracker
from peakmem.capture.session import CaptureSession
from peakmem.capture.step_repeat import ENV_FLAG, REQUIRED_WINDOWS
from peakmem.estimate import estimate
from peakmem.profiles import load_gpu, load_stack

GPU = {"gpu": "a100-40gb", "torch_version": "2.4.1"}
REPEATED = "repeated from step"


def run(monkeypatch, train, steps, repeat, **options):
    """The estimate JSON (without its seconds and the repetition note, with every trace event
    and tag under "trace"), and whether steps were repeated."""
    with monkeypatch.context() as patch:
        patch.setenv(ENV_FLAG, "1" if repeat else "0")
        result = estimate(train, steps=steps, **GPU, **options)
    data = result.to_json()
    data.pop("seconds", None)
    notes = data.pop("notes")
    data["notes"] = [n for n in notes if REPEATED not in n]
    trace = result.capture.trace
    data["trace"] = [list(trace.kinds), list(trace.ids), list(trace.sizes), list(trace.streams),
                     [None if t is None else t.to_json() for t in map(trace.tag_of, range(len(trace)))]]
    data["meta"] = trace.meta
    repeated = [n for n in notes if REPEATED in n]
    return data, repeated


def assert_same(monkeypatch, train, steps, **options):
    full, none = run(monkeypatch, train, steps, repeat=False, **options)
    fast, repeated = run(monkeypatch, train, steps, repeat=True, **options)
    assert none == []
    assert fast == full
    assert fast["steps"] == steps
    return repeated


def mlp_job(steps_seen=None):
    def train():
        model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10)).cuda()
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        for step in range(100):
            x = torch.randn(32, 64, device="cuda")
            y = torch.randint(0, 10, (32,), device="cuda")
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            loss.item()
            if steps_seen is not None:
                steps_seen.append(step)
    return train


def test_mlp_repeats_and_matches_the_full_run(monkeypatch):
    repeated = assert_same(monkeypatch, mlp_job(), 12)
    template = REQUIRED_WINDOWS + 1  # step 1 bounds the first compared window
    assert repeated == [
        f"steps {template + 1}-12 repeated from step {template} (steady state: steps "
        f"{template - 2}-{template} left the same events; {ENV_FLAG} / repeat_steady)"
    ]


def test_repeated_steps_do_not_run(monkeypatch):
    seen = []
    monkeypatch.setenv(ENV_FLAG, "1")
    result = estimate(mlp_job(seen), steps=12, **GPU)
    assert result.steps == 12
    assert seen == list(range(REQUIRED_WINDOWS))  # step 4 ran, stopped in its update


def test_off_by_default(monkeypatch):
    monkeypatch.delenv(ENV_FLAG, raising=False)
    seen = []
    result = estimate(mlp_job(seen), steps=9, **GPU)
    assert not [n for n in result.notes if REPEATED in n]
    assert seen == list(range(8))


def test_cnn_with_batchnorm_and_dropout(monkeypatch):
    def train():
        model = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.Dropout(0.3),
            nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10),
        ).cuda()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        for _ in range(50):
            x = torch.randn(8, 3, 32, 32, device="cuda")
            y = torch.randint(0, 10, (8,), device="cuda")
            optimizer.zero_grad(set_to_none=True)
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()

    assert assert_same(monkeypatch, train, 10)


def test_transformer_keeping_outputs_into_the_next_step(monkeypatch):
    def train():
        layer = nn.TransformerEncoderLayer(64, 4, 128, dropout=0.1, batch_first=True)
        model = nn.Sequential(nn.Embedding(100, 64), nn.TransformerEncoder(layer, 2)).cuda()
        head = nn.Linear(64, 7).cuda()
        params = list(model.parameters()) + list(head.parameters())
        optimizer = torch.optim.AdamW(params, lr=1e-3)
        correct = 0
        for _ in range(40):
            tokens = torch.randint(0, 100, (4, 16), device="cuda")
            labels = torch.randint(0, 7, (4,), device="cuda")
            optimizer.zero_grad()
            outputs = head(model(tokens).mean(1))  # the previous outputs live until here
            loss = nn.functional.cross_entropy(outputs, labels)
            loss.backward()
            optimizer.step()
            _, predicted = torch.max(outputs, 1)
            correct += (predicted == labels).sum().item()

    assert assert_same(monkeypatch, train, 9)


@pytest.mark.parametrize("odd_step", [1, 3, 4])
def test_a_step_that_differs_is_not_repeated_over(monkeypatch, odd_step):
    """`if step == N:` among the steps compared: the windows around it differ, so the
    repetition starts from steady steps after it and the estimate matches. (A difference after
    the compared steps cannot be seen before it runs: why repetition is asked for, not the
    default.)"""
    def train():
        model = nn.Linear(128, 128).cuda()
        optimizer = torch.optim.Adam(model.parameters())
        keep = []
        for step in range(1, 100):
            if step == odd_step:
                keep.append(torch.empty(1 << 20, device="cuda"))
                extra = torch.empty(4096, device="cuda")  # lives one step
            loss = model(torch.randn(16, 128, device="cuda")).square().mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            del loss
            if step == odd_step + 1:
                del extra

    repeated = assert_same(monkeypatch, train, 14)
    assert repeated  # repeated from a later steady step
    template = int(repeated[0].split("repeated from step ")[1].split()[0])
    assert template - 2 > odd_step + 1


def test_a_step_leaking_memory_is_not_repeated(monkeypatch):
    def train():
        model = nn.Linear(64, 64).cuda()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        losses = []
        for _ in range(100):
            loss = model(torch.randn(8, 64, device="cuda")).sum()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.detach() * 1)  # one more tensor alive each step

    assert assert_same(monkeypatch, train, 10) == []


def test_a_dataloader_with_a_short_last_batch_runs_every_step(monkeypatch):
    def train():
        data = torch.utils.data.TensorDataset(torch.randn(70, 32), torch.randint(0, 4, (70,)))
        loader = torch.utils.data.DataLoader(data, batch_size=8)
        model = nn.Linear(32, 4).cuda()
        optimizer = torch.optim.Adam(model.parameters())
        for _epoch in range(3):
            for x, y in loader:
                optimizer.zero_grad()
                loss = nn.functional.cross_entropy(model(x.cuda()), y.cuda())
                loss.backward()
                optimizer.step()

    assert assert_same(monkeypatch, train, 12) == []


def test_gradient_accumulation_steps_count_their_backward_passes(monkeypatch):
    def train():
        model = nn.Sequential(nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 2)).cuda()
        optimizer = torch.optim.Adam(model.parameters())
        while True:
            for _micro in range(3):
                loss = model(torch.randn(4, 32, device="cuda")).sum() / 3
                loss.backward()
            optimizer.step()
            optimizer.zero_grad()

    assert assert_same(monkeypatch, train, 9)


def test_data_dependent_ops_are_counted_for_the_repeated_steps(monkeypatch):
    def train():
        model = nn.Linear(32, 32).cuda()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        while True:
            out = model(torch.randn(8, 32, device="cuda"))
            loss = out[out > 0].sum()  # a boolean mask: sized as if every element were kept
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()

    full, _ = run(monkeypatch, train, 9, repeat=False)
    counted = [a for a in full["assumptions"] if a.startswith("data-dependent sizes")]
    assert counted and "x9" in counted[0], full["assumptions"]  # one per step
    assert assert_same(monkeypatch, train, 9)


def test_eager_mode_runs_every_step(monkeypatch):
    assert assert_same(monkeypatch, mlp_job(), 8, mode="eager") == []


def loader_job(samples, batch_size=8, shuffle=False):
    def train():
        data = torch.utils.data.TensorDataset(
            torch.randn(samples, 32), torch.randint(0, 4, (samples,)))
        loader = torch.utils.data.DataLoader(data, batch_size=batch_size, shuffle=shuffle)
        model = nn.Sequential(nn.Linear(32, 64), nn.Dropout(0.1), nn.Linear(64, 4)).cuda()
        optimizer = torch.optim.Adam(model.parameters())
        for _epoch in range(3):
            for x, y in loader:
                optimizer.zero_grad()
                loss = nn.functional.cross_entropy(model(x.cuda()), y.cuda())
                loss.backward()
                optimizer.step()
    return train


def test_a_dataloader_epoch_of_full_batches_is_repeated(monkeypatch):
    assert assert_same(monkeypatch, loader_job(400, shuffle=True), 20)


def test_the_short_last_batch_is_run_not_repeated(monkeypatch):
    # 108 samples: 13 batches of 8, then one of 4 (the 14th)
    assert assert_same(monkeypatch, loader_job(108), 13)  # steps 1-13: full batches only
    assert assert_same(monkeypatch, loader_job(108), 14) == []  # step 14: the short batch
    # the next epoch's steps 15-17 are compared among themselves (one epoch feeds them)
    next_epoch = assert_same(monkeypatch, loader_job(108), 18)
    assert [n.split(" (")[0] for n in next_epoch] == ["step 18 repeated from step 17"]


def test_only_with_an_explicit_step_limit():
    session = CaptureSession(gpu=load_gpu("a100-40gb"), stack=load_stack("2.4.1"))
    assert PhaseTracker(session, stop_after_steps=None, repeat_steady=True).repeater is None
    assert PhaseTracker(session, stop_after_steps="all", repeat_steady=True).repeater is None
    assert PhaseTracker(session, stop_after_steps=8, repeat_steady=False).repeater is None
    assert PhaseTracker(session, stop_after_steps=8, repeat_steady=True).repeater is not None


SCRIPT = """
import torch
from torch import nn

model = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 4)).cuda()
optimizer = torch.optim.AdamW(model.parameters())
for step in range(1000):
    x = torch.randn(16, 32, device="cuda")
    loss = model(x).square().mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    print(step, flush=True)
"""


def test_the_cli_flag_through_the_job_process(monkeypatch, tmp_path):
    import json

    from click.testing import CliRunner

    from peakmem.cli.main import main

    monkeypatch.setenv(ENV_FLAG, "0")  # restored after the test (the flag sets it)
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)

    def estimate_json(*flags):
        result = CliRunner().invoke(
            main, ["estimate", "--gpu", "a100-40gb", "--torch", "2.4.1", "--json", "--steps",
                   "11", *flags, "--", "python", str(script)], catch_exceptions=False)
        assert result.exit_code == 0, result.output
        payload = json.loads(result.stdout)
        payload.pop("seconds", None)
        return payload

    full = estimate_json()
    fast = estimate_json("--repeat-steady")
    notes = fast.pop("notes")
    assert [n for n in notes if REPEATED in n] == [
        f"steps 5-11 repeated from step 4 (steady state: steps 2-4 left the same events; "
        f"{ENV_FLAG} / repeat_steady)"
    ]
    assert [n for n in notes if REPEATED not in n] == full.pop("notes")
    assert fast == full
    assert fast["steps"] == 11


def summarized_loader_job():
    """A forward before the loop (a model summary) leaves the phase at 'forward': step 1's
    batch is moved to the device in it, later steps' batches in 'other'."""
    def train():
        data = torch.utils.data.TensorDataset(
            torch.randn(400, 32), torch.randint(0, 4, (400,)))
        loader = torch.utils.data.DataLoader(data, batch_size=8)
        model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4)).cuda()
        model(torch.randn(2, 32, device="cuda"))  # the summary's forward
        optimizer = torch.optim.Adam(model.parameters())
        for x, y in loader:
            x, y = x.cuda(), y.cuda()
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
    return train


def test_step_one_batch_tagged_in_the_phase_before_the_loop(monkeypatch):
    full, _ = run(monkeypatch, summarized_loader_job(), 10, repeat=False)
    phases = {tag[2] for tag in full["trace"][4] if tag and tag[0] == "input"}
    assert {"forward", "other"} <= phases  # the case this test is about
    repeated = assert_same(monkeypatch, summarized_loader_job(), 10)
    assert [n.split(" (")[0] for n in repeated] == ["steps 5-10 repeated from step 4"]
