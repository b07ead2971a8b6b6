"""Known gaps of earlier rounds, each re-created from a public script as people run it."""

from __future__ import annotations

import pytest

from tests.library_jobs.harness import estimate
from tests.library_jobs.test_library_jobs import needs

# Lightning FSDP: validate(ckpt_path="best") after fit in one process --------------------------

@pytest.mark.slow
@needs("lightning")
def test_lightning_fsdp_validate_best_after_fit_names_the_lightning_bug(tmp_path):
    est = estimate("gaps_lightning_fsdp_validate_best.py", cwd=tmp_path, timeout=240)
    # the job fails as on GPUs (the checkpoint meets the shards fit left): the one-line error
    # says it is Lightning's bug, not the fake device's
    assert est.returncode == 1, est.failure()
    message = est.data["error"]["message"]
    assert "Error(s) in loading state_dict for LitTransformer" in message
    assert "Lightning-AI/pytorch-lightning#20373" in message, message
    assert "validated the best checkpoint" not in est.stderr
