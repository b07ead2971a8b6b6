"""A CPU random number generator state restored from a checkpoint (`torch.load` keeps the loaded
tensors fake until read: the HF Trainer's `rng_state.pth` on `resume_from_checkpoint`,
accelerate's `load_state`): `torch.random.set_rng_state` gets the real state, read from the file."""

from __future__ import annotations

import torch

from peakmem.capture import capture_callable


def test_set_rng_state_from_a_loaded_checkpoint(a100, stack24, tmp_path):
    torch.manual_seed(1234)
    saved = {"cpu": torch.random.get_rng_state(), "python": 0}
    expected = torch.rand(4)  # what the state draws next
    path = tmp_path / "rng_state.pth"
    torch.save(saved, path)
    seen = {}

    def job():
        state = torch.load(path, weights_only=True)
        torch.random.set_rng_state(state["cpu"])  # the Trainer's `_load_rng_state`
        seen["draw"] = torch.rand(4)
        torch.set_rng_state(state["cpu"])
        seen["again"] = torch.rand(4)
        model = torch.nn.Linear(4, 4).cuda()
        model(seen["draw"].cuda()).sum().backward()

    capture = capture_callable(job, gpu=a100, stack=stack24)
    assert capture.error is None, capture.error
    assert torch.equal(seen["draw"], expected) and torch.equal(seen["again"], expected)
