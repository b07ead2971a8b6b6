"""A fifth adversarial corpus: hostile jobs (tests/data/hostile_scripts5) and hostile inputs
that test_hostile_corpus.py, _2.py, _3.py and _4.py do not cover.

Each case names what went wrong before its fix.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from peakmem.jobs.host_memory import (
    DEFAULT_FRACTION,
    HostMemorySettingError,
    default_max_host_memory,
    machine_memory_bytes,
)

CORPUS = Path(__file__).resolve().parents[1] / "data" / "hostile_scripts5"
SRC = Path(__file__).resolve().parents[2] / "src"
PEAKMEM_DIR = str(SRC / "peakmem")


# -- hostile jobs -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    script: str
    code: int
    reason: str | None = None
    args: tuple[str, ...] = ()
    message: str | None = None
    timeout: float = 60
    env: tuple[tuple[str, str], ...] = ()
    stderr: str | None = None

    @property
    def id(self) -> str:
        return "-".join([self.script.removesuffix(".py"), *self.args])


CASES = [
    # RLIMIT_FSIZE lowered to 0 for good (soft and hard) after training: every write() to a
    # file fails (EFBIG), the result's too: no_result for a job python runs to its end
    Case("rlimit_fsize_hard_zero.py", 0),
    # no --max-host-memory: no cap at all, a job allocating 50 GiB took the machine (the
    # default is a share of the machine's memory; PEAKMEM_MAX_HOST_MEMORY sets it, as here)
    Case("host_memory_hog.py", 1, "host_memory", message="went over",
         env=(("PEAKMEM_MAX_HOST_MEMORY", "600MB"),)),
    # an atexit handler that never returns: the capture was over, peakmem waited until
    # --timeout (exit 124; without one, for ever)
    Case("atexit_hangs.py", 0, env=(("PEAKMEM_ATEXIT_SECONDS", "3"),),
         stderr="never_returns at 0x"),
    # blocks peakmem's modules in sys.modules after training (harmless under python):
    # peakmem's own imports after the job failed, no_result
    Case("purge_peakmem_modules.py", 0, args=("block",)),
    # writes a line to every descriptor it has: peakmem's result file moved on, the result
    # landed after the job's line: bad_result
    Case("write_every_fd.py", 0),
]


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str
    seconds: float
    workdir: Path


def _run_case(case: Case, root: Path) -> Run:
    workdir = root / case.id
    shutil.copytree(CORPUS, workdir)
    env = {**os.environ, "PYTHONPATH": str(SRC), "PEAKMEM_WARM": "0", **dict(case.env)}
    argv = [sys.executable, "-m", "peakmem", "estimate", "--json", "--gpu", "a100-40gb",
            "--timeout", str(case.timeout), "--", "python", case.script, *case.args]
    started = time.monotonic()
    # output to files: a pipe would stay open as long as a process of the job holds it
    with open(workdir / ".out", "wb") as out, open(workdir / ".err", "wb") as err:
        proc = subprocess.run(argv, cwd=workdir, env=env, stdout=out, stderr=err,
                              timeout=case.timeout + 60, stdin=subprocess.DEVNULL)
    return Run(proc.returncode, (workdir / ".out").read_text(errors="replace"),
               (workdir / ".err").read_text(errors="replace"), time.monotonic() - started,
               workdir)


@pytest.fixture(scope="module")
def corpus_runs(tmp_path_factory) -> dict[str, Run]:
    root = tmp_path_factory.mktemp("hostile5")
    with ThreadPoolExecutor(max_workers=max(1, min(3, os.cpu_count() or 1))) as pool:
        futures = {case.id: pool.submit(_run_case, case, root) for case in CASES}
        return {name: future.result() for name, future in futures.items()}


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.id)
def test_hostile_job(case: Case, corpus_runs: dict[str, Run]):
    run = corpus_runs[case.id]
    assert run.returncode == case.code, (run.stdout, run.stderr[-3000:])
    assert run.stdout.strip().count("\n") == 0
    payload = json.loads(run.stdout)
    assert not [line for line in run.stderr.splitlines()
                if line.strip().startswith("File ") and PEAKMEM_DIR in line], run.stderr[-3000:]
    assert run.seconds < case.timeout, run.stderr[-3000:]
    assert case.stderr is None or case.stderr in run.stderr, run.stderr[-3000:]
    if case.code == 0:
        assert payload["peak_allocated_bytes"] > 0 and "error" not in payload
    else:
        assert payload["error"]["reason"] == case.reason
        assert "\n" not in payload["error"]["message"]
        assert case.message is None or case.message in payload["error"]["message"]


# -- the default host-memory cap --------------------------------------------------------------


def test_the_default_host_memory_cap_is_a_share_of_the_machines_memory(tmp_path):
    total = machine_memory_bytes()
    assert total is not None and total > 2**28
    assert default_max_host_memory({}) == int(total * DEFAULT_FRACTION)
    assert default_max_host_memory({"PEAKMEM_MAX_HOST_MEMORY": "1.5GiB"}) == 3 * 2**29
    assert default_max_host_memory({"PEAKMEM_MAX_HOST_MEMORY": "off"}) is None
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       8000000 kB\nMemFree:  1 kB\n")
    limit = tmp_path / "memory.max"
    limit.write_text("2147483648\n")  # a container's cgroup limit, below MemTotal
    assert machine_memory_bytes(meminfo, (str(limit),)) == 2**31
    limit.write_text("max\n")
    assert machine_memory_bytes(meminfo, (str(limit),)) == 8000000 * 1024


@pytest.mark.parametrize("setting", ["garbage", "-1GB", "nan", "0", "9" * 80])
def test_a_garbage_host_memory_setting_is_refused(setting):
    with pytest.raises(HostMemorySettingError, match="PEAKMEM_MAX_HOST_MEMORY"):
        default_max_host_memory({"PEAKMEM_MAX_HOST_MEMORY": setting})


def test_a_garbage_host_memory_setting_is_one_bad_input_line(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from peakmem.cli.main import main

    (tmp_path / "train.py").write_text("print('never run')\n")
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["estimate", "--json", "--", "python", "train.py"],
                                env={"PEAKMEM_MAX_HOST_MEMORY": "lots", "PEAKMEM_WARM": "0"})
    assert result.exit_code == 2, result.output
    error = json.loads(result.stdout)["error"]
    assert error["reason"] == "bad_input" and "PEAKMEM_MAX_HOST_MEMORY='lots'" in error["message"]


# -- the warm job process (`peakmem warm`) ----------------------------------------------------


def _alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, killed and waiting for its reaper, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def _gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if _alive(pid):
        os.kill(pid, signal.SIGKILL)
        return False
    return True


def _read_pid(path: Path, seconds: float = 60) -> int:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError):
            return int(path.read_text())
        time.sleep(0.05)
    raise AssertionError(f"no pid in {path}")


@pytest.fixture(scope="module")
def warm_env(tmp_path_factory):
    """A warm process (nothing preloaded) in a private runtime directory; the environment of
    an estimate that uses it."""
    from peakmem.jobs import zygote_client

    directory = tmp_path_factory.mktemp("runtime5")
    directory.chmod(0o700)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PEAKMEM_RUNTIME_DIR", str(directory))
        patch.delenv("PEAKMEM_WARM", raising=False)
        patch.setenv("PYTHONPATH", str(SRC))
        info = zygote_client.start(idle_seconds=300)
        env = {**os.environ}
        env.pop("PEAKMEM_WARM", None)
        yield env, info["pid"]
        with contextlib.suppress(Exception):
            zygote_client.stop()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="subreapers are Linux's")
def test_a_warm_jobs_stopped_orphan_grandchild_does_not_outlive_it(warm_env, tmp_path):
    # the orphan was reparented to init: nobody ended it (stopped, it waited for ever)
    env, _ = warm_env
    shutil.copytree(CORPUS, tmp_path / "job")
    pid_file = tmp_path / "grandchild.pid"
    argv = [sys.executable, "-m", "peakmem", "estimate", "--json", "--timeout", "60", "--",
            "python", "stopped_grandchild.py", str(pid_file)]
    proc = subprocess.run(argv, cwd=tmp_path / "job", env=env, capture_output=True, text=True,
                          timeout=120, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert any("warm job process" in note for note in json.loads(proc.stdout)["notes"])
    assert _gone_within(_read_pid(pid_file), 5), "the stopped grandchild outlived the job"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_warm_job_does_not_outlive_the_warm_process(warm_env, tmp_path):
    # (after the test above: this one kills the warm process) the job forked by a warm process
    # killed with kill -9 lived on while its requester could not end it
    env, warm_pid = warm_env
    shutil.copytree(CORPUS, tmp_path / "job")
    pid_file = tmp_path / "job.pid"
    argv = [sys.executable, "-m", "peakmem", "estimate", "--json", "--timeout", "90", "--",
            "python", "pid_then_sleep.py", str(pid_file)]
    with open(tmp_path / "out", "wb") as out, open(tmp_path / "err", "wb") as err:
        requester = subprocess.Popen(argv, cwd=tmp_path / "job", env=env, stdout=out,
                                     stderr=err, stdin=subprocess.DEVNULL)
    try:
        job = _read_pid(pid_file)
        requester.send_signal(signal.SIGSTOP)  # it would end the job itself: out of the way
        os.kill(warm_pid, signal.SIGKILL)
        assert _gone_within(job, 5), "the warm process's job outlived it"
    finally:
        requester.kill()
        requester.wait()


# -- garbage in the variables peakmem reads ----------------------------------------------------

VISIBLE_DEVICES = ["abc", "x,0", "0,0", "GPU-a,GPU-a", "", "-1", "0", "1gpu2,2ampere",
                   "0,abc", "GPU-a,GPU-b", "MIG-x,abc", "+2", " 1 , 2 "]


@pytest.mark.parametrize("value", VISIBLE_DEVICES)
def test_visible_devices_are_read_as_torch_reads_them(value, monkeypatch):
    # `CUDA_VISIBLE_DEVICES=abc python train.py` (and `x,0`, `0,0`: no GPU for torch either)
    # was estimated as a GPU job: on the GPU machine it runs on the CPU or fails
    import torch.cuda

    from peakmem.jobs.launchers import LaunchError, parse_launch, visible_devices

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", value)
    assert visible_devices(value) == torch.cuda._parse_visible_devices()
    argv = [f"CUDA_VISIBLE_DEVICES={value}", "python", "t.py"]
    if visible_devices(value):
        assert parse_launch(argv).env == {"CUDA_VISIBLE_DEVICES": value}
    else:
        with pytest.raises(LaunchError, match="hides every GPU"):
            parse_launch(argv)


# -- command-line arguments: NUL bytes, names too long for the file system -------------------

NUL = "x\0y"


@pytest.mark.parametrize("args", [
    ["estimate", "--json", "--job-log", NUL, "--", "python", "train.py"],
    ["estimate", "--json", "--", "python", NUL],
    ["estimate", "--json", "--", "python", "a" * 1_000_000],
    ["estimate", "--json", "--", "python", "a/" * 100_000],
    ["pack", "--gpus", "1xa100-40gb", "--json", NUL],
    ["simulate", "--json", NUL],
], ids=["job-log-nul", "script-nul", "script-1MB", "script-deep", "pack-nul", "simulate-nul"])
def test_hostile_arguments_are_one_bad_input_line(args, tmp_path, monkeypatch):
    # a NUL byte: ValueError from open() deep in the command (exit 70, a traceback); a 1 MB
    # script name: OSError ENAMETOOLONG from Path.is_file (exit 70, the name in the traceback)
    from click.testing import CliRunner

    from peakmem.cli.main import main

    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, args, env={"PEAKMEM_WARM": "0"})
    assert result.exit_code == 2, result.output[-2000:]
    assert "Traceback" not in result.output
    error = json.loads(result.stdout.strip().splitlines()[-1])["error"]
    assert error["kind"] == "bad_input" and len(error["message"]) <= 2000
    assert "\n" not in error["message"] and error["traceback"] is None


# -- `peakmem pack` with very many jobs ---------------------------------------------------------

ESTIMATE = {"peak_bytes": 2**30, "peak_bytes_with_margin": 2**30, "fits": True,
            "gpu": "a100-40gb", "torch_version": "2.13.0", "stack": "torch-2.11",
            "margin_kind": "default", "safety_margin": 0.015}


def test_pack_of_100k_jobs_is_bounded_in_time():
    # each job looked at every bin in use: --what-if has as many bins as jobs, so 100k jobs on
    # one GPU type took ~4 min (first-fit) to ~6 min (best-fit), quadratic from 1.6 s and 2.4 s
    # at 8k jobs (and --what-if tries every known type); now a bin is found in O(log bins)
    from peakmem.schedule.jobs import job_from_estimate
    from peakmem.schedule.pack import what_if

    jobs = []
    for index in range(100_000):
        peak = (1 + index % 37) * 2**28
        jobs.append(job_from_estimate(f"job{index}", {**ESTIMATE, "peak_bytes": peak,
                                                      "peak_bytes_with_margin": peak + peak // 20}))
    for policy in ("first-fit", "best-fit-decreasing"):
        started = time.monotonic()
        answer = what_if(jobs, ["a100-40gb"], policy)[0]
        assert time.monotonic() - started < 30, policy
        # 497 GiB per 1,000 jobs (+5%): at least 12,570 A100-40GBs (39.6 GiB each)
        assert answer.count is not None and 12_570 <= answer.count < 14_000, answer.count
    few = what_if(jobs[:74], ["a100-40gb"])[0]  # 369 GiB: 10 GPUs, best-fit-decreasing
    assert few.count == 10 and not few.rejected


def test_many_estimate_files_load_in_linear_time(tmp_path):
    # each file's name was counted among all of them (list.count): 20k paths ~25 s, 100k
    # ~15 min before the first job was placed
    from peakmem.schedule.jobs import load_estimate_files

    path = tmp_path / "job.json"
    path.write_text(json.dumps(ESTIMATE))
    started = time.monotonic()
    jobs = load_estimate_files([str(path)] * 20_000)
    assert time.monotonic() - started < 15
    assert len(jobs) == 20_000 and jobs[0].name == str(path)  # a shared name: the path


# -- a job that floods its output ---------------------------------------------------------------


def test_the_service_keeps_no_file_of_a_jobs_output(tmp_path):
    # the service and batch workers sent the job's output to a job.log nobody reads: a job
    # printing 10 GB filled the disk until its attempt ended
    from peakmem.service.attempt import run_attempt
    from peakmem.service.estimators import cli_estimator
    from peakmem.service.jobs import EstimateJob

    files = {name: (CORPUS / name).read_bytes() for name in ("_train.py", "stdout_flood.py")}
    job = EstimateJob(command=("python", "stdout_flood.py"), files=files, gpu="a100-40gb",
                      options={"timeout": 60})
    result = run_attempt(job, cli_estimator, max_seconds=60, workdir_base=str(tmp_path))
    assert result["peak_allocated_bytes"] > 0, result


def test_fit_keeps_no_file_of_a_jobs_output(monkeypatch, tmp_path):
    # `peakmem fit` without --job-log wrote every estimate's output to a scratch file in /tmp
    import importlib

    from click.testing import CliRunner

    from peakmem.cli.main import main

    seen = []
    search = importlib.import_module("peakmem.estimate.fit_search")
    monkeypatch.setattr(search, "fit_command",
                        lambda *args, **kwargs: seen.append(kwargs["job_log"]) or [])
    (tmp_path / "train.py").write_text("print(1)\n")
    monkeypatch.chdir(tmp_path)
    CliRunner().invoke(main, ["fit", "--json", "--gpu", "a100-40gb", "--arg", "bs=1..8",
                              "--", "python", "train.py", "--bs", "{bs}"])
    assert seen == [os.devnull]


# -- `peakmem fit` ranges -----------------------------------------------------------------------


@pytest.mark.parametrize("spec, says", [
    ("bs=1.." + "9" * 100, "HIGH must be at most 9223372036854775807"),
    ("bs=1..9223372036854775808", "HIGH must be at most"),
    ("b" * 100_000 + "=1..2", "is not NAME=LOW..HIGH"),
])
def test_a_fit_range_no_job_can_take_is_refused_in_one_short_line(spec, says):
    # HIGH = 10**100 was searched (hundreds of estimates of values no tensor dimension can
    # take); a 100 kB --arg was echoed whole in the message
    from peakmem.estimate.fit_search import FitSpecError, parse_arg_range

    with pytest.raises(FitSpecError, match=says) as refused:
        parse_arg_range(spec)
    assert len(str(refused.value)) < 300 and "\n" not in str(refused.value)
    assert parse_arg_range("bs=1..9223372036854775807").high == 2**63 - 1


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="rlimits and mmap as on Linux")
@pytest.mark.parametrize("start_limit", ["unlimited", "1MiB"])
def test_the_result_is_written_after_the_hard_file_size_limit_went_to_zero(tmp_path, start_limit):
    # every write() to a file failed (EFBIG): no result. Under a small limit from the start, the
    # room made before the job stays within it (no EFBIG there either)
    code = f"""
