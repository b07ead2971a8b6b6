"""The warm job process (`peakmem warm`): a job forked from it gives the cold job's estimate to
the byte; an absent, stale or mismatched warm process falls back to a cold start; --status /
--stop; the idle exit; supervision (timeout) of a warm child."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import sys
import textwrap
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from peakmem.cli.main import main as cli
from peakmem.estimate import EstimateError, estimate_command
from peakmem.jobs import zygote_client
from peakmem.jobs.zygote import identity, identity_difference
from peakmem.jobs.zygote_server import RuntimeDirError, runtime_dir, socket_path

ZOO = Path(__file__).resolve().parents[2] / "benchmarks" / "zoo"
MLP = ["python", str(ZOO / "mlp.py"), "--input-size", "64", "--hidden-size", "128", "--depth",
       "2", "--num-classes", "10", "--batch-size", "8"]
GPT2_TINY = ["python", str(ZOO / "transformers_lm.py"), "--model", "gpt2", "--num-layers", "2",
             "--hidden-size", "128", "--num-heads", "4", "--batch-size", "2", "--seq-len", "64",
             "--optimizer", "adamw"]
GPT2_MODULE = "transformers.models.gpt2.modeling_gpt2"


def digest(estimate) -> str:
    trace = estimate.capture.trace
    hasher = hashlib.sha1()
    for column in (trace.kinds, trace.ids, trace.sizes, trace.streams):
        hasher.update(json.dumps(column).encode())
    hasher.update(json.dumps([None if t is None else t.to_json()
                              for t in map(trace.tag_of, range(len(trace)))]).encode())
    return hasher.hexdigest()


def comparable(estimate) -> tuple[str, str]:
    """The estimate's JSON without its timing and the warm/cold note, and its trace digest."""
    data = estimate.to_json()
    data.pop("seconds", None)
    data["notes"] = [n for n in data.get("notes", []) if "warm job process" not in n]
    return json.dumps(data, sort_keys=True, default=str), digest(estimate)


@pytest.fixture(scope="module")
def warm_dir(tmp_path_factory):
    """A private runtime directory with a warm process (nothing preloaded) in it."""
    directory = tmp_path_factory.mktemp("runtime")
    directory.chmod(0o700)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PEAKMEM_RUNTIME_DIR", str(directory))
        patch.delenv("PEAKMEM_WARM", raising=False)
        zygote_client.start(idle_seconds=600)
        yield directory
        zygote_client.stop()


@pytest.fixture(scope="module")
def cold_mlp(tmp_path_factory):
    """The MLP's estimate started where no warm process runs (an empty private runtime
    directory, the warm path on): the cold reference, made once for the tests that compare."""
    directory = tmp_path_factory.mktemp("runtime_empty")
    directory.chmod(0o700)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PEAKMEM_RUNTIME_DIR", str(directory))
        patch.delenv("PEAKMEM_WARM", raising=False)
        return estimate_command(MLP, gpu="a100-40gb")


@pytest.fixture
def warm(warm_dir, monkeypatch):
    monkeypatch.setenv("PEAKMEM_RUNTIME_DIR", str(warm_dir))
    monkeypatch.delenv("PEAKMEM_WARM", raising=False)
    return warm_dir


def cold(argv, monkeypatch, **kwargs):
    with monkeypatch.context() as patch:
        patch.setenv("PEAKMEM_WARM", "0")
        return estimate_command(argv, gpu="a100-40gb", **kwargs)


def assert_warm_equals_cold(argv, monkeypatch, reference=None):
    served = zygote_client.status()["served"]
    hot = estimate_command(argv, gpu="a100-40gb")
    assert zygote_client.WARM_NOTE in hot.notes
    assert zygote_client.status()["served"] == served + 1
    reference = cold(argv, monkeypatch) if reference is None else reference
    assert not any("warm job process" in note for note in reference.notes)
    assert hot.peak_bytes == reference.peak_bytes
    assert comparable(hot) == comparable(reference)


def test_a_warm_start_gives_the_cold_estimate_to_the_byte(warm, monkeypatch, cold_mlp):
    assert_warm_equals_cold(MLP, monkeypatch, cold_mlp)


