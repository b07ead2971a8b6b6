"""The k7 adversarial sweep's regressions (benchmarks/hostile_sweep_k7.py runs the whole sweep):
one test per class of hostile input that broke the contract before its fix. Each docstring says
what went wrong."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

SRC = Path(__file__).resolve().parents[2] / "src"
FAKE = "peakmem.service.estimators:fake_estimator"
JOB = {"id": "a", "command": ["python", "train.py"], "cwd": "."}
DONE = {"id": "a", "status": "done", "result": {"peak_bytes": 1}, "error": None, "key": "k",
        "attempts": 1, "seconds": 0.1, "retryable": False}


def run(*args: str, cwd: Path, timeout: float = 120, env: dict[str, str] | None = None,
        ) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "PYTHONPATH": str(SRC), "PEAKMEM_WARM": "0", **(env or {})}
    return subprocess.run([sys.executable, *args], cwd=cwd, env=full_env, capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def _batch_dir(tmp_path: Path, results: bytes | None) -> Path:
    jobs = json.dumps(JOB) + "\n" + json.dumps({**JOB, "id": "b"}) + "\n"
    (tmp_path / "jobs.jsonl").write_text(jobs)
    (tmp_path / "train.py").write_text("print('hi')\n")
    if results is not None:
        (tmp_path / "jobs.results.jsonl").write_bytes(results)
    return tmp_path


# -- batch's results file (its resume state) ---------------------------------------------------


@pytest.mark.parametrize("line", [
    {"id": "a", "status": "done"},
    {"id": "a", "status": "done", "result": 5},
    {"id": "a", "status": "failed", "retryable": False},
    {"id": "a", "status": "running", "result": {"peak_bytes": 1}},
])
def test_a_results_line_that_is_not_a_final_result_does_not_skip_its_job(line, tmp_path):
    """`{"id": "a", "status": "done"}` (no result: a hand edit, another tool's line) counted as
    a finished estimate: the rerun skipped job a and the results held no estimate of it."""
    from peakmem.service.batch import finished_ids

    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps(line) + "\n")
    assert finished_ids(path) == set()
    path.write_text(json.dumps(line) + "\n" + json.dumps(DONE) + "\n")
    assert finished_ids(path) == {"a"}  # the last line of an id decides
    failed = {**DONE, "status": "failed", "result": None, "error": {"message": "x"}}
    path.write_text(json.dumps(failed) + "\n")
    assert finished_ids(path) == {"a"} and finished_ids(path, retry_failed=True) == set()


def test_a_results_file_saved_with_a_bom_keeps_its_first_result(tmp_path):
    """An editor's BOM before the first line made that line not JSON: its job ran again."""
    from peakmem.service.batch import finished_ids

    path = tmp_path / "r.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(DONE).encode() + b"\r\n")
    assert finished_ids(path) == {"a"}


def test_a_huge_results_line_is_skipped_without_being_held_in_memory(tmp_path, monkeypatch):
    """A results file whose tail is one huge line (a crash's sparse or NUL-filled tail) was
    read as one string: a 2 GB file took 2 GB of RAM (twice, once more to check its last
    byte). The lines around it still count."""
    import peakmem.service.batch as batch

    monkeypatch.setattr(batch, "MAX_RESULT_LINE_BYTES", 1024)
    path = tmp_path / "r.jsonl"
    path.write_bytes(json.dumps(DONE).encode() + b"\n" + b"x" * 5000 + b"\n"
                     + json.dumps({**DONE, "id": "b"}).encode() + b"\n" + b"\0" * 3000)
    assert batch.finished_ids(path) == {"a", "b"}
    lines = list(batch._result_lines(path.open("rb")))
    assert all(len(line) <= 1024 for line in lines) and len(lines) == 2


@pytest.mark.parametrize("tail, count", [(b'\n{"id": "b", "stat', 2), (b"", 2)])
def test_a_torn_results_file_gets_whole_lines_after_it(tail, count, tmp_path):
    """The first new line after a crash's torn last line (or a file whose last line has no
    newline) starts on a line of its own; the torn line's job (b) runs again, a stays done."""
    from peakmem.cli.main import main

    root = _batch_dir(tmp_path, json.dumps(DONE).encode() + tail)
    result = CliRunner().invoke(main, ["batch", "--in-process", "--estimator", FAKE, "--json",
                                       str(root / "jobs.jsonl")])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout.splitlines()[-1])["skipped"] == 1
    lines = (root / "jobs.results.jsonl").read_bytes().split(b"\n")
    parsed = []
    for line in lines:
        try:
            parsed.append(json.loads(line))
        except ValueError:
            continue
    assert [entry["id"] for entry in parsed] == ["a", "b"] and len(parsed) == count


