"""A Hugging Face Trainer estimate (run_clm.py, re-created) leaves the user's output directory
as it was: no checkpoint-N/, trainer_state.json, training_args.bin, config or tokenizer files
left behind, and the user's own files in it untouched."""

from __future__ import annotations

from tests.jobs.job_files_tree import snapshot
from tests.library_jobs.harness import estimate
from tests.library_jobs.test_library_jobs import needs
from tests.library_jobs.test_library_jobs_hf import clm_files  # noqa: F401 - the fixture


@needs("transformers", "accelerate", "datasets")
def test_run_clm_trainer_leaves_the_output_directory_as_it_was(clm_files, tmp_path,  # noqa: F811
                                                                monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path / "systemp"))  # the tree is under the system's
    (tmp_path / "systemp").mkdir()
    out = clm_files["out"]
    (out / "runs").mkdir(parents=True)
    (out / "README.md").write_text("the user's earlier run\n")
    (out / "runs" / "events.out.tfevents.1.host").write_bytes(b"\x00earlier events")
    before = snapshot(tmp_path)
    est = estimate(
        "hf_ex_run_clm.py",
        "--config_name", str(clm_files["model"]), "--tokenizer_name", str(clm_files["model"]),
        "--train_file", str(clm_files["train"]), "--validation_file", str(clm_files["valid"]),
        "--block_size", "32", "--per_device_train_batch_size", "4",
        "--per_device_eval_batch_size", "4", "--max_steps", "3", "--do_train", "--do_eval",
        "--save_steps", "1", "--save_total_limit", "1", "--report_to", "none", "--seed", "0",
        "--output_dir", str(out),
    )
    assert est.returncode == 0, est.failure()
    after = {path: what for path, what in snapshot(tmp_path).items()
             if not path.startswith("systemp")}
    assert after == {path: what for path, what in before.items()
                     if not path.startswith("systemp")}
    notes = est.data["notes"]
    assert any("peakmem put them back as they were" in note for note in notes), notes