def test_with_gpt2_preloaded_a_gpt2_job_is_the_same_and_others_run_cold(tmp_path, monkeypatch):
    directory = tmp_path / "rt"
    directory.mkdir(mode=0o700)
    monkeypatch.setenv("PEAKMEM_RUNTIME_DIR", str(directory))
    monkeypatch.delenv("PEAKMEM_WARM", raising=False)
    info = zygote_client.start([GPT2_MODULE], idle_seconds=600)
    try:
        assert info["preload"] == [GPT2_MODULE] and info["preload_errors"] == []
        assert_warm_equals_cold(GPT2_TINY, monkeypatch)
        # the MLP job does not import transformers: forked from this process it would run with
        # transformers (and torchvision) already loaded; it starts cold and says why
        other = estimate_command(MLP, gpu="a100-40gb")
        notes = [n for n in other.notes if "warm job process" in n]
        assert len(notes) == 1 and "which the job does not import" in notes[0]
        assert zygote_client.status()["served"] == 1
    finally:
        zygote_client.stop()


def test_the_warm_child_is_supervised_like_a_cold_one(warm, tmp_path):
    script = tmp_path / "sleeper.py"
    script.write_text("import os, time\nprint(os.getcwd(), os.environ['MARK'])\ntime.sleep(60)\n")
    log = tmp_path / "job.log"
    os.environ["MARK"] = "from-the-requester"
    try:
        started = time.monotonic()
        with pytest.raises(EstimateError) as failure:
            # 8 s: time for the child to reach its print on a loaded 2-core machine (3 s was not)
            estimate_command(["python", str(script)], timeout=8, job_log=log)
    finally:
        del os.environ["MARK"]
    assert failure.value.reason == "timeout"
    assert time.monotonic() - started < 40
    assert log.read_text().split() == [os.getcwd(), "from-the-requester"]
    assert zygote_client.status()["running_jobs"] == 0


def test_a_stale_socket_falls_back_to_a_cold_start(tmp_path, monkeypatch, cold_mlp):
    directory = tmp_path / "rt"
    directory.mkdir(mode=0o700)
    monkeypatch.setenv("PEAKMEM_RUNTIME_DIR", str(directory))
    monkeypatch.delenv("PEAKMEM_WARM", raising=False)
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(str(socket_path(directory)))
    dead.close()  # the file stays, nobody listens
    estimate = estimate_command(MLP, gpu="a100-40gb")
    notes = [n for n in estimate.notes if "warm job process" in n]
    assert len(notes) == 1 and "started cold" in notes[0]
    assert comparable(estimate) == comparable(cold_mlp)


def test_no_warm_process_is_a_plain_cold_start(tmp_path, monkeypatch, cold_mlp):
    directory = tmp_path / "rt"
    directory.mkdir(mode=0o700)
    monkeypatch.setenv("PEAKMEM_RUNTIME_DIR", str(directory))
    monkeypatch.delenv("PEAKMEM_WARM", raising=False)
    assert zygote_client.warm_starter() is None
    # cold_mlp ran in such a directory: a plain cold start, no note about a warm process
    assert not any("warm job process" in n for n in cold_mlp.notes)
    assert cold_mlp.peak_bytes > 0


def test_a_different_startup_environment_is_refused_and_runs_cold(warm, monkeypatch):
    monkeypatch.setenv("PYTORCH_NO_SUCH_SETTING", "1")
    served = zygote_client.status()["served"]
    estimate = estimate_command(MLP, gpu="a100-40gb")
    notes = [n for n in estimate.notes if "warm job process" in n]
    assert len(notes) == 1 and "PYTORCH_NO_SUCH_SETTING" in notes[0]
    assert "started cold" in notes[0]
    assert zygote_client.status()["served"] == served


def test_identity_differences_are_named():
    mine = identity({"PYTHONPATH": "/a", "HOME": "/root"})
    assert identity_difference(mine, identity({"PYTHONPATH": "/a", "HOME": "/elsewhere"})) is None
    assert "PYTHONPATH" in identity_difference(mine, identity({"PYTHONPATH": "/b"}))
    assert identity_difference(mine, {**mine, "python": "/usr/bin/python9"}) == "a different python"
    changed = {**mine, "fingerprint": "0"}
    assert "source" in identity_difference(mine, changed)


