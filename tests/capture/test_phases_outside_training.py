"""Categories and phases of what a training job allocates outside its training forward/backward.

An evaluation's forward (no gradients, after training) is phase `eval` while its top-level module
runs, its blocks `activation`; the phase ends when that module returns, so what follows (the
predictions' argmax, metrics, `torch.cat` of predictions, a best-weights copy, the next batch) is
between steps (`other`), never taken for the next training step's activations. Copies of the
weights made between steps are `model_copy` (capture.model_copies); GradScaler's scale and an
optimizer's device-tensor learning rate are `optimizer_state`.

The model: Linear(64, 64) (weight 16384 B, bias 256 B), ReLU, Linear(64, 8) (2048 B, 32 B), fp32.
"""

from __future__ import annotations

import copy
import importlib.util

import pytest
import torch
from torch import nn

from peakmem.estimate import estimate
from peakmem.trace.events import EventKind

WEIGHTS = [16384, 256, 2048, 32]
EVAL_BATCH = 32
EVAL_X = EVAL_BATCH * 64 * 4  # the evaluation batch, fp32
EVAL_HIDDEN = EVAL_BATCH * 64 * 4  # Linear(64, 64)'s and ReLU's outputs
EVAL_LOGITS = EVAL_BATCH * 8 * 4


def _model() -> nn.Module:
    return nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 8)).cuda()


def _train(model: nn.Module, optimizer: torch.optim.Optimizer, steps: int = 2) -> None:
    model.train()
    for _ in range(steps):
        x = torch.randn(16, 64).to("cuda")
        loss = model(x).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def _events(fn, *args, **kwargs) -> list[tuple[str, int, object]]:
    """("mark", 0, label) / ("alloc", size, tag) of the capture of `fn`, in order (the tags as
    they are at the end: what later classification made of them)."""
    result = estimate(fn, *args, gpu="a100-40gb", steps="all", **kwargs)
    trace = result.capture.trace
    found: list[tuple[str, int, object]] = []
    for index, (kind, _ident, size, _stream, _tag) in enumerate(trace.events()):
        tag = trace.tag_of(index)
        if kind == EventKind.MARK:
            found.append(("mark", 0, tag.op))
        elif kind == EventKind.ALLOC:
            found.append(("alloc", size, tag))
    return found


def _after(events, label: str, until: str | None = None):
    """The allocations after the first mark `label` (up to the next mark `until`)."""
    start = next(i for i, event in enumerate(events) if event == ("mark", 0, label))
    out = []
    for kind, size, tag in events[start + 1:]:
        if kind == "mark":
            if tag == until:
                break
            continue
        out.append((size, tag.category, tag.phase, tag.op.split(".")[0]))
    return out


def best_weights_job(grad_mode: str = "no_grad") -> None:
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    _train(model, optimizer)
    model.eval()
    context = torch.inference_mode() if grad_mode == "inference_mode" else torch.no_grad()
    with context:
        x = torch.randn(EVAL_BATCH, 64).to("cuda")
        outputs = model(x)
        accuracy = outputs.argmax(1).float().mean()
    best_model_wts = copy.deepcopy(model.state_dict())  # the torchvision fine-tuning tutorial
    _train(model, optimizer, steps=1)  # the next epoch: its backward must not claim the copy
    model.load_state_dict(best_model_wts)
    del accuracy, outputs


@pytest.mark.parametrize("grad_mode", ["no_grad", "inference_mode"])
def test_eval_forward_is_eval_activation_and_the_best_weights_are_a_model_copy(grad_mode):
    events = _events(best_weights_job, grad_mode)
    allocations = _after(events, "step 2", until="forward")  # the eval mark is inside
    forward = [a for a in allocations if a[2] == "eval"]
    assert [(size, category) for size, category, _, _ in forward] == [
        (EVAL_HIDDEN, "activation"), (EVAL_HIDDEN, "activation"), (EVAL_LOGITS, "activation")
    ]
    # before it: the batch moved to the device; after it (its top-level module returned):
    # argmax and the accuracy between steps, then the state_dict's deep copy
    # (op `to` under inference_mode, `_to_copy` under no_grad)
    assert allocations[0][:3] == (EVAL_X, "input", "other")
    copies = [a for a in allocations if a[3] == "clone"]
    assert copies == [(size, "model_copy", "other", "clone") for size in WEIGHTS]
    rest = [a for a in allocations[1:-1] if a[2] != "eval" and a[3] != "clone"]
    assert rest and all(category == "other" and phase == "other"
                        for _, category, phase, _ in rest), rest
    # the next training step's batch is an input moved between steps, not in a forward
    assert allocations[-1] == (16 * 64 * 4, "input", "other", "_to_copy")


