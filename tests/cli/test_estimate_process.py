"""`peakmem estimate` runs the job in a supervised child: what the job sees, where its output
goes, paths it cannot move, error reporting, and concurrent runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from peakmem.cli.main import main

SRC = Path(__file__).resolve().parents[2] / "src"
SMALL = ["--in-features", "32", "--hidden", "64", "--depth", "2", "--batch-size", "16",
         "--samples", "64"]


def cli(cwd: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(SRC), "PEAKMEM_TEST_VAR": "seen"}
    return subprocess.run([sys.executable, "-m", "peakmem", "estimate", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def write(path: Path, code: str) -> Path:
    path.write_text(textwrap.dedent(code))
    return path


def test_the_job_sees_what_python_script_py_gives(tmp_path):
    jobdir = tmp_path / "job"
    jobdir.mkdir()
    probe = """
        import json, os, sys
        json.dump({"cwd": os.getcwd(), "argv": sys.argv, "path0": sys.path[0],
                   "var": os.environ.get("PEAKMEM_TEST_VAR"), "main": __name__,
                   "stdin": sys.stdin.read(), "file": __file__},
                  open(os.environ["PROBE_OUT"], "w"))
    """
    write(jobdir / "probe.py", probe)
    os.environ["PROBE_OUT"] = str(tmp_path / "under_peakmem.json")
    try:
        result = cli(tmp_path, "--json", "--", "python", "job/probe.py", "--lr", "3")
        assert result.returncode == 0, result.stderr
        env = {**os.environ, "PEAKMEM_TEST_VAR": "seen", "PROBE_OUT": str(tmp_path / "plain.json")}
        subprocess.run([sys.executable, "job/probe.py", "--lr", "3"], cwd=tmp_path, env=env,
                       check=True, stdin=subprocess.DEVNULL)
    finally:
        del os.environ["PROBE_OUT"]
    seen = json.loads((tmp_path / "under_peakmem.json").read_text())
    plain = json.loads((tmp_path / "plain.json").read_text())
    assert seen == plain
    assert seen["argv"] == ["job/probe.py", "--lr", "3"] and seen["var"] == "seen"


def test_job_log_and_timeline_stay_where_peakmem_was_started(tmp_path):
    write(tmp_path / "train.py", """
        import os, tempfile, torch
        print("JOB-PRINT")
        os.chdir(tempfile.mkdtemp())
        model = torch.nn.Linear(8, 8).cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model(torch.randn(2, 8, device="cuda")).sum().backward()
        opt.step()
    """)
    result = cli(tmp_path, "--json", "--gpu", "l4", "--timeline", "t.html", "--job-log", "job.log",
                 "--", "python", "train.py")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["steps"] == 1
    assert "<svg" in (tmp_path / "t.html").read_text()
    assert "JOB-PRINT" in (tmp_path / "job.log").read_text()
    assert "JOB-PRINT" not in result.stdout + result.stderr


def test_human_failure_is_the_job_traceback_then_one_line(tmp_path):
    write(tmp_path / "bad.py", """
        def load():
            raise ValueError("no such dataset")
        load()
    """)
    result = cli(tmp_path, "--", "python", "bad.py")
    assert result.returncode == 1 and result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert lines[-1] == "peakmem: error: the job raised ValueError: no such dataset"
    assert "ValueError: no such dataset" in lines[-2] and "in load" in result.stderr
    assert "src/peakmem" not in result.stderr


@pytest.mark.parametrize(
    "argv, code, reason",
    [
        (["python", "missing.py"], 2, "bad_input"),
        (["python", "-m", "no_such_module_for_peakmem"], 2, "bad_input"),
        (["python", "-c", "1"], 2, "bad_input"),
    ],
)
def test_bad_commands_are_json_errors(tmp_path, argv, code, reason):
    result = cli(tmp_path, "--json", "--", *argv)
    assert result.returncode == code, result.stderr
    error = json.loads(result.stdout)["error"]
    assert (error["kind"], error["exit_code"], error["reason"]) == ("bad_input", code, reason)


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "0", "abc", "-inf"])
def test_timeout_must_be_finite_and_positive(tmp_path, value):
    human = CliRunner().invoke(main, ["estimate", "--timeout", value, "--", "python", "x.py"])
    assert human.exit_code == 2 and "Traceback" not in human.output
    assert len(human.output.strip().splitlines()) == 1 and "--timeout" in human.output
    as_json = CliRunner().invoke(main, ["estimate", "--json", f"--timeout={value}", "--",
                                        "python", "x.py"])
    assert as_json.exit_code == 2
    assert json.loads(as_json.stdout)["error"]["kind"] == "bad_input"


@pytest.mark.parametrize("value, ok", [("8GiB", True), ("500MB", True), ("1048576", True),
                                       ("0", False), ("lots", False)])
def test_max_host_memory_sizes(value, ok):
    from peakmem.cli.estimate import _Bytes

    if ok:
        assert _Bytes().convert(value, None, None) > 0
    else:
        result = CliRunner().invoke(main, ["estimate", "--json", "--max-host-memory", value,
                                           "--", "python", "x.py"])
        assert result.exit_code == 2 and "error" in json.loads(result.stdout)


def test_a_bug_in_peakmem_is_an_internal_error(tmp_path, monkeypatch):
    import peakmem.estimate.api as api

    def broken(*args, **kwargs):
        raise KeyError("simulated peakmem bug")

    monkeypatch.setattr(api, "estimate_capture", broken)
    write(tmp_path / "ok.py", "x = 1\n")
    args = ["estimate", "--json", "--", "python", str(tmp_path / "ok.py")]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 70
    error = json.loads(result.stdout)["error"]
    assert error["kind"] == "internal" and error["message"].startswith("peakmem internal error")
    assert "estimate_capture" in error["traceback"] or "broken" in error["traceback"]
    human = CliRunner().invoke(main, args[:1] + args[2:])
    assert human.exit_code == 70
    assert human.output.strip().splitlines()[-1].startswith("peakmem internal error: KeyError")


def test_the_python_api_runs_commands_in_a_child(tmp_path):
    from peakmem.estimate import EstimateError, estimate_command

    write(tmp_path / "exit.py", "import os\nos._exit(4)\n")
    with pytest.raises(EstimateError) as info:
        estimate_command(["python", str(tmp_path / "exit.py")], gpu="l4", timeout=60)
    error = info.value
    assert (error.kind, error.reason, error.job_exit_code) == ("job_failed", "os_exit", 4)
    write(tmp_path / "spin.py", "while True:\n    pass\n")
    with pytest.raises(EstimateError) as info:
        estimate_command(["python", str(tmp_path / "spin.py")], gpu="l4", timeout=1)
    assert (info.value.exit_code, info.value.kind) == (124, "timeout")


def test_eight_concurrent_estimates_agree(tmp_path):
    def one(_):
        result = cli(tmp_path, "--json", "--gpu", "a100-40gb", "--", "python", "-m",
                     "peakmem.examples.mlp_train", *SMALL, timeout=300)
        assert result.returncode == 0, result.stderr
        payload = json.loads(result.stdout)
        return payload["peak_bytes"], payload["peak_allocated_bytes"], payload["steps"]

    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(one, range(8)))
    assert len(set(results)) == 1, results


def test_stopping_peakmem_stops_the_job(tmp_path):
    import signal
    import time

    pidfile = tmp_path / "pid"
    write(tmp_path / "spin.py", f"""
        import os, signal
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        open({str(pidfile)!r}, "w").write(str(os.getpid()))
        while True:
            pass
    """)
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    peakmem = subprocess.Popen([sys.executable, "-m", "peakmem", "estimate", "--json", "--",
                                "python", "spin.py"], cwd=tmp_path, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while not (pidfile.exists() and pidfile.read_text()) and time.monotonic() < deadline:
        time.sleep(0.1)
    job = int(pidfile.read_text())
    peakmem.send_signal(signal.SIGTERM)
    peakmem.communicate(timeout=15)
    assert peakmem.returncode != 0
    time.sleep(0.2)
    try:
        state = Path(f"/proc/{job}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        state = "gone"
    assert state in ("gone", "Z")


@click.command("boom")
def _boom_cmd() -> None:
    raise ZeroDivisionError("a bug in a peakmem command")


def test_any_command_maps_a_bug_to_exit_70(monkeypatch):
    from peakmem.cli import main as main_module

    monkeypatch.setitem(main_module.COMMANDS, "boom", f"{__name__}:_boom_cmd")
    result = CliRunner().invoke(main, ["boom"])
    assert result.exit_code == 70
    assert result.output.strip().splitlines()[-1] == (
        "peakmem internal error: ZeroDivisionError: a bug in a peakmem command")
    assert "test_estimate_process.py" in result.output  # peakmem's frames, shown as such


def test_a_job_log_that_cannot_be_opened_is_bad_input(tmp_path):
    write(tmp_path / "ok.py", "x = 1\n")
    result = cli(tmp_path, "--json", "--job-log", str(tmp_path / "no" / "such" / "log"), "--",
                 "python", "ok.py")
    assert result.returncode == 2
    error = json.loads(result.stdout)["error"]
    assert error["kind"] == "bad_input" and "job log" in error["message"]


@pytest.mark.parametrize("layout", ["spaces in name", "directory with __main__", "symlink"])
def test_scripts_python_can_run(tmp_path, layout):
    body = "import sys, os\nassert sys.argv[1:] == ['a b'], sys.argv\nprint(sys.path[0])\n"
    if layout == "spaces in name":
        target = write(tmp_path / "my train.py", body)
    elif layout == "directory with __main__":
        (tmp_path / "app").mkdir()
        write(tmp_path / "app" / "__main__.py", body)
        target = tmp_path / "app"
    else:
        real = write(tmp_path / "real.py", body)
        target = tmp_path / "link.py"
        target.symlink_to(real)
    result = cli(tmp_path, "--json", "--job-log", "log", "--", "python", str(target), "a b")
    assert result.returncode == 0, (result.stdout, result.stderr)
    plain = subprocess.run([sys.executable, str(target), "a b"], capture_output=True, text=True,
                           cwd=tmp_path, check=True)
    assert (tmp_path / "log").read_text() == plain.stdout


def test_a_timeline_in_a_missing_directory_is_refused_before_the_job_runs(tmp_path):
    write(tmp_path / "ok.py", "open('ran', 'w').write('yes')\n")
    result = cli(tmp_path, "--json", "--timeline", "no/such/t.html", "--", "python", "ok.py")
    assert result.returncode == 2 and json.loads(result.stdout)["error"]["kind"] == "bad_input"
    assert not (tmp_path / "ran").exists()