def test_the_warm_process_refuses_commands_that_are_not_a_job_process(warm, tmp_path):
    path = socket_path(warm)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock, open(os.devnull, "wb") as out:
        sock.connect(str(path))
        message = {"op": "run", "argv": [sys.executable, "-c", "print(1)", "x"],
                   "cwd": str(tmp_path), "env": dict(os.environ), "umask": 0o22,
                   "identity": identity()}
        socket.send_fds(sock, [json.dumps(message).encode() + b"\n"], [out.fileno()])
        answer = json.loads(sock.makefile().readline())
    assert "error" in answer and "not a peakmem job process" in answer["error"]


def test_runtime_dir_must_be_private(tmp_path, monkeypatch):
    directory = tmp_path / "open"
    directory.mkdir(mode=0o755)
    directory.chmod(0o755)
    monkeypatch.setenv("PEAKMEM_RUNTIME_DIR", str(directory))
    with pytest.raises(RuntimeDirError):
        runtime_dir()
    assert zygote_client.find_socket() is None


def test_status_stop_and_idle_exit(tmp_path, monkeypatch):
    directory = tmp_path / "rt"
    directory.mkdir(mode=0o700)
    monkeypatch.setenv("PEAKMEM_RUNTIME_DIR", str(directory))
    runner = CliRunner()
    result = runner.invoke(cli, ["warm", "--status"])
    assert result.exit_code == 1 and "no warm job process" in result.output
    result = runner.invoke(cli, ["warm", "--idle", "600", "--json"])
    assert result.exit_code == 0, result.output
    started = json.loads(result.output)
    assert started["running"] and started["idle_seconds"] == 600
    assert oct(os.stat(started["socket"]).st_mode & 0o777) == "0o600"
    result = runner.invoke(cli, ["warm", "--status", "--json"])
    assert result.exit_code == 0 and json.loads(result.output)["pid"] == started["pid"]
    result = runner.invoke(cli, ["warm"])
    assert result.exit_code == 0 and "already running" in result.output
    began = time.monotonic()
    with pytest.raises(RuntimeError, match="already serves"):
        zygote_client.start()  # a second warm process fails at once, the first one stays
    assert time.monotonic() - began < 30
    assert zygote_client.status()["pid"] == started["pid"]
    result = runner.invoke(cli, ["warm", "--stop"])
    assert result.exit_code == 0 and "stopped" in result.output
    assert not Path(started["socket"]).exists()
    assert runner.invoke(cli, ["warm", "--status"]).exit_code == 1

    info = zygote_client.start(idle_seconds=1)
    deadline = time.monotonic() + 30
    while Path(info["socket"]).exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not Path(info["socket"]).exists()
    assert zygote_client.status() is None


def test_a_job_that_reads_its_cwd_and_argv_sees_what_a_cold_one_sees(warm, tmp_path,
                                                                    monkeypatch):
    script = tmp_path / "where.py"
    script.write_text(textwrap.dedent("""
        import json, os, sys, tempfile, time
        print(json.dumps({"argv": sys.argv, "path0": sys.path[0], "cwd": os.getcwd(),
                          "main": __name__, "umask": os.umask(0),
                          "tmp": tempfile.gettempdir(), "tz": time.tzname}))
    """))
    monkeypatch.chdir(tmp_path)
    # the job's own TMPDIR and TZ, not the warm process's (read when it started)
    (tmp_path / "job-tmp").mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp_path / "job-tmp"))
    monkeypatch.setenv("TZ", "Asia/Kolkata" if time.tzname[0] != "IST" else "UTC")
    seen = []
    for warm_flag in ("1", "0"):
        monkeypatch.setenv("PEAKMEM_WARM", warm_flag)
        log = tmp_path / f"log{warm_flag}"
        result = estimate_command(["python", str(script), "a b"], gpu="a100-40gb", job_log=log,
                                  steps="all")
        assert (zygote_client.WARM_NOTE in result.notes) == (warm_flag == "1")
        seen.append(log.read_text().strip().splitlines()[-1])
    assert seen[0] == seen[1]
    assert json.loads(seen[0])["tmp"] == str(tmp_path / "job-tmp")
