"""A third adversarial corpus: hostile jobs (tests/data/hostile_scripts3) and hostile input
files that test_hostile_corpus.py and test_hostile_corpus2.py do not cover.

Each case names what went wrong before its fix. Jobs run through the real command line
(`python -m peakmem estimate --json`); input files through click's CliRunner (fast).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

from peakmem.cli.main import main

CORPUS = Path(__file__).resolve().parents[1] / "data" / "hostile_scripts3"
SRC = Path(__file__).resolve().parents[2] / "src"
PEAKMEM_DIR = str(SRC / "peakmem")
KINDS = {1: "job_failed", 2: "bad_input", 124: "timeout"}


# -- hostile jobs -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    script: str
    code: int
    reason: str | None = None
    timeout: float = 30
    message: str | None = None


CASES = [
    # rebinding json.dumps / builtins.open / os.replace / os.getpid after training (harmless
    # under python) broke the result's way back: no_result or bad_result
    Case("patch_stdlib_after_training.py", 0),
    # time.perf_counter stubbed to NaN after training: the result's `seconds` was NaN, refused
    Case("patch_clocks_after_training.py", 0),
    # set_per_process_memory_fraction(nan): NaN went into the trace, refused as bad_result
    Case("memory_fraction_nan.py", 1, "raised", message="invalid fraction:nan"),
]


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str
    seconds: float


def _run_case(case: Case, root: Path) -> Run:
    workdir = root / case.script.removesuffix(".py")
    shutil.copytree(CORPUS, workdir)
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    argv = [sys.executable, "-m", "peakmem", "estimate", "--json", "--gpu", "a100-40gb",
            "--timeout", str(case.timeout), "--", "python", case.script]
    started = time.monotonic()
    proc = subprocess.run(argv, cwd=workdir, env=env, capture_output=True, text=True,
                          errors="replace", timeout=case.timeout + 60, stdin=subprocess.DEVNULL)
    return Run(proc.returncode, proc.stdout, proc.stderr, time.monotonic() - started)


@pytest.fixture(scope="module")
def corpus_runs(tmp_path_factory) -> dict[str, Run]:
    root = tmp_path_factory.mktemp("hostile3")
    with ThreadPoolExecutor(max_workers=max(1, min(4, os.cpu_count() or 1))) as pool:
        futures = {case.script: pool.submit(_run_case, case, root) for case in CASES}
        return {name: future.result() for name, future in futures.items()}


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.script.removesuffix(".py"))
def test_hostile_job(case: Case, corpus_runs: dict[str, Run]):
    run = corpus_runs[case.script]
    assert run.returncode == case.code, (run.stdout, run.stderr[-3000:])
    assert run.seconds < case.timeout + 25
    assert run.stdout.strip().count("\n") == 0
    payload = json.loads(run.stdout)
    assert not [line for line in run.stderr.splitlines()
                if line.strip().startswith("File ") and PEAKMEM_DIR in line], run.stderr[-3000:]
    if case.code == 0:
        assert payload["peak_allocated_bytes"] > 0 and "error" not in payload
        return
    error = payload["error"]
    assert error["kind"] == KINDS[case.code] and error["reason"] == case.reason
    assert "\n" not in error["message"]
    if case.message is not None:
        assert case.message in error["message"]


# -- trace files ------------------------------------------------------------------------------


HEADER = {"format": "peakmem-trace", "version": 1, "meta": {},
          "tags": [["parameter", "fc1", "forward", "aten::mm"]]}


def _simulate(tmp_path: Path, events: list[list[int]], *args: str) -> dict:
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join([json.dumps(HEADER), *map(json.dumps, events)]) + "\n")
    result = CliRunner().invoke(main, ["simulate", str(path), "--json", *args])
    assert result.exit_code == 0, (result.stdout, result.stderr)
    return json.loads(result.stdout)


def test_zero_byte_allocations_take_no_block(tmp_path):
    # CUDACachingAllocator::allocate(0) returns a null pointer without a block; the replay gave
    # each a 512-byte block: 100000 empty tensors "held" 48.8 MiB (1e6: 488 MiB, 40 s)
    zeros = [[0, i, 0, 0, -1] for i in range(100_000)]
    events = [*zeros, [2, 7, 0, 3, -1], [1, 7, 0, 0, -1], [0, 100_000, 512, 0, 0]]
    peaks = _simulate(tmp_path, events)
    assert peaks["peak_allocated_bytes"] == 512
    assert peaks["peak_reserved_bytes"] == 2 * 2**20
    # and such an id is still allocated once and freed once
    path = tmp_path / "trace.jsonl"
    lines = [HEADER, [0, 0, 0, 0, -1], [1, 0, 0, 0, -1], [1, 0, 0, 0, -1]]
    path.write_text("\n".join(map(json.dumps, lines)) + "\n")
    result = CliRunner().invoke(main, ["simulate", str(path)])
    assert result.exit_code == 2
    assert "event 2: free of id 0, which is not allocated" in result.stderr


# -- `peakmem batch` ---------------------------------------------------------------------------


FAKE = "peakmem.service.estimators:fake_estimator"


@pytest.mark.parametrize("link", ["same-name", "symlink", "hardlink"])
def test_batch_results_file_that_is_the_jobs_file_is_refused(tmp_path, link):
    # the results were appended to the jobs file: every later run failed on "id 'a' appears
    # twice", and the jobs file was no longer a jobs file
    jobs = tmp_path / "jobs.jsonl"
    line = {"id": "a", "command": ["python", "t.py"], "files": {"t.py": "print(1)"}}
    jobs.write_text(json.dumps(line) + "\n")
    output = jobs if link == "same-name" else tmp_path / "out.jsonl"
    if link == "symlink":
        output.symlink_to(jobs.name)
    elif link == "hardlink":
        os.link(jobs, output)
    before = jobs.read_text()
    result = CliRunner().invoke(main, ["batch", "--in-process", "--estimator", FAKE, str(jobs),
                                       "-o", str(output)])
    assert result.exit_code == 2, result.output
    errors = [text for text in result.stderr.splitlines() if text.startswith("peakmem: error:")]
    assert len(errors) == 1 and "is the jobs file" in errors[0], result.stderr
    assert jobs.read_text() == before


# -- scripts that are symlinks to nowhere ------------------------------------------------------


@pytest.mark.parametrize("link, says", [
    ("self.py", "script not found: self.py (a symlink loop)"),
    ("gone.py", "script not found: gone.py (a symlink to 'missing.py', which is not there)"),
], ids=["loop", "dangling"])
def test_a_script_that_is_a_broken_symlink_says_so(tmp_path, monkeypatch, link, says):
    # "script not found: self.py" while `ls` shows self.py right there
    os.symlink("self.py", tmp_path / "self.py")
    os.symlink("missing.py", tmp_path / "gone.py")
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["estimate", "--json", "--", "python", link])
    assert result.exit_code == 2, result.output
    assert json.loads(result.stdout)["error"]["message"] == says


# -- output files that are the job's inputs ----------------------------------------------------


@pytest.mark.parametrize("flag, output, says", [
    # the script was truncated before the job ran: the empty job "fit" with a 0-byte peak
    ("--job-log", "train.py", "would overwrite a Python source file"),
    # a pickle was written over the module the job imports
    ("--snapshot", "_train.py", "would overwrite a Python source file"),
    ("--timeline", "data.html", "would overwrite a file the job's command names (--cfg=data.html)"),
], ids=["job-log-script", "snapshot-module", "timeline-argument"])
def test_an_output_file_that_is_one_of_the_jobs_inputs_is_refused(tmp_path, monkeypatch, flag,
                                                                   output, says):
    (tmp_path / "train.py").write_text("from _train import train\ntrain()\n")
    shutil.copy(CORPUS / "_train.py", tmp_path / "_train.py")
    (tmp_path / "data.html").write_text("<html></html>\n")
    before = {path.name: path.read_bytes() for path in tmp_path.iterdir()}
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["estimate", "--json", flag, output, "--", "python",
                                       "train.py", "--cfg=data.html"])
    assert result.exit_code == 2, result.output
    error = json.loads(result.stdout)["error"]
    assert error["kind"] == "bad_input" and says in error["message"]
    assert {path.name: path.read_bytes() for path in tmp_path.iterdir()} == before


def test_clobbered_input_leaves_new_and_unrelated_files_alone(tmp_path):
    from peakmem.cli.output_paths import clobbered_input

    (tmp_path / "old.pickle").write_bytes(b"x")
    assert clobbered_input(str(tmp_path / "new.pickle"), ["python", "train.py"]) is None
    assert clobbered_input(str(tmp_path / "old.pickle"), ["python", "train.py"]) is None
    assert clobbered_input(str(tmp_path / "old.pickle"),
                           ["python", "train.py", str(tmp_path / "old.pickle")]) is not None


@pytest.mark.parametrize("args", [
    ["fit", "--json", "--arg", "n=1..8", "--job-log", "train.py", "--", "python", "train.py",
     "{n}"],
    ["measure", "--out", "train.py", "--", "python", "train.py"],
    ["measure", "--snapshot", "_train.py", "--", "python", "train.py"],
], ids=["fit-job-log", "measure-out", "measure-snapshot"])
def test_fit_and_measure_outputs_that_are_the_jobs_inputs_are_refused(tmp_path, monkeypatch,
                                                                      args):
    # fit truncated the script before its first estimate; measure wrote over it afterwards
    (tmp_path / "train.py").write_text("from _train import train\ntrain()\n")
    shutil.copy(CORPUS / "_train.py", tmp_path / "_train.py")
    before = {path.name: path.read_bytes() for path in tmp_path.iterdir()}
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    assert "would overwrite a Python source file" in result.output
    assert {path.name: path.read_bytes() for path in tmp_path.iterdir()} == before


# -- sweep plans (TOML, benchmarks/sweep.py) ---------------------------------------------------


@pytest.mark.parametrize("text, says", [
    # TypeError / ValueError / OverflowError escaped as tracebacks
    ('steps = 1979-05-27\n[[run]]\njob = "t.py"\n', "steps must be an integer"),
    ('timeout = nan\n[[run]]\njob = "t.py"\n', "timeout must be a number of seconds"),
    ('[[run]]\njob = "t.py"\nsteps = "3"\n', "run 1: steps must be an integer"),
    ('[[run]]\njob = "t.py"\ntimeout = inf\n', "run 1: timeout must be"),
    ('[[group]]\njob = "t.py"\nscale = "b"\ngrid = {b = [1, 07:32:00]}\n',
     "group 1: scale values must be finite numbers"),
    ('[[group]]\njob = "t.py"\nscale = "b"\ngrid = {b = [1, "x"]}\n', "scale values must be"),
    ('group = 5\n', "`group` must be an array of tables"),
    ('run = [1, 2]\n', "`run` must be an array of tables"),
    # 7 axes of 10 values: ten million PlannedRuns built before anything ran (1e20 with 20)
    ('[[group]]\njob = "t.py"\n[group.grid]\n'
     + "".join(f"a{i} = [{', '.join(map(str, range(10)))}]\n" for i in range(20)),
     "group 1: the grid defines more than 100000 runs"),
], ids=["steps-date", "timeout-nan", "steps-string", "timeout-inf", "scale-time",
        "scale-string", "group-int", "run-ints", "grid-1e20"])
def test_a_hostile_sweep_plan_is_one_sweep_error(tmp_path, text, says):
    from peakmem.measure.sweep_plan import SweepError, load_plan

    (tmp_path / "plan.toml").write_text(text)
    started = time.monotonic()
    with pytest.raises(SweepError) as caught:
        load_plan(tmp_path / "plan.toml")
    assert says in str(caught.value)
    assert time.monotonic() - started < 5


# -- `peakmem bench --cache` -------------------------------------------------------------------


def test_bench_cache_that_is_not_a_cache_is_refused_and_left_alone(tmp_path):
    # `--cache DATA/gpumemnet/mlp_data_step1.csv` appended a JSON line to the dataset: the next
    # bench run failed on it ("10 fields, the header has 8")
    data = tmp_path / "data" / "gpumemnet"
    data.mkdir(parents=True)
    dataset = data / "mlp_data_step1.csv"
    shutil.copy(Path(__file__).resolve().parents[1] / "data" / "hostile_inputs" /
                "mlp1_valid.csv", dataset)
    before = dataset.read_bytes()
    result = CliRunner().invoke(main, ["bench", "gpumemnet-mlp1", "--data", str(tmp_path / "data"),
                                       "--estimators", "horus", "--cache", str(dataset),
                                       "--jobs", "1"])
    assert result.exit_code == 2, result.output
    assert "not a peakmem bench cache" in result.stderr
    assert dataset.read_bytes() == before


def test_bench_cache_with_a_torn_first_line_is_still_a_cache(tmp_path):
    from peakmem.bench.runner import ResultCache

    path = tmp_path / "cache.jsonl"
    path.write_text('{"key": "v1|x|horus@1|0", "result": {"row_')  # an interrupted first write
    assert ResultCache(path).get("v1|x|horus@1|0") is None


@pytest.mark.parametrize("cwd", ["a\x00b", "  "], ids=["nul", "blank"])
def test_batch_job_cwd_that_is_no_path_is_a_bad_input_line(cwd):
    # "embedded null byte" from Path.resolve(): an internal error (exit 70), retryable
    from peakmem.service.batch import BatchSettings, run_one

    line = run_one("a", {"id": "a", "command": ["python", "train.py"], "cwd": cwd}, "/tmp",
                   BatchSettings(estimator=FAKE))
    assert line["status"] == "failed" and not line["retryable"]
    assert line["error"]["kind"] == "bad_input" and "`cwd` must be a directory path" in \
        line["error"]["message"]