import os, resource, sys
from peakmem.jobs.child import ResultWriter
if {start_limit!r} != "unlimited":
    resource.setrlimit(resource.RLIMIT_FSIZE, (2**20, resource.RLIM_INFINITY))
writer = ResultWriter(sys.argv[1])
resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))  # the job, for good
assert writer.write(b"r" * 100_000)
"""
    result = tmp_path / "result.bin"
    done = subprocess.run([sys.executable, "-c", code, str(result)], capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(SRC)}, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert result.read_bytes() == b"r" * 100_000
    assert [p.name for p in tmp_path.iterdir()] == ["result.bin"]


# -- absurd sizes --------------------------------------------------------------------------------


def test_an_allocation_past_ssize_t_is_the_jobs_overflow_error():
    # torch.cuda.caching_allocator_alloc(2**70) (torch takes a C ssize_t: OverflowError on a
    # GPU) was recorded; the job's result was then refused as malformed (bad_result)
    from peakmem.trace.events import Trace

    trace = Trace()
    with pytest.raises(OverflowError, match="too large to convert to C ssize_t"):
        trace.alloc(2**70)
    with pytest.raises(ValueError, match="must be >= 0"):
        trace.alloc(-1)
    assert trace.alloc(2**63 - 1) == 0 and len(trace) == 1  # the largest that CUDA could take


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc")
def test_the_warm_process_ends_only_its_own_descendants():
    # a job's leftover is remembered by pid: one that ended and whose pid was reused by another
    # user's process before the job ended must not be killed with the job
    from peakmem.jobs.zygote_leftovers import Leftovers

    out = subprocess.run(["sh", "-c", "sleep 30 >/dev/null 2>&1 & echo $!"], capture_output=True,
                         text=True, timeout=30).stdout  # the sleep's parent exits: not ours
    stranger = int(out.split()[0])
    own = subprocess.Popen(["sleep", "30"])
    try:
        leftovers = Leftovers(owner={stranger: 4242, own.pid: 4242})
        assert leftovers.end(4242, running=()) == [own.pid]
        assert own.wait(timeout=10) == -signal.SIGKILL
        assert _alive(stranger)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(stranger, signal.SIGKILL)
        own.kill()
        own.wait()