def test_a_results_file_that_cannot_be_opened_is_one_bad_input_line(tmp_path):
    """A results file that is a dangling symlink into a missing folder: exit 70 (`peakmem
    internal error: FileNotFoundError`) after the progress bar was drawn."""
    root = _batch_dir(tmp_path, None)
    (root / "jobs.results.jsonl").symlink_to("gone/r.jsonl")
    proc = run("-m", "peakmem", "batch", "--in-process", "--estimator", FAKE, "--json",
               "jobs.jsonl", cwd=root)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "cannot write the results file jobs.results.jsonl" in lines[0]
    assert "a symlink to 'gone/r.jsonl'" in lines[0] and "Traceback" not in proc.stderr
    assert json.loads(proc.stdout)["error"]["kind"] == "bad_input"


# -- options with odd values --------------------------------------------------------------------


@pytest.mark.parametrize("args", [
    ["batch", "--in-process", "--max-seconds", "nan", "jobs.jsonl"],
    ["measure", "--timeout", "inf", "train.py"],
    ["serve", "--admission-budget", "nan"],
    ["serve", "--max-seconds", "nan"],
    ["warm", "--idle", "nan"],
    ["bench", "gpumemnet-mlp1", "--margin", "nan"],
    ["measure", "--timeout", "nan", "train.py"],
    ["measure", "--hz", "inf", "train.py"],
])
def test_a_number_option_refuses_nan_and_infinity(args, tmp_path):
    """click's FloatRange compares with < and >, which NaN passes: `batch --max-seconds nan`
    ran every job with a NaN deadline (each failed), `serve --admission-budget nan` started."""
    _batch_dir(tmp_path, None)
    proc = run("-m", "peakmem", *args, cwd=tmp_path, timeout=60)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "is not a finite number" in lines[0], lines


def test_finite_float_range_keeps_the_range_check():
    import click

    from peakmem.cli.finite import FiniteFloatRange

    kind = FiniteFloatRange(0, 10, min_open=True)
    assert kind.convert("2.5", None, None) == 2.5
    for bad in ["0", "11", "nan", "-inf", "inf", "x"]:
        with pytest.raises(click.BadParameter):
            kind.convert(bad, None, None)


@pytest.mark.parametrize("args, flag", [
    (["estimate", "--json", "--job-log", "", "train.py"], "--job-log"),
    (["estimate", "--json", "--snapshot", "", "train.py"], "--snapshot"),
    (["estimate", "--json", "--timeline", "", "train.py"], "--timeline"),
    (["fit", "--json", "--job-log", "", "--arg", "b=1..2", "--", "python", "train.py", "{b}"],
     "--job-log"),
    (["measure", "--json", "--out", "", "train.py"], "Invalid value for '--out':"),
    (["measure", "--json", "--snapshot", "", "train.py"], "Invalid value for '--snapshot':"),
    (["batch", "--in-process", "--json", "-o", "", "jobs.jsonl"], "-o/--output"),
])
def test_an_output_flag_given_an_empty_name_is_refused(args, flag, tmp_path):
    """`--job-log ''` was read as the flag left out (`if job_log:`): the estimate ran, wrote no
    log and said nothing; `batch -o ''` wrote to the default results file; `measure --out ''`
    became Path('') (the current directory)."""
    _batch_dir(tmp_path, None)
    proc = run("-m", "peakmem", *args, cwd=tmp_path, timeout=60)
    assert proc.returncode == 2, proc.stderr
    error = json.loads(proc.stdout)["error"]
    assert "bad_input" in (error.get("kind"), error.get("reason")), error
    assert f"{flag} '' is not a file name" in error["message"]
    assert not (tmp_path / "jobs.results.jsonl").exists()
