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


ROTATING_TRAINER = """
import sys, torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments
torch.manual_seed(0)
config = GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=256, n_positions=64)
model = GPT2LMHeadModel(config)
ids = torch.randint(0, 256, (16, 32))
data = [{"input_ids": row, "labels": row} for row in ids]
args = TrainingArguments(output_dir=sys.argv[1], max_steps=3, per_device_train_batch_size=4,
                         save_steps=1, save_total_limit=1, report_to="none", logging_steps=1)
Trainer(model=model, args=args, train_dataset=data).train()
print("TRAINER-DONE", flush=True)
"""


@needs("transformers", "accelerate")
def test_save_total_limit_does_not_delete_the_users_checkpoint(tmp_path, monkeypatch):
    """Trainer's rotation (save_total_limit=1) removes the oldest checkpoint-N of the output
    directory with shutil.rmtree: in the estimate that is the user's real checkpoint-0."""
    monkeypatch.setenv("TMPDIR", str(tmp_path / "systemp"))
    (tmp_path / "systemp").mkdir()
    out = tmp_path / "out"
    (out / "checkpoint-0").mkdir(parents=True)
    (out / "checkpoint-0" / "model.safetensors").write_bytes(b"real weights" * 1000)
    (out / "checkpoint-0" / "trainer_state.json").write_text('{"global_step": 0}')
    script = tmp_path / "rotating_trainer.py"
    script.write_text(ROTATING_TRAINER)
    before = snapshot(out)
    est = estimate(str(script), str(out))
    assert est.returncode == 0, est.failure()
    assert "TRAINER-DONE" in est.stderr
    assert snapshot(out) == before