def metrics_job() -> None:
    model = _model()
    optimizer = torch.optim.Adam(model.parameters())
    _train(model, optimizer)
    model.eval()
    predictions, correct = [], torch.zeros((), dtype=torch.long, device="cuda")
    with torch.no_grad():
        for _ in range(3):  # a validation epoch: predictions and a count kept on the device
            x = torch.randn(EVAL_BATCH, 64).cuda()
            y = torch.randint(0, 8, (EVAL_BATCH,)).cuda()
            predicted = model(x).argmax(1)
            predictions.append(predicted)
            correct += (predicted == y).sum()
    everything = torch.cat(predictions)
    _train(model, optimizer, steps=1)
    del everything


def test_validation_epoch_metrics_are_between_steps_and_one_eval_phase():
    events = _events(metrics_job)
    marks = [tag for kind, _, tag in events if kind == "mark"]
    assert marks.count("eval") == 1  # one evaluation however many batches
    allocations = _after(events, "step 2", until="forward")
    eval_phase = [a for a in allocations if a[2] == "eval"]
    assert [size for size, *_ in eval_phase] == [EVAL_HIDDEN, EVAL_HIDDEN, EVAL_LOGITS] * 3
    assert {category for _, category, _, _ in eval_phase} == {"activation"}
    outside = [a for a in allocations if a[2] != "eval"]
    assert {(category, phase) for _, category, phase, _ in outside} <= {
        ("input", "other"), ("other", "other")}, outside
    argmaxes = [a for a in outside if a[3] == "argmax"]
    assert argmaxes == [(EVAL_BATCH * 8, "other", "other", "argmax")] * 3
    assert (3 * EVAL_BATCH * 8, "other", "other", "cat") in outside


def model_copy_job(kind: str) -> None:
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    _train(model, optimizer, steps=1)
    if kind == "averaged":  # swa_utils: a deep copy on the device, kept in sync from now on
        averaged = torch.optim.swa_utils.AveragedModel(model)
        _train(model, optimizer, steps=1)
        averaged.update_parameters(model)
    elif kind == "spare":  # a deep copy kept aside, never run nor synced
        spare = copy.deepcopy(model)
        _train(model, optimizer, steps=1)
        del spare
    elif kind == "trained":  # a deep copy then trained itself
        second = copy.deepcopy(model)
        _train(second, torch.optim.SGD(second.parameters(), lr=0.1), steps=1)
    elif kind == "untrained":  # a new model's initial weights, before its first forward
        fresh = _model()  # moved by `.cuda()`: its blocks are `input` until a forward runs
        initial = copy.deepcopy(fresh.state_dict())
        _train(model, optimizer, steps=1)
        del initial
    elif kind == "checkpoint":  # a half-precision state_dict for a checkpoint
        half = {k: v.half() for k, v in model.state_dict().items()}
        _train(model, optimizer, steps=1)
        del half


