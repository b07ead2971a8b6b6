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


def test_serve_refuses_an_admission_workdir_that_is_not_a_directory(tmp_path):
    """click.Path(file_okay=False) refuses regular files only: `--admission-workdir /dev/null`
    started the server, whose webhook jobs could never run there."""
    proc = run("-m", "peakmem", "serve", "--admission-workdir", "/dev/null", cwd=tmp_path,
               timeout=60)
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines == ["peakmem: error: Invalid value for '--admission-workdir': '/dev/null' is not "
                     "a directory"]


# -- the job's own threads and environment -----------------------------------------------------


def test_join_job_threads_waits_for_new_non_daemon_threads_only():
    import threading
    import time

    from peakmem.capture.threads import join_job_threads, threads_note

    release = threading.Event()
    old = threading.Thread(target=release.wait, name="old")
    old.start()
    before = set(threading.enumerate())
    done = []
    quick = threading.Thread(target=lambda: (time.sleep(0.2), done.append(1)), name="quick")
    stuck = threading.Thread(target=release.wait, name="stuck")
    daemon = threading.Thread(target=release.wait, name="daemon", daemon=True)
    for thread in (quick, stuck, daemon):
        thread.start()
    started = time.monotonic()
    try:
        assert join_job_threads(before, grace=1.0) == ["stuck"]
        assert done == [1] and 0.9 < time.monotonic() - started < 3
    finally:
        release.set()
    assert "1 non-daemon thread(s) of the job (stuck) still ran 1 s" in threads_note(["stuck"], 1.0)


LATE_THREAD = """import os
os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
import threading, time
import torch
keep = []
def late():
    time.sleep(0.3)
    keep.append(torch.empty(1 << 30, dtype=torch.uint8, device="cuda"))
threading.Thread(target=late).start()
model = torch.nn.Linear(16, 16).cuda()
model(torch.randn(4, 16, device="cuda")).sum().backward()
"""


def test_a_thread_allocating_after_the_main_thread_ended_counts_and_a_set_alloc_conf_is_noted(
        tmp_path):
    """`python train.py` waits for its non-daemon threads before it exits: the 1 GiB a thread
    allocated after the main thread's last line was left out (peak 68 MB, exit 0, no word).
    And PYTORCH_CUDA_ALLOC_CONF set by the job itself (torch reads it at its first CUDA call)
    was ignored without a word: now a note names it."""
    (tmp_path / "train.py").write_text(LATE_THREAD)
    proc = run("-m", "peakmem", "estimate", "--json", "train.py", cwd=tmp_path, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout)
    assert result["peak_allocated_bytes"] >= 1 << 30
    notes = [note for note in result["notes"] if "PYTORCH_CUDA_ALLOC_CONF" in note]
    # set before its first CUDA use: torch reads it, and the estimate simulates it (s7)
    assert len(notes) == 1 and "'expandable_segments:True'" in notes[0], notes
    assert "the estimate simulates it" in notes[0]
    assert result["alloc_conf"] == "expandable_segments:True"
    assert not any("non-daemon" in note for note in result["notes"])


LATE_CONF = """import os
import torch
x = torch.ones(4, device="cuda")  # torch reads its allocator configuration here
os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
model = torch.nn.Linear(16, 16).cuda()
model(torch.randn(4, 16, device="cuda")).sum().backward()
"""


def test_an_alloc_conf_set_after_the_first_cuda_use_is_ignored_and_said(tmp_path):
    """Set after torch read it: ignored by torch and by the estimate, with a warning that says
    so (the job's author likely meant it to count)."""
    (tmp_path / "train.py").write_text(LATE_CONF)
    proc = run("-m", "peakmem", "estimate", "--json", "train.py", cwd=tmp_path, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout)
    notes = [note for note in result["notes"] if "PYTORCH_CUDA_ALLOC_CONF" in note]
    assert len(notes) == 1 and "after its first CUDA use" in notes[0], notes
    assert result["alloc_conf"] == ""


# -- the service and its webhook ----------------------------------------------------------------


