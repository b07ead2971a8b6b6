"""capture/einsum_path.py: an einsum of three or more device operands contracted left to right
(no opt_einsum path) is noted, with the intermediates torch makes that way in the trace."""

import torch

from peakmem.capture import capture_callable
from peakmem.capture.einsum_path import path_optimized
from tests.capture.capture_helpers import allocations


def kron_like_contraction():
    # timm Kron's `_precond_grad` for a 64 x 32 weight: "aA,bB,aC,bD,CD->AB"
    q1, q2 = torch.eye(64, device="cuda"), torch.eye(32, device="cuda")
    grad = torch.randn(64, 32, device="cuda")
    return torch.einsum("aA,bB,aC,bD,CD->AB", q1, q2, q1, q2, grad)


def test_a_left_to_right_contraction_is_noted_with_its_intermediates(a100, stack24,
                                                                     monkeypatch):
    monkeypatch.setattr(torch.backends.opt_einsum, "enabled", False)
    result = capture_callable(kron_like_contraction, gpu=a100, stack=stack24, steps="all",
                              mode="fake")
    assert result.error is None, result.error_text
    assert [note for note in result.notes if note.startswith("torch.einsum contracted 5")]
    # left to right, the first pair's outer product: 64 x 64 x 32 x 32 float32
    assert max(size for size, _tag in allocations(result.trace)) >= 64 * 64 * 32 * 32 * 4


def test_two_operands_or_an_optimized_path_are_not_noted(a100, stack24, monkeypatch):
    def job():
        a = torch.randn(8, 4, device="cuda")
        torch.einsum("ij,kj->ik", a, a)
        if path_optimized():
            kron_like_contraction()

    result = capture_callable(job, gpu=a100, stack=stack24, steps="all", mode="fake")
    assert result.error is None, result.error_text
    assert not [note for note in result.notes if note.startswith("torch.einsum")]