@pytest.mark.parametrize(("kind", "category", "sizes"), [
    ("averaged", "ema", WEIGHTS),
    ("spare", "model_copy", WEIGHTS),
    ("trained", "parameter", WEIGHTS),
    ("untrained", "model_copy", WEIGHTS),
    ("checkpoint", "model_copy", [size // 2 for size in WEIGHTS]),
])
def test_weight_copies_between_steps(kind, category, sizes):
    events = _events(model_copy_job, kind)
    allocations = _after(events, "step 1", until="forward")
    ops = ("clone",) if kind == "untrained" else ("clone", "_to_copy")  # (its own move: inputs)
    copies = [a for a in allocations if a[3] in ops and a[0] in sizes]
    assert [(size, cat, phase) for size, cat, phase, _ in copies] == [
        (size, category, "other") for size in sizes], allocations


def scaler_job() -> None:
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cuda")
    for _ in range(2):
        x = torch.randn(16, 64, device="cuda")
        with torch.autocast("cuda", dtype=torch.float16):
            loss = model(x).float().square().mean()
        optimizer.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()


def test_grad_scaler_scale_and_growth_tracker_are_not_activations():
    events = _events(scaler_job)
    made = [(size, tag.category, tag.phase) for kind, size, tag in events
            if kind == "alloc" and tag.op.startswith("full")]
    # the scale (float32) and the growth tracker (int32), made by the first `scale(loss)`
    # between the forward and its backward, alive all run: the scaler's state, not the step's
    # activations (nor `optimizer_state`, which is what `optimizer.state` holds)
    assert made[:2] == [(4, "other", "other")] * 2, made


def scheduler_job() -> None:
    model = _model()
    lr = torch.tensor(0.01, device="cuda")
    optimizer = torch.optim.Adam(model.parameters(), lr=lr, foreach=False, capturable=True)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    for _ in range(2):
        _train(model, optimizer, steps=1)
        scheduler.step()


def test_a_device_learning_rate_is_optimizer_state():
    events = _events(scheduler_job)
    # after the model's four blocks: the learning rate moved to the device, the param group's
    # `lr` (the scheduler's `initial_lr` clone is in the group too, its `base_lrs` are not)
    allocations = [(size, tag.category, tag.phase, tag.op.split(".")[0])
                   for kind, size, tag in events if kind == "alloc"]
    assert allocations[4] == (4, "optimizer_state", "other", "_to_copy"), allocations[:10]
    assert allocations[6] == (4, "optimizer_state", "other", "clone"), allocations[:10]


def save_job(path: str) -> None:
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    _train(model, optimizer)
    model.eval()
    with torch.no_grad():
        model(torch.randn(EVAL_BATCH, 64).to("cuda"))
    torch.save(model.state_dict(), path)  # a checkpoint of device tensors
    torch.cuda.empty_cache()
    _train(model, optimizer, steps=1)


def test_checkpoint_save_and_empty_cache_after_an_evaluation(tmp_path):
    events = _events(save_job, str(tmp_path / "checkpoint.pt"))
    allocations = _after(events, "step 2", until="forward")
    # the evaluation's own blocks, then nothing: saving copies to the host, empty_cache frees
    assert [(size, category, phase) for size, category, phase, _ in allocations] == [
        (EVAL_X, "input", "other"), (EVAL_HIDDEN, "activation", "eval"),
        (EVAL_HIDDEN, "activation", "eval"), (EVAL_LOGITS, "activation", "eval"),
        (16 * 64 * 4, "input", "other")]  # the next training batch


def sanity_check_job() -> None:
    model = _model()
    model.eval()
    with torch.no_grad():  # a validation before training (not an evaluation: no backward yet)
        model(torch.randn(EVAL_BATCH, 64).to("cuda"))
    snapshot = copy.deepcopy(model.state_dict())
    _train(model, torch.optim.SGD(model.parameters(), lr=0.1), steps=1)
    del snapshot


def test_a_copy_after_a_validation_before_training_is_a_model_copy():
    events = _events(sanity_check_job)
    allocations = [(size, tag.category, tag.phase, tag.op.split(".")[0])
                   for kind, size, tag in events if kind == "alloc"]
    copies = [a for a in allocations if a[3] == "clone"]
    # the forward phase of a no-grad forward before training lasts until the first backward,
    # but no module runs when the copy is made: not the backward's activation
    assert copies == [(size, "model_copy", "forward", "clone") for size in WEIGHTS]


def generate_job() -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=128, n_positions=64,
                        bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(config).cuda()
    optimizer = torch.optim.AdamW(model.parameters())
    for _ in range(2):
        ids = torch.randint(0, 128, (2, 16)).cuda()
        model(ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.eval()
    prompt = torch.randint(0, 128, (2, 8)).cuda()
    model.generate(prompt, max_new_tokens=3, do_sample=False, pad_token_id=0)
    model.train()
    ids = torch.randint(0, 128, (2, 16)).cuda()
    model(ids, labels=ids).loss.backward()
    optimizer.step()


def test_generate_in_a_training_script_is_eval_then_between_steps():
    pytest.importorskip("transformers")
    events = _events(generate_job)
    allocations = _after(events, "step 2", until="forward")
    assert {(category, phase) for _, category, phase, _ in allocations} == {
        ("activation", "eval"), ("other", "other"), ("input", "other")}
    # three forwards (the prompt, then one token each) in the eval phase, each layer's key and
    # value caches grown by `cat`: 2 layers x (key, value) x 3 forwards, (2, 2, T, 32) fp32 for
    # T = 8, 9, 10
    caches = sorted(size for size, category, phase, op in allocations
                    if op == "cat" and phase == "eval")
    assert caches == sorted([2 * 2 * t * 32 * 4 for t in (8, 9, 10)] * 4)
    # the prompt is an input; the generated ids grown by `cat` are between steps (int64, 2 x T)
    assert allocations[0] == (2 * 8 * 8, "input", "other", "_to_copy")
    grown = [size for size, category, phase, op in allocations if op == "cat" and phase == "other"]
    assert set(grown) == {2 * t * 8 for t in (9, 10, 11)}


def metric_module_job() -> None:
    import torchmetrics

    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    accuracy = torchmetrics.classification.MulticlassAccuracy(num_classes=8).cuda()
    for _ in range(2):
        x, y = torch.randn(16, 64).cuda(), torch.randint(0, 8, (16,)).cuda()
        out = model(x)
        accuracy(out, y)  # a metric's call inside the training step, before its backward
        loss = out.square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    with torch.no_grad():
        x, y = torch.randn(EVAL_BATCH, 64).cuda(), torch.randint(0, 8, (EVAL_BATCH,)).cuda()
        accuracy(model(x), y)  # after the evaluation's forward: does not start another
    accuracy.compute()


@pytest.mark.skipif(importlib.util.find_spec("torchmetrics") is None,
                    reason="torchmetrics not installed")
def test_a_torchmetrics_call_is_between_steps_in_a_training_step_and_after_an_evaluation():
    events = _events(metric_module_job)
    metric = [(size, tag.category, tag.phase) for kind, size, tag in events
              if kind == "alloc" and (tag.module or "").startswith("MulticlassAccuracy")]
    # its state (per-class counts: int64 x 8 classes, cloned from its defaults by `reset`) and
    # its update's intermediates, in both steps and after the evaluation
    assert metric and {(category, phase) for _, category, phase in metric} == {("other", "other")}
    assert metric.count((8 * 8, "other", "other")) >= 8
    # the training forward resumed after it: the loss is the step's forward again
    step = _after(events, "step 1", until="backward")
    assert (4, "activation", "forward", "mean") in step
    assert [tag for kind, _, tag in events if kind == "mark"].count("eval") == 1


def target_network_job() -> None:
    model = _model()
    target = copy.deepcopy(model)  # before the first forward: its weights are still inputs
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    _train(model, optimizer, steps=1)
    for _ in range(2):  # DQN-style: a no-grad target from a network left in training mode
        x = torch.randn(16, 64).to("cuda")
        with torch.no_grad():
            goal = target(x).max(1).values * 0.99
        loss = (model(x).max(1).values - goal).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def test_a_no_grad_forward_of_a_training_mode_network_is_part_of_the_step():
    events = _events(target_network_job)
    step = _after(events, "step 1", until="backward")
    # no `model.eval()`: not an evaluation's phase; the target and what is computed from it
    # are the step's forward, alive when its backward starts (the loss reads `goal`)
    assert {phase for _, _, phase, _ in step} == {"other", "forward"}, step
    assert (16 * 4, "activation", "forward", "mul") in step  # `goal`
    assert not [a for a in step if a[2] == "eval"]
