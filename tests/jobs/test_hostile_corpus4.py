"""A fourth adversarial corpus: hostile jobs (tests/data/hostile_scripts4) and hostile inputs
that test_hostile_corpus.py, _2.py and _3.py do not cover.

Each case names what went wrong before its fix.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
import tracemalloc
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from peakmem.service.files import FileLimits, FilesError, extract_archive

CORPUS = Path(__file__).resolve().parents[1] / "data" / "hostile_scripts4"
SRC = Path(__file__).resolve().parents[2] / "src"
PEAKMEM_DIR = str(SRC / "peakmem")
MiB = 2**20


# -- `peakmem serve` archives -----------------------------------------------------------------


def _tar_gz_with_huge_header(kind: bytes, size: int) -> bytes:
    """A .tar.gz whose first member is a GNU long-name or pax header of `size` bytes (which
    compresses ~1000:1), then an empty train.py."""
    header = tarfile.TarInfo("././@LongLink")
    header.type, header.size = kind, size
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", compresslevel=1) as gz:
        gz.write(header.tobuf(format=tarfile.GNU_FORMAT if kind == tarfile.GNUTYPE_LONGNAME
                              else tarfile.USTAR_FORMAT))
        block = b"a" * MiB
        for _ in range(-(-size // MiB)):
            gz.write(block)
        gz.write(tarfile.TarInfo("train.py").tobuf() + b"\0" * 1024)
    return buf.getvalue()


@pytest.mark.parametrize("kind", [tarfile.GNUTYPE_LONGNAME, tarfile.XHDTYPE],
                         ids=["gnu-long-name", "pax-header"])
def test_an_archive_header_that_decompresses_huge_is_refused_without_reading_it(kind):
    # tarfile reads a long-name / pax header whole: a 64 KB upload took 64 MB of the service's
    # memory (a 96 MB upload, the body limit, ~96 GB: the host ran out of memory)
    data = _tar_gz_with_huge_header(kind, 64 * MiB)
    assert len(data) < MiB
    limits = FileLimits(max_files=10, max_file_bytes=MiB, max_total_bytes=2 * MiB)
    tracemalloc.start()
    try:
        with pytest.raises(FilesError, match="decompresses to more than"):
            extract_archive(data, limits)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 * MiB


def test_a_compressed_archive_within_the_caps_still_extracts():
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:xz") as archive:
        for name, text in {"train.py": b"print(1)\n", "pkg/" + "n" * 200 + ".py": b"x = 1\n"}.items():
            info = tarfile.TarInfo(name)
            info.size = len(text)
            archive.addfile(info, io.BytesIO(text))
    files = extract_archive(buf.getvalue(), FileLimits(max_files=2, max_total_bytes=64))
    assert files == {"pkg/" + "n" * 200 + ".py": b"x = 1\n", "train.py": b"print(1)\n"}


# -- hostile jobs -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    script: str
    code: int
    reason: str | None = None
    args: tuple[str, ...] = ()
    message: str | None = None
    timeout: float = 60

    @property
    def id(self) -> str:
        return "-".join([self.script.removesuffix(".py"), *self.args])


CASES = [
    # an audit hook refusing "open" after training (harmless under python) broke peakmem's
    # result file: no_result (exit 1)
    Case("audit_hook_no_open.py", 0),
    # RLIMIT_NOFILE lowered for good (soft and hard) after training: no_result
    Case("rlimit_nofile_hard.py", 0),
    # closes peakmem's descriptors and opens its own files on their numbers: the result must
    # not land in the job's files (and still be delivered)
    Case("close_fds_then_open.py", 0),
    # torch.cuda's memory functions took any device argument (and the memory-history recorder
    # any option): an estimate of a job that fails on a GPU
    Case("memory_api_bad_args.py", 1, "raised", ("mem_get_info",),
         "RuntimeError: Invalid device argument -7"),
    Case("memory_api_bad_args.py", 1, "raised", ("memory_stats",),
         "ValueError: Expected a cuda device, but got: cpu"),
    Case("memory_api_bad_args.py", 1, "raised", ("record_history",),
         "RuntimeError: expected state to be 'state', 'all', or None"),
    # ... while every form of device a one-GPU job passes still works
    Case("memory_api_good_args.py", 0),
    # stopped itself: peakmem ran until --timeout (without one: for ever)
    Case("stop_self.py", 1, "signal", message="stopped itself", timeout=40),
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
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    argv = [sys.executable, "-m", "peakmem", "estimate", "--json", "--gpu", "a100-40gb",
            "--timeout", str(case.timeout), "--", "python", case.script, *case.args]
    started = time.monotonic()
    proc = subprocess.run(argv, cwd=workdir, env=env, capture_output=True, text=True,
                          errors="replace", timeout=case.timeout + 60, stdin=subprocess.DEVNULL)
    return Run(proc.returncode, proc.stdout, proc.stderr, time.monotonic() - started, workdir)


@pytest.fixture(scope="module")
def corpus_runs(tmp_path_factory) -> dict[str, Run]:
    root = tmp_path_factory.mktemp("hostile4")
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
    if case.code == 0:
        assert payload["peak_allocated_bytes"] > 0 and "error" not in payload
    else:
        assert payload["error"]["reason"] == case.reason
        assert "\n" not in payload["error"]["message"]
        assert case.message is None or case.message in payload["error"]["message"]
    for own in run.workdir.glob("mine*.txt"):
        assert own.read_text() == "the job's own file\n"


def _alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, killed and waiting for its reaper, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_job_that_sigkills_peakmem_does_not_outlive_it(tmp_path):
    # the job lived on, an orphan nobody supervised (a job that loops: for ever)
    shutil.copytree(CORPUS, tmp_path / "job")
    pid_file = tmp_path / "job.pid"
    env = {**os.environ, "PYTHONPATH": str(SRC), "PEAKMEM_WARM": "0"}
    argv = [sys.executable, "-m", "peakmem", "estimate", "--json", "--timeout", "90", "--",
            "python", "sigkill_parent.py", str(pid_file)]
    # output to files: a pipe would stay open as long as the job holds it
    with open(tmp_path / "out", "wb") as out, open(tmp_path / "err", "wb") as err:
        proc = subprocess.run(argv, cwd=tmp_path / "job", env=env, stdout=out, stderr=err,
                              timeout=120, stdin=subprocess.DEVNULL)
    assert proc.returncode == -9, (tmp_path / "err").read_text(errors="replace")[-2000:]
    job = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while _alive(job) and time.monotonic() < deadline:
        time.sleep(0.05)
    alive = _alive(job)
    if alive:
        os.kill(job, 9)
    assert not alive, "the job outlived peakmem"


# -- `peakmem pack` estimate files --------------------------------------------------------------


ESTIMATE = {"peak_bytes": 20 * 2**30, "peak_bytes_with_margin": 21 * 2**30, "fits": True,
            "gpu": "a100-40gb", "torch_version": "2.13.0", "stack": "torch-2.11",
            "margin_kind": "default", "safety_margin": 0.015}


@pytest.mark.parametrize("duplicate", ['"peak_bytes": 1', '"peak_bytes_with_margin": 1',
                                       '"gpu": "h100-80gb"'])
def test_an_estimate_naming_a_key_twice_is_refused(tmp_path, duplicate):
    # json keeps the last of two equal keys (other readers the first): the estimate was packed
    # with whichever came last, silently (a 21 GiB job as a 1-byte one)
    from click.testing import CliRunner

    from peakmem.cli.main import main

    text = json.dumps(ESTIMATE)
    (tmp_path / "job.json").write_text(text[:-1] + ", " + duplicate + "}")
    (tmp_path / "ok.json").write_text(text)
    refused = CliRunner().invoke(main, ["pack", "--gpus", "1xa100-40gb", "--json",
                                        str(tmp_path / "job.json"), str(tmp_path / "ok.json")])
    assert refused.exit_code == 2, refused.output
    message = json.loads(refused.stdout)["error"]["message"]
    assert "appears twice in one object" in message and "\n" not in message
    accepted = CliRunner().invoke(main, ["pack", "--gpus", "1xa100-40gb", "--json",
                                         str(tmp_path / "ok.json")])
    assert accepted.exit_code == 0, accepted.output
