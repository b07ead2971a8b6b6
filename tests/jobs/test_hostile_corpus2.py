"""A second adversarial corpus: hostile jobs and hostile input files that the first corpus
(test_hostile_corpus.py) does not cover, through the real command line.

Every case asserts the contract: one JSON object on stdout (or one error line), the right exit
code and error kind, no traceback from peakmem's own frames, and no hang past the timeout.
The job runs go four at a time (a module fixture).
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from peakmem.jobs.runner import user_traceback
from peakmem.service.files import FilesError, extract_archive

CORPUS = Path(__file__).resolve().parents[1] / "data" / "hostile_scripts2"
SRC = Path(__file__).resolve().parents[2] / "src"
PEAKMEM_DIR = str(SRC / "peakmem")
KINDS = {1: "job_failed", 2: "bad_input", 124: "timeout"}


@dataclass(frozen=True)
class Case:
    name: str
    command: tuple[str, ...]
    code: int
    reason: str | None = None
    job_exit_code: int | None = None
    cwd: str = "."
    timeout: float = 20
    message: str | None = None
    max_cpu_seconds: float | None = None  # peakmem's and its job's CPU time together


CASES = [
    # 26 s (of CPU) to format a million frames before: the job ran past its timeout. The CPU
    # time is the bound (a whole run takes ~4 s of it, the recursion ~2 s); the wall-clock
    # timeout is left wide, as four runs at a time on a loaded machine took 21 s of it
    Case("deep_recursion", ("python", "deep_recursion.py"), 1, "raised",
         message="RecursionError", timeout=60, max_cpu_seconds=15),
    # the child's result carried a 333-bit job_exit_code and was refused as malformed
    Case("exit_huge_int", ("python", "exit_huge_int.py"), 1, "exit", job_exit_code=-1),
    # os._exit(10**100) delivered a malformed result instead of raising OverflowError
    Case("os_exit_huge_int", ("python", "os_exit_huge_int.py"), 1, "exit", job_exit_code=7),
    # peakmem's torch was used where `python train.py` imports the local torch.py
    Case("shadow_torch", ("python", "train.py"), 2, "bad_input", cwd="shadow_torch",
         message="shadow_torch/torch.py shadows the installed torch"),
    # peakmem exited 143 / 1 with nothing on stdout: the job had killed its supervisor
    Case("signal_parent_SIGTERM", ("python", "signal_parent_SIGTERM.py"), 0),
    Case("signal_parent_SIGINT", ("python", "signal_parent_SIGINT.py"), 0),
    # the result file could not be written: no_result for a job python runs to its end
    Case("rlimit_no_files", ("python", "rlimit_no_files.py"), 0),
]


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str
    seconds: float
    cpu_seconds: float  # user + system, of peakmem and the descendants it waited for


def _run_case(case: Case, root: Path) -> Run:
    workdir = root / case.name
    shutil.copytree(CORPUS, workdir)
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    argv = [sys.executable, "-m", "peakmem", "estimate", "--json", "--gpu", "a100-40gb",
            "--timeout", str(case.timeout), "--", *case.command]
    started = time.monotonic()
    # `python -m peakmem` puts its cwd first on sys.path: run it from the corpus root, the
    # job from its own directory (`cd DIR && python train.py` as peakmem sees it)
    if case.cwd != ".":
        argv[argv.index("--") + 1:argv.index("--") + 3] = [
            "python", str(workdir / case.cwd / case.command[1])]
    with open(workdir / ".out", "wb") as out, open(workdir / ".err", "wb") as err:
        proc = subprocess.Popen(argv, cwd=workdir, env=env, stdout=out, stderr=err,
                                stdin=subprocess.DEVNULL)
        killer = threading.Timer(case.timeout + 30, proc.kill)
        killer.start()
        try:
            # wait4: the process's rusage, its reaped children's included (Popen.wait has none)
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            killer.cancel()
    proc.returncode = os.waitstatus_to_exitcode(status)
    return Run(proc.returncode, (workdir / ".out").read_text(errors="replace"),
               (workdir / ".err").read_text(errors="replace"), time.monotonic() - started,
               usage.ru_utime + usage.ru_stime)


@pytest.fixture(scope="module")
def corpus_runs(tmp_path_factory) -> dict[str, Run]:
    root = tmp_path_factory.mktemp("hostile2")
    with ThreadPoolExecutor(max_workers=4) as pool:
        futures = {case.name: pool.submit(_run_case, case, root) for case in CASES}
        return {name: future.result() for name, future in futures.items()}


def _peakmem_frames(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines()
            if line.strip().startswith("File ") and PEAKMEM_DIR in line]


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_hostile_job(case: Case, corpus_runs: dict[str, Run]):
    run = corpus_runs[case.name]
    assert run.returncode == case.code, (run.stdout, run.stderr[-3000:])
    assert run.seconds < case.timeout + 25  # + start-up on a loaded machine
    if case.max_cpu_seconds is not None:
        assert run.cpu_seconds < case.max_cpu_seconds, run.cpu_seconds
    assert run.stdout.strip().count("\n") == 0
    payload = json.loads(run.stdout)
    assert not _peakmem_frames(run.stderr), run.stderr[-3000:]
    if case.code == 0:
        assert "peak_bytes" in payload and "error" not in payload
        return
    error = payload["error"]
    assert error["kind"] == KINDS[case.code]
    assert error["reason"] == case.reason
    assert "\n" not in error["message"]
    if case.job_exit_code is not None:
        assert error["job_exit_code"] == case.job_exit_code
    if case.message is not None:
        assert case.message in error["message"] + (error["traceback"] or "")


def test_a_torch_data_folder_next_to_the_script_is_not_a_shadow():
    # a plain folder named torch (no __init__.py) is a namespace portion python passes over
    import torch  # noqa: F401 - imported, as in the job's process, before the check

    from peakmem.capture.child import shadowed_frameworks
    from peakmem.jobs.runner import JobSpec

    assert shadowed_frameworks(JobSpec(script=str(CORPUS / "torch_data_dir" / "train.py"))) is None
    found = shadowed_frameworks(JobSpec(script=str(CORPUS / "shadow_torch" / "train.py")))
    assert found is not None and "shadow_torch/torch.py shadows the installed torch" in found


def test_user_traceback_keeps_the_innermost_frames_and_leaves_the_exception_as_it_was():
    def down(depth: int) -> None:
        if depth == 5000:
            raise ValueError("deep")
        down(depth + 1)

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(10_000)
    try:
        down(0)
    except ValueError as exc:
        caught = exc
    finally:
        sys.setrecursionlimit(limit)
    original = caught.__traceback__
    text = user_traceback(caught)
    assert text.count("in down") <= 1000
    assert "repeated" in text and text.rstrip().endswith("ValueError: deep")
    assert caught.__traceback__ is original


# -- the service's request bodies ---------------------------------------------------------------

DEEP_JSON = "[" * 100_000 + "]" * 100_000


def _tar_gz(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


@pytest.fixture(scope="module")
def service():
    from fastapi.testclient import TestClient

    from peakmem.service.app import ServiceConfig, create_app
    from peakmem.service.estimators import fake_estimator

    client = TestClient(create_app(ServiceConfig(sandbox="off"), estimator=fake_estimator),
                        raise_server_exceptions=False)
    with client:
        yield client


@pytest.mark.parametrize("field", ["command", "options"])
def test_archive_form_field_nested_too_deeply_is_bad_input(service, field):
    # RecursionError from json.loads escaped the handler: a 500
    form = {"command": "python train.py", "options": "{}"}
    form[field] = DEEP_JSON if field == "command" else '{"steps": ' + DEEP_JSON + "}"
    response = service.post("/v1/estimate-archives", data=form,
                            files={"archive": ("job.tgz", _tar_gz({"train.py": b"print(1)"}))})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["kind"] == "bad_input" and "nested too deeply" in error["message"]


def test_file_name_with_a_lone_surrogate_is_refused_before_the_job_is_queued(service):
    # accepted, then failed in the worker: no file system can write that name
    body = '{"command": ["python", "t.py"], "files": {"t.py": "print(1)", "\\ud800.py": "x"}}'
    response = service.post("/v1/estimates", content=body,
                            headers={"content-type": "application/json"})
    assert response.status_code == 400, response.text
    assert "lone surrogate" in response.json()["error"]["message"]
    member = "data/\udcff.py"  # what tarfile decodes an undecodable byte of a name to
    with pytest.raises(FilesError, match="lone surrogate"):
        extract_archive(_tar_gz({"train.py": b"print(1)", member: b"x"}))


# -- `peakmem batch` ---------------------------------------------------------------------------

FAKE_ESTIMATOR = "peakmem.service.estimators:fake_estimator"


def _batch(tmp_path: Path, jobs_text: str, *args: str) -> subprocess.CompletedProcess:
    (tmp_path / "jobs.jsonl").write_text(jobs_text, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    return subprocess.run(
        [sys.executable, "-m", "peakmem", "batch", "--in-process", "--estimator", FAKE_ESTIMATOR,
         "jobs.jsonl", *args], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=60, stdin=subprocess.DEVNULL)


def _job_line(job_id: str) -> str:
    return json.dumps({"id": job_id, "command": ["python", "t.py"],
                       "files": {"t.py": "print(1)"}}, ensure_ascii=False) + "\n"


def test_batch_jobs_line_nested_too_deeply_is_one_bad_input_line(tmp_path):
    # RecursionError: exit 70 with an internal error
    proc = _batch(tmp_path, '{"id": ' + DEEP_JSON + "}\n")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "line 1: not JSON (nested too deeply)" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_batch_reads_json_lines_split_at_newlines_only(tmp_path):
    # a raw U+2028 inside a JSON string is valid JSON: splitlines() cut the line in two
    proc = _batch(tmp_path, _job_line("a\u2028b") + _job_line("c\x1cd"), "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout)["done"] == 2


def test_batch_results_file_that_is_a_fifo_is_refused_without_blocking(tmp_path):
    # finished_ids() opened the FIFO to look for finished ids and waited for a writer for ever
    # (/dev/zero and /dev/full: read for ever, the host's memory with them)
    os.mkfifo(tmp_path / "results.fifo")
    proc = _batch(tmp_path, _job_line("a"), "-o", "results.fifo")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "results file results.fifo is not a regular file" in proc.stderr


def test_batch_results_file_that_is_a_device_is_refused():
    from peakmem.service.batch import BatchInputError, check_output

    with pytest.raises(BatchInputError, match="not a regular file"):
        check_output(Path("/dev/zero"))


# -- `peakmem pack` estimate files and jobs files ----------------------------------------------


@pytest.mark.parametrize("estimate, message", [
    # 1e308 bytes was placed as a rejected job "needing" a 300-digit number of GiB, exit 0
    ({"peak_bytes": 1e308, "peak_bytes_with_margin": 1e308}, "no non-negative"),
    ({"peak_bytes": 2**64, "peak_bytes_with_margin": 2**64}, "no non-negative"),
    # a margin below the peak was placed by it: the GPU overcommitted
    ({"peak_bytes": 30 * 2**30, "peak_bytes_with_margin": 1}, "is below `peak_bytes`"),
], ids=["1e308", "2**64", "margin-below-peak"])
def test_pack_refuses_estimates_that_no_run_produced(tmp_path, estimate, message):
    (tmp_path / "job.json").write_text(json.dumps(estimate))
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    proc = subprocess.run(
        [sys.executable, "-m", "peakmem", "pack", "--json", "--gpus", "1xa100-40gb", "job.json"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
        stdin=subprocess.DEVNULL)
    assert proc.returncode == 2, proc.stdout
    error = json.loads(proc.stdout)["error"]
    assert error["kind"] == "bad_input" and message in error["message"]
    assert len(error["message"]) < 300


def test_pack_jobs_file_lines_split_at_newlines_only(tmp_path):
    from peakmem.schedule.jobs import read_jobs_file

    line = {"id": "a\u2028b", "command": ["python", "train.py", "--tag", "x\x1cy"]}
    (tmp_path / "jobs.jsonl").write_text(json.dumps(line, ensure_ascii=False) + "\n",
                                         encoding="utf-8")
    entries = read_jobs_file(str(tmp_path / "jobs.jsonl"))
    assert [entry["id"] for entry in entries] == ["a\u2028b"]


# -- `peakmem estimate --model CONFIG` ---------------------------------------------------------


def test_model_config_nested_too_deeply_is_bad_input(tmp_path):
    # RecursionError: exit 70, an internal error
    (tmp_path / "config.json").write_text('{"model_type": ' + DEEP_JSON + "}")
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    proc = subprocess.run(
        [sys.executable, "-m", "peakmem", "estimate", "--json", "--model", "config.json"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
        stdin=subprocess.DEVNULL)
    assert proc.returncode == 2, proc.stdout
    error = json.loads(proc.stdout)["error"]
    assert error["kind"] == "bad_input" and "nested too deeply" in error["message"]


@pytest.mark.parametrize("args, message", [
    (("--emit", "slurm"), "cannot emit slurm: slurm needs the site's shard size"),
    (("--emit", "hami", "--emit-option", "queue=x"), "hami takes no option queue"),
    (("--emit", "hami", "--emit-option", "command=python t.py"), "command must be a list"),
], ids=["slurm-no-shard", "unknown-option", "command-string"])
def test_pack_emit_that_no_job_can_satisfy_is_one_error_and_exit_2(tmp_path, args, message):
    # stdout was empty, the reason on stderr, and the exit code 0
    estimate = {"peak_bytes": 10**9, "peak_bytes_with_margin": 11 * 10**8, "gpu": "a100-40gb"}
    (tmp_path / "job.json").write_text(json.dumps(estimate))
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    proc = subprocess.run(
        [sys.executable, "-m", "peakmem", "pack", "--gpus", "1xa100-40gb", "job.json", *args],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
        stdin=subprocess.DEVNULL)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert proc.stdout == ""
    assert message in proc.stderr and proc.stderr.count("\n") == 1


def test_job_log_that_is_a_fifo_nobody_reads_is_bad_input_not_a_hang(tmp_path):
    # os.open(FIFO, O_WRONLY) waited for a reader for ever, before the job started
    os.mkfifo(tmp_path / "log.fifo")
    (tmp_path / "train.py").write_text("print('hi')\n")
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    proc = subprocess.run(
        [sys.executable, "-m", "peakmem", "estimate", "--json", "--job-log", "log.fifo",
         "--", "python", "train.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
        stdin=subprocess.DEVNULL)
    assert proc.returncode == 2, (proc.stdout, proc.stderr[-2000:])
    error = json.loads(proc.stdout)["error"]
    assert error["kind"] == "bad_input" and "a FIFO that no process reads" in error["message"]


def test_job_log_fifo_with_a_reader_gets_the_job_output(tmp_path):
    from peakmem.jobs.job_log import open_job_log

    os.mkfifo(tmp_path / "log.fifo")
    reader = os.open(tmp_path / "log.fifo", os.O_RDONLY | os.O_NONBLOCK)
    try:
        fd = open_job_log(tmp_path / "log.fifo")
        os.write(fd, b"line\n")
        os.close(fd)
        assert os.read(reader, 100) == b"line\n"
    finally:
        os.close(reader)


# -- the supervisor's own process ---------------------------------------------------------------


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_DUMPABLE is Linux's")
def test_peakmem_is_not_dumpable_while_its_jobs_run(tmp_path):
    # a job of the same (non-root) user opened /proc/PEAKMEM/fd/1 and wrote into the JSON
    # stdout (`FORGED` before the estimate): a non-dumpable process's /proc files are closed
    import ctypes

    from peakmem.jobs.supervisor import ChildSpec, popen_child, run_child

    libc = ctypes.CDLL(None, use_errno=True)
    seen: list[int] = []

    def starter(spec, output_fd):
        seen.append(libc.prctl(3, 0, 0, 0, 0))  # PR_GET_DUMPABLE, as the job starts
        return popen_child(spec.argv, output_fd)

    before = libc.prctl(3, 0, 0, 0, 0)
    outcome = run_child(ChildSpec([sys.executable, "-c", "pass"], tmp_path / "result"),
                        starter=starter)
    assert outcome.ok
    assert seen == [0]
    assert libc.prctl(3, 0, 0, 0, 0) == before == 1


def test_a_bad_max_host_memory_names_its_own_flag(tmp_path):
    # the message named `--capacity`, a flag `peakmem estimate` does not have
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    proc = subprocess.run(
        [sys.executable, "-m", "peakmem", "estimate", "--json", "--max-host-memory", "1e308",
         "--", "python", "train.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
        stdin=subprocess.DEVNULL)
    assert proc.returncode == 2
    message = json.loads(proc.stdout)["error"]["message"]
    assert "--capacity" not in message and "--max-host-memory '1e308' is not a size" in message


def test_a_directory_given_as_the_script_says_so(tmp_path):
    from peakmem.jobs.runner import missing_script

    (tmp_path / "train.py").mkdir()
    # "script not found: .../train.py" while train.py was right there
    assert missing_script(str(tmp_path / "train.py")).endswith(
        "train.py (a directory without a __main__.py)")


def test_a_job_cannot_stop_the_warm_process_that_forked_it(tmp_path, monkeypatch):
    # the warm process took the job's os.kill(os.getppid(), SIGTERM) for a stop request and
    # exited: every later estimate started cold
    from peakmem.estimate import estimate_command
    from peakmem.jobs import zygote_client

    directory = tmp_path / "rt"
    directory.mkdir(mode=0o700)
    monkeypatch.setenv("PEAKMEM_RUNTIME_DIR", str(directory))
    monkeypatch.delenv("PEAKMEM_WARM", raising=False)
    started = zygote_client.start(idle_seconds=120)
    try:
        for name in ("signal_parent_SIGTERM.py", "signal_parent_SIGINT.py"):
            estimate = estimate_command(["python", str(CORPUS / name)], gpu="a100-40gb",
                                        timeout=60)
            assert estimate.peak_bytes > 0
            time.sleep(1.5)  # the server takes pending signals after each 1 s select
            status = zygote_client.status()
            assert status is not None and status["pid"] == started["pid"], name
        assert status["served"] == 2
    finally:
        zygote_client.stop()
