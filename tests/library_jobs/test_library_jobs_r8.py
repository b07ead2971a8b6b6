"""Round 8: well-known training scripts and the libraries' known gaps (timm's Kron optimizer,
torchmetrics' R2Score, ...), each in a tiny script written the way the public source it cites
writes it, run unmodified through the real CLI (`python -m peakmem estimate --json -- python
SCRIPT ARGS`, scripts/r8_*.py). Parameter and optimizer bytes are worked out by hand
(expected.py), not read from peakmem."""

from __future__ import annotations

import pytest

from tests.library_jobs import expected as ex
from tests.library_jobs.harness import estimate
from tests.library_jobs.test_library_jobs import assert_training, needs


def _notes(est) -> str:
    return "\n".join(est.data["notes"])


# timm's Kron (PSGD) + torchmetrics' R2Score ------------------------------------------------------

def kron_factor_shapes(shape: ex.Shape, max_size: int = 2048, min_ndim: int = 2) -> list[ex.Shape]:
    """timm.optim.Kron's preconditioner factors of one parameter (`_init_Q_exprs`, default
    memory_save_mode None): a diagonal (a vector) for a dimension of size 1, one over
    `max_size_triangular` or a parameter of fewer than `min_ndim_triangular` dimensions, else a
    triangular (a full square matrix, `scale * torch.eye(size)`)."""
    return [(size,) if size == 1 or size > max_size or len(shape) < min_ndim else (size, size)
            for size in shape]


@needs("timm", "torchmetrics")
@pytest.mark.parametrize("opt", ["kron", "kronw"])
def test_timm_kron_optimizer_and_torchmetrics_r2score(opt):
    shapes = ex.linear(48, 24) + ex.linear(1, 48)
    params = ex.device_bytes(shapes, ex.FP32)
    factors = [factor for shape in shapes for factor in kron_factor_shapes(shape)]
    # momentum_buffer (like the parameter) + the factors Q, a list in each parameter's state
    state = params + ex.device_bytes(factors, ex.FP32)
    est = estimate("r8_timm_kron_r2score.py", "--opt", opt)
    assert_training(est, params=params, optimizer_state=state)
    # Kron's spectral-norm bound picks a row with `A[j]` (a 0-d device index) and R2Score's
    # compute writes `raw_scores[cond]` (a 0-d bool mask): both ran on fake tensors
    assert est.data["mode"] == "fake", est.data["mode_reason"]
    assert est.data["phases_ran"] == ["training", "eval", "training", "eval"]
    assert "epoch 1 loss" in est.stderr and "'r2':" in est.stderr
    assert "_precond_grad" in _notes(est)  # its torch.compile'd functions ran eagerly
