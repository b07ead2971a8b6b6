"""harness.py's job export (`PEAKMEM_EXPORT_JOBS`): what benchmarks/gpu_library_jobs.py
measures on a GPU is the job the test estimates, files and all."""

from __future__ import annotations

import json

import pytest

from tests.library_jobs import harness


def test_an_exported_job_carries_its_directory_its_inputs_and_a_place_for_its_outputs(
        tmp_path, monkeypatch):
    export, cwd, data = tmp_path / "export", tmp_path / "work", tmp_path / "data"
    (cwd / "sub").mkdir(parents=True)
    (cwd / "sub" / "config.json").write_text("{}")
    data.mkdir()
    (data / "train.txt").write_text("hello")
    monkeypatch.setenv(harness.EXPORT_VARIABLE, str(export))
    with pytest.raises(pytest.skip.Exception, match="exported as job"):
        harness.estimate("hf_ex_run_clm.py", "--config", str(cwd / "sub" / "config.json"),
                         "--train_file", str(data / "train.txt"),
                         "--save", str(tmp_path / "model.pt"), "--steps", "3",
                         flags=("--steps", "all"), cwd=cwd)
    (line,) = [json.loads(text) for text in (export / "jobs.jsonl").read_text().splitlines()]
    job = export / "jobs" / line["id"]
    assert line["script"] == "hf_ex_run_clm.py" and line["steps"] == "all"
    assert line["args"] == ["--config", "sub/config.json", "--train_file", "../arg3/train.txt",
                            "--save", "../out5/model.pt", "--steps", "3"]
    assert (job / "cwd" / "sub" / "config.json").read_text() == "{}"  # inside cwd: relative
    assert (job / "arg3" / "train.txt").read_text() == "hello"  # outside: copied beside it
    assert (job / "out5").is_dir() and not (job / "out5" / "model.pt").exists()


def test_without_the_variable_nothing_is_exported(tmp_path, monkeypatch):
    monkeypatch.delenv(harness.EXPORT_VARIABLE, raising=False)
    assert harness._export("x.py", (), (), None, tmp_path) is None
    assert list(tmp_path.iterdir()) == []
