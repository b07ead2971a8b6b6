"""Known gaps of earlier rounds, each re-created from a public script as people run it."""

from __future__ import annotations

import pytest

from tests.library_jobs import expected as ex
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


# DeepSpeed ZeRO-3 (docs' zero.Init example): the optimizer step's temporaries ------------------

@pytest.mark.slow
@needs("deepspeed")
@pytest.mark.xdist_group("ds3-zero-init")  # test_library_jobs_ds3.ZERO_INIT_GROUP
def test_zero3_step_temporaries_are_not_other(tmp_path_factory):
    from tests.library_jobs.test_library_jobs_ds3 import zero_init_two_ranks

    # the estimate test_zero_init_builds_partitioned_two_ranks[on_gpu] asserts on (run once)
    est = zero_init_two_ranks(tmp_path_factory, offload=False)
    assert est.returncode == 0, est.failure()
    assert est.data["mode"] == "fake", est.data["mode_reason"]
    # what ZeRO's step makes around the inner AdamW step (gradient norms, overflow checks, the
    # fp32 copy of the gradient partition) is an optimizer-step temporary, as a plain torch
    # optimizer's is; what is left `other` is the batch the loop makes on the device (8 x 64
    # bf16, 8 int64 labels) and a 1-byte flag
    batch = ex.rounded(8 * 64 * ex.BF16) + ex.BLOCK
    assert est.breakdown.get("other", 0) <= batch + ex.BLOCK, est.breakdown
    assert est.breakdown.get("temporary", 0) > 0, est.breakdown
