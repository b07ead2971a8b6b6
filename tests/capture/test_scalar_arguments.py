"""A device tensor passed where an op takes a Python number (`torch.full(..., fill_value=t)`):
torch's argument parser reads it with `.item()` below the torch-function layer. Fake mode answers
the read from the values a device tensor built from host data keeps (transformers' beam search:
`torch.full(..., fill_value=pad_token_id or eos_token_id[0])`, its special tokens made with
`torch.tensor(token, device=device)`); an unknown value still stops fake mode."""

from __future__ import annotations

import torch

from peakmem.capture import capture_callable
from tests.capture.capture_helpers import allocations


def test_a_known_device_scalar_fills_a_tensor_in_fake_mode(a100, stack24):
    seen = {}

    def job():
        pad = torch.tensor(0, device="cuda", dtype=torch.long)
        eos = torch.tensor([5, 7], device="cuda", dtype=torch.long)
        fill = pad or eos[0]  # transformers' `_beam_search`: `pad_token_id or eos_token_id[0]`
        running = torch.full((4, 3, 8), fill_value=fill, dtype=torch.int64, device="cuda")
        seen["fill"] = int(fill)
        seen["shape"] = tuple(running.shape)

    capture = capture_callable(job, gpu=a100, stack=stack24)
    assert capture.error is None, capture.error
    assert seen == {"fill": 5, "shape": (4, 3, 8)}
    assert [size for size, _ in allocations(capture.trace, op="full")] == [4 * 3 * 8 * 8]


def test_an_unknown_device_scalar_still_stops_fake_mode(a100, stack24):
    def job():
        computed = torch.randn(3, device="cuda").sum()  # a value fake mode does not have
        torch.full((2, 2), fill_value=computed, device="cuda")

    capture = capture_callable(job, gpu=a100, stack=stack24)
    assert capture.error is not None
    assert capture.fake_limit is not None and "reads a device value on the host" in capture.fake_limit
