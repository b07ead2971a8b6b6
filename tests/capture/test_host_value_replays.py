"""Reads of host-deferred tensors (capture.host_values): a storage's values are computed once and
kept, and replays draw random numbers that advance as the job's would."""

import torch
from torch import nn

from peakmem.capture import capture_callable
from peakmem.capture.host_values import PRUNE_DEPENDENTS, HostValues
from peakmem.estimate import estimate
from tests.capture.capture_helpers import allocations


class _Buffered(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("buf", torch.zeros(8192))  # host-deferred: zeros, nothing replayed


def _train_two_steps(model: nn.Module) -> None:
    optimizer = torch.optim.AdamW(model.parameters())
    for _ in range(2):
        model(torch.randn(8, 256, device="cuda")).sum().backward()
        optimizer.step()
        optimizer.zero_grad()


def test_trunc_normal_init_of_a_host_built_weight_finishes_and_counts_the_weight():
    """torch's `trunc_normal_` (std 1, bounds +-2: values are rejected) redraws rejected values in
    a loop that reads the tensor each pass: it used to replay the same draws forever."""
    seen = {}

    def job() -> None:
        model = nn.Linear(256, 32000)
        nn.init.trunc_normal_(model.weight)
        seen["inside"] = model.weight.abs().max().item()
        model.cuda()
        _train_two_steps(model)

    result = estimate(job, gpu="a100-40gb", steps=2, mode="fake", timeout=60)
    capture = result.capture
    assert capture.error is None, capture.error_text
    assert 1.5 < seen["inside"] <= 2.0  # 8 M draws of N(0, 1), truncated to +-2
    moved = [size for size, tag in allocations(capture.trace, phase="other")
             if tag.op.startswith("_to_copy")]
    assert 32000 * 256 * 4 in moved
    assert result.to_json()["breakdown"]["parameter"] == (32000 * 256 + 32000) * 4


def test_trunc_normal_far_in_the_tail_reads_values_within_its_bounds(a100, stack24):
    """The sampler for a narrow window (a=2, b=3 of N(0, 1)) takes `where(pending, candidates,
    result)`, then transforms `candidates` in place: the `where` must see `candidates` as they
    were (it used to be computed when read, from the transformed values)."""
    seen = {}

    def job() -> None:
        weight = nn.Linear(256, 64).weight
        nn.init.trunc_normal_(weight, mean=0.0, std=1.0, a=2.0, b=3.0)
        seen["range"] = (weight.min().item(), weight.max().item())

    result = capture_callable(job, gpu=a100, stack=stack24, steps=1, timeout=60)
    assert result.error is None, result.error_text
    low, high = seen["range"]
    assert 2.0 <= low < 2.01 and 2.9 < high <= 3.0


def test_a_loop_reading_a_derived_host_tensor_replays_each_op_once(a100, stack24, monkeypatch):
    computed = []
    original = HostValues._compute

    def counting(self, recipe, nbytes):
        computed.append(nbytes)
        return original(self, recipe, nbytes)

    monkeypatch.setattr(HostValues, "_compute", counting)
    sums = []

    def job() -> None:
        x = _Buffered().buf
        for _ in range(30):
            x = x + 1.0  # host-deferred, derived from the last one
            sums.append(x.sum().item())

    result = capture_callable(job, gpu=a100, stack=stack24, steps=1, timeout=60)
    assert result.error is None, result.error_text
    assert sums == [8192.0 * n for n in range(1, 31)]
    # each of the 30 sums, each x and the buffer computed once (was 1 + 2 + ... + 30 x's)
    assert len(computed) <= 3 * 30 + 1


def test_a_buffer_read_between_writes_keeps_every_write(a100, stack24):
    """Writes already applied to the kept values are not replayed again, so a buffer read as it
    is written keeps its values past MAX_STEPS writes (it read as zeros after 64)."""
    seen = {}

    def job() -> None:
        buf = _Buffered().buf
        for i in range(100):
            buf[i] = float(i + 1)
            seen["last"] = buf[i].item()
        seen["head"] = buf[:100].sum().item()

    result = capture_callable(job, gpu=a100, stack=stack24, steps=1, timeout=60)
    assert result.error is None, result.error_text
    assert seen["last"] == 100.0
    assert seen["head"] == sum(range(1, 101))


def test_random_draws_after_a_read_differ_from_those_before(a100, stack24):
    def job(seen: dict) -> None:
        torch.manual_seed(0)
        buf = _Buffered().buf
        buf.normal_()
        seen["first"] = buf[:16].tolist()
        seen["again"] = buf[:16].tolist()
        redraw = torch.empty_like(buf).normal_()
        seen["redraw"] = redraw[:16].tolist()
        seen["job_draw"] = torch.rand(4).tolist()

    captured: dict = {}
    result = capture_callable(job, captured, gpu=a100, stack=stack24, steps=1, timeout=60)
    assert result.error is None, result.error_text
    eager: dict = {}
    job(eager)
    assert eager["first"] != eager["redraw"]
    assert captured["first"] == captured["again"]  # a read does not redraw
    assert captured["first"] != captured["redraw"]  # it was drawn again, from the same state
    # the replays do not move the job's stream: its draw is the one made with nothing replayed
    torch.manual_seed(0)
    assert captured["job_draw"] == torch.rand(4).tolist()


def test_storages_derived_in_a_long_loop_are_not_noted_forever(a100, stack24):
    noted = {}

    def job() -> None:
        buf = _Buffered().buf
        for _ in range(1000):
            _ = buf * 2.0  # host-deferred, derived from buf, dies at once
        values = torch.overrides._get_current_function_mode_stack()[-1].deferral.values
        with torch._C.DisableTorchFunction():
            noted["dependents"] = len(values._dependents[id(buf.untyped_storage())])

    result = capture_callable(job, gpu=a100, stack=stack24, steps=1, timeout=60)
    assert result.error is None, result.error_text
    assert 0 < noted["dependents"] <= PRUNE_DEPENDENTS
