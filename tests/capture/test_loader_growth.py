"""A DataLoader training loop whose live device memory grows at every step (a leak: outputs
kept for an epoch-end metric, losses kept with their graphs) is held, under the default policy:
its epoch yields full batches past the point peakmem shortens it while each step leaves more
bytes live, at most MAX_GROWING_STEPS steps; still growing there, the rest of the epoch is
extrapolated linearly in a note and the JSON's `step_growth`, never in the peak
(capture/loader_growth.py). Steady loops, and loops keeping host copies, are shortened as before.

Bytes worked out from the shapes (fp32; allocated bytes: the storages' own sizes)."""

from __future__ import annotations

import runpy
import textwrap

import pytest

from peakmem.capture import loader_growth
from peakmem.capture.step_growth import MAX_GROWING_STEPS
from peakmem.estimate import estimate

MiB = 1 << 20
BATCHES = 64  # an epoch of 64 batches of 16: shortened by default to 3 full batches + the last
LOGITS = 16 * 4096 * 4  # one step's (16, 4096) fp32 logits

JOB = """
    import torch
    model = torch.nn.Sequential(torch.nn.Linear(64, 1024), torch.nn.ReLU(),
                                torch.nn.Linear(1024, 4096)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.utils.data.TensorDataset(torch.randn(1024, 64), torch.randint(0, 4096, (1024,)))
    loader = torch.utils.data.DataLoader(data, batch_size=16)
    for epoch in range(2):
        all_preds = []
        for x, y in loader:
            x, y = x.cuda(), y.cuda()
            logits = model(x)
            loss = torch.nn.functional.cross_entropy(logits, y)
            KEEP
            opt.step()
            opt.zero_grad()
        print("epoch", epoch, "kept", len(all_preds))
"""

KEEPS = {
    "logits": "loss.backward()\n            all_preds.append(logits)",
    "graph": "loss.backward(retain_graph=True)\n            all_preds.append(loss)",
    "steady": "loss.backward()\n            all_preds.append(logits.argmax(1).sum().item())",
    "host_copy": "loss.backward()\n            all_preds.append(logits.detach().cpu())",
    # 512 bytes a step (a 0-d loss on the device): 32 KiB over the epoch, below the 2 MiB bar
    "small": "loss.backward()\n            all_preds.append(loss.detach())",
}


def run(tmp_path, keep, **kwargs):
    path = tmp_path / "job.py"
    path.write_text(textwrap.dedent(JOB.replace("KEEP", KEEPS[keep])))
    est = estimate(runpy.run_path, str(path), run_name="__main__", gpu="a100-40gb",
                   torch_version="2.4.1", **kwargs)
    assert est.capture is not None and est.capture.error is None, est.capture.error_text
    return est


def growth_notes(est):
    return [n for n in est.capture.notes if "live device memory grew" in n]


def test_logits_kept_for_an_epoch_are_traced_to_the_cap_and_extrapolated(tmp_path):
    est = run(tmp_path, "logits")
    # 3 full batches, 16 more while each step kept 256 KiB more, then the epoch's last batch:
    # past the step limit (6), the loop ended there; the next epoch ran its last batch only
    held = 3 + MAX_GROWING_STEPS
    assert est.steps == held + 1 + 1
    (note,) = growth_notes(est)
    assert note.startswith("the live device memory grew by 0.25 MiB per optimizer step in a "
                           "DataLoader loop (kept each step: ")
    # the logits: the last linear's addmm output, kept from one step to the next
    assert ("(kept each step: addmm.default's output in Sequential.2 (activation): "
            f"{LOGITS:,} B)") in note
    assert "EXTRAPOLATED" in note
    assert f"a full epoch of {BATCHES} steps would hold ~" in note
    record = est.to_json()["step_growth"]
    # the steps not traced: the epoch's 64 less the 19 held and its last batch
    not_traced = BATCHES - held - 1
    assert record["bytes_per_step"] == LOGITS
    assert record["steps_not_traced_in_epoch"] == not_traced
    assert record["extrapolated_extra_bytes"] == not_traced * LOGITS
    assert record["extrapolated"] is True
    assert record["extrapolated_peak_bytes"] == est.peak_bytes + not_traced * LOGITS
    # the peak is the traced one: the epoch's 20 logits live at once (not 4, as before)
    steady = run(tmp_path, "steady")
    assert est.peak_allocated_bytes - steady.peak_allocated_bytes >= (held + 1 - 1) * LOGITS


def test_losses_kept_with_their_graphs_are_flagged(tmp_path):
    est = run(tmp_path, "graph")
    (note,) = growth_notes(est)
    record = est.to_json()["step_growth"]
    # each loss keeps its graph: the batch (16, 64), the ReLU output (16, 1024) saved by the
    # second linear, the logits saved by cross_entropy's log_softmax (16, 4096), the targets
    # and the loss itself at least
    assert record["bytes_per_step"] >= 16 * 64 * 4 + 16 * 1024 * 4 + LOGITS
    assert est.steps == 3 + MAX_GROWING_STEPS + 1 + 1
    assert "--steps all" in note


@pytest.mark.parametrize("keep", ["steady", "host_copy", "small"])
def test_steady_loops_and_host_copies_are_not_flagged(tmp_path, keep):
    est = run(tmp_path, keep)
    # as before: the shortened epoch (4 batches), 2 steps of the next, then its last batch
    assert est.steps == 4 + 2 + 1
    assert not growth_notes(est)
    assert not any("past the point peakmem shortens" in n for n in est.capture.notes)
    assert "step_growth" not in est.to_json()


def test_an_explicit_step_count_is_never_held(tmp_path):
    est = run(tmp_path, "logits", steps=10)
    assert est.steps == 10
    assert not growth_notes(est)


class _Loaders:
    window = None


class _Epoch:
    def __init__(self, length, steps_fed=0):
        self.loader, self.length, self.window, self._loaders = object(), length, None, _Loaders()
        self.steps_fed, self.can_skip = steps_fed, True


class _Session:
    def __init__(self):
        from types import SimpleNamespace

        from peakmem.trace.events import Trace

        self.allocated_bytes, self.max_allocated_bytes = 0, 0
        self.state = SimpleNamespace(steps=0)
        self.trace, self.live = Trace(), {}


def test_an_epochs_smaller_last_batch_then_the_next_epochs_full_ones_are_not_growth():
    # gpumemnet's transformer (benchmarks/zoo/gpumemnet.py, speed_regression's transformer-a):
    # 603 batches, the last of 2 samples; the next epoch's first two steps each left more live
    # than the step before, read as growth across the epoch's end before
    session = _Session()
    growth = loader_growth.LoaderGrowth(session)
    first, second = _Epoch(length=603), _Epoch(length=603)
    for epoch, live in [(first, 100), (first, 100), (first, 60), (second, 90), (second, 100)]:
        session.allocated_bytes = live * MiB
        session.state.steps += 1
        growth.step_fed(epoch)
    assert growth.hold(second) is False


@pytest.mark.parametrize("lives, held", [
    ([0, 0, 0], False),  # steady
    ([0, 4 * MiB, 4 * MiB], False),  # one step grew (state made once), the next did not
    ([0, 4 * MiB, 8 * MiB], True),  # two in a row
    ([0, 8 * MiB, 4 * MiB], False),  # freed
])
def test_held_only_after_two_growing_steps(lives, held):
    session, epoch = _Session(), _Epoch(length=100)
    growth = loader_growth.LoaderGrowth(session)
    for live in lives:
        session.allocated_bytes = live
        session.state.steps += 1
        growth.step_fed(epoch)
    assert growth.hold(epoch) is held