def test_shell_words_refuses_a_command_over_a_shell_commands_length_in_no_time():
    """shlex builds each word by concatenation, quadratic in its length: a pod whose
    peakmem.io/command annotation held one 5 MB word kept the webhook busy for over ten minutes
    (80 k characters: 0.2 s). A job's `Popen(COMMAND, shell=True)` went through the same split."""
    import time

    from peakmem.capture.python_subprocesses import python_command
    from peakmem.shell_words import MAX_SHELL_COMMAND_CHARS, CommandTooLong, shell_words

    assert shell_words("python 'a b'.py --x=1") == ["python", "a b.py", "--x=1"]
    started = time.monotonic()
    with pytest.raises(CommandTooLong, match="5000007 characters long, over the 131072"):
        shell_words("python " + "x" * 5_000_000)
    assert python_command("python " + "x" * 5_000_000, shell=True) is None
    assert len(shell_words("python " + "x" * (MAX_SHELL_COMMAND_CHARS - 7))) == 2
    assert time.monotonic() - started < 10


@pytest.fixture(scope="module")
def service():
    from fastapi.testclient import TestClient

    from peakmem.service.admission import AdmissionConfig
    from peakmem.service.app import ServiceConfig, create_app
    from peakmem.service.estimators import fake_estimator

    app = create_app(ServiceConfig(sandbox="off", workers=1,
                                   admission=AdmissionConfig(budget_seconds=5)),
                     estimator=fake_estimator)
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client


def _review(annotations: dict, version: object = "admission.k8s.io/v1") -> dict:
    pod = {"metadata": {"annotations": annotations, "namespace": "ns"},
           "spec": {"containers": [{"name": "c", "image": "i"}]}}
    return {"apiVersion": version, "kind": "AdmissionReview",
            "request": {"uid": "u1", "object": pod}}


def test_the_webhook_answers_a_long_command_annotation_at_once(service):
    import time

    started = time.monotonic()
    answer = service.post("/v1/admission", json=_review(
        {"peakmem.io/command": "python " + "x" * 5_000_000})).json()
    assert time.monotonic() - started < 10
    assert answer["response"]["allowed"] is True and "patch" not in answer["response"]
    assert "peakmem.io/command cannot be parsed: the command is 5000007 characters long" in \
        answer["response"]["warnings"][0]


@pytest.mark.parametrize("version, answered", [
    ("admission.k8s.io/v1beta1", "admission.k8s.io/v1beta1"),
    ("admission.k8s.io/v1", "admission.k8s.io/v1"),
    (5, "admission.k8s.io/v1"),
    ("admission.k8s.io/v9", "admission.k8s.io/v1"),
])
def test_the_webhook_answers_in_the_reviews_own_version(service, version, answered):
    """A v1beta1 AdmissionReview (a cluster whose webhook configuration lists only v1beta1) got
    a v1 answer, which the API server refuses: every pod failed admission or went unpatched."""
    answer = service.post("/v1/admission", json=_review(
        {"peakmem.io/command": "python -m json.tool"}, version)).json()
    assert answer["apiVersion"] == answered and answer["response"]["uid"] == "u1"


@pytest.mark.parametrize("options, says", [
    ('{"steps": -1}', "peakmem.io/options: steps"),
    ('{"timeout": 1e300}', "peakmem.io/options: timeout"),
    ('{"mode": "zzz"}', "peakmem.io/options: mode"),
    ('{"steps": 1, "steps": 2}', "the key 'steps' appears twice"),
])
def test_the_webhook_checks_the_option_values_as_the_estimates_route_does(service, options, says):
    """peakmem.io/options was checked for its key names only: `{"steps": -1}` was queued and
    estimated (the fake estimator ignores it; the CLI one failed without naming the field), a key
    given twice kept its last value."""
    answer = service.post("/v1/admission", json=_review(
        {"peakmem.io/command": "python -m json.tool", "peakmem.io/options": options})).json()
    response = answer["response"]
    assert response["allowed"] is True and "patch" not in response
    assert says in response["warnings"][0], response["warnings"]


def test_the_webhook_still_patches_with_good_options(service):
    answer = service.post("/v1/admission", json=_review(
        {"peakmem.io/command": "python -m json.tool",
         "peakmem.io/options": '{"steps": 2, "mode": "fake"}'})).json()
    assert answer["response"].get("patchType") == "JSONPatch", answer
