"""Round 23a: language-model fine-tuning scripts and Trainer features not covered before,
re-created in their upstream structure (scripts/r23a_*; each docstring names the upstream file
and version) and run unmodified on tiny local models and data (no network). Device bytes are
worked out by hand from the configs (expected.py), not read from peakmem.
"""

from __future__ import annotations

import pytest

from tests.library_jobs.harness import estimate_here

pytestmark = pytest.mark.slow


# transformers run_clm.py with the Trainer's --optim galore_adamw, galore-torch not installed ----

def test_trainer_galore_without_galore_torch_is_the_jobs_one_line_error(tmp_path):
    import importlib.util

    if importlib.util.find_spec("galore_torch") is not None:
        pytest.skip("galore-torch is installed: the optimizer is built")
    from tests.library_jobs.test_library_jobs_hf2 import BATCH, BLOCK_SIZE, write_clm_files

    files = write_clm_files(tmp_path)
    # test_library_jobs_hf2.py's run_clm arguments; a longer limit: the job runs twice
    est = estimate_here(
        "hf_ex_run_clm.py",
        "--config_name", str(files["model"]), "--tokenizer_name", str(files["model"]),
        "--train_file", str(files["train"]), "--validation_file", str(files["valid"]),
        "--block_size", str(BLOCK_SIZE), "--per_device_train_batch_size", str(BATCH),
        "--max_steps", "3", "--do_train", "--report_to", "none", "--output_dir",
        str(files["out"]), "--optim", "galore_adamw", "--optim_target_modules", "attn,mlp",
        timeout=300)
    # the Trainer reads len(train_dataloader) (shortened by the step policy) before it builds
    # the optimizer, which raises; the rerun with the loader's own length raised the same, so
    # the error is the job's own, without the "--steps all" hint (estimate/api.py)
    assert est.returncode == 1
    error = est.data["error"]
    assert error["kind"] == "job_failed" and error["reason"] == "raised"
    assert error["message"].startswith(
        "the job raised ImportError: You need to install `galore_torch` in order to use GaLore "
        "optimizers.")
    assert "--steps all" not in error["message"] and "--steps all" not in error["traceback"]
