"""An environment prefix (`env NAME=VALUE python t.py`, `NAME=VALUE python t.py`) is taken off in
the launch parsing layer (jobs.launchers.parse_launch), so every front end honours it the same
way: the Python API, `peakmem estimate` / `fit`, `peakmem batch` and the service."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from peakmem.estimate import EstimateError, estimate_command
from peakmem.estimate.fit_search import ArgRange, fit_command
from peakmem.jobs.launchers import LaunchError, job_command, parse_launch
from peakmem.service.jobs import EstimateJob, job_problem

SRC = Path(__file__).resolve().parents[2] / "src"
MIB = 2**20

JOB = """\
import os, torch
x = torch.empty(int(os.environ['MIB']) * 2**18, device='cuda')
print('conf', os.environ.get('PYTORCH_CUDA_ALLOC_CONF'))
"""


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "job.py"
    path.write_text(JOB)
    return path


def test_parse_launch_takes_the_prefix_off():
    plain = parse_launch(["env", "A=1", "python", "t.py"])
    assert plain is not None and not plain.distributed
    assert plain.command == ("python", "t.py") and dict(plain.env) == {"A": "1"}
    shell = parse_launch(["A=1", "B=x=y", "python", "-m", "pkg", "--lr=1"])
    assert shell.command == ("python", "-m", "pkg", "--lr=1")
    assert dict(shell.env) == {"A": "1", "B": "x=y"}
    assert parse_launch(["python", "t.py", "A=1"]) is None  # an argument, not a prefix
    ranked = parse_launch(["OMP_NUM_THREADS=1", "torchrun", "--nproc-per-node", "2", "t.py"])
    assert ranked.distributed and ranked.world_size == 2
    assert ranked.rank_env(1)["OMP_NUM_THREADS"] == "1" and ranked.rank_env(1)["RANK"] == "1"
    for flags in (["-W", "ignore"], ["-Xutf8", "-u"], ["-Wignore::DeprecationWarning"]):
        launched = parse_launch(["python", *flags, "-m", "torch.distributed.run",
                                 "--nproc-per-node", "2", "t.py"])
        assert launched.world_size == 2 and launched.command == ("python", "t.py")
    forced = parse_launch(["env", "A=2", "python", "t.py"], nproc_per_node=4)
    assert forced.world_size == 4 and forced.rank_env(3)["A"] == "2"
    assert job_command(["A=1", "torchrun", "--standalone", "t.py", "--x"]) == (
        ("python", "t.py", "--x"), {"A": "1"})
    with pytest.raises(LaunchError, match="unsupported env option '-i'"):
        parse_launch(["env", "-i", "python", "t.py"])
    with pytest.raises(LaunchError, match="no command after the variables"):
        parse_launch(["A=1"])
    for hidden in ("", "-1", " -1,0"):
        with pytest.raises(LaunchError, match="hides every GPU"):
            parse_launch([f"CUDA_VISIBLE_DEVICES={hidden}", "python", "t.py"])
    assert parse_launch(["env", "CUDA_VISIBLE_DEVICES=1,3", "python", "t.py"]).env == {
        "CUDA_VISIBLE_DEVICES": "1,3"}


def test_python_api_sets_the_variables_for_the_job_only(script, monkeypatch):
    monkeypatch.delenv("MIB", raising=False)
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    argv = ["env", "MIB=4", "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True", "python",
            str(script)]
    isolated = estimate_command(argv, gpu="a100-40gb", mode="fake", timeout=120)
    assert isolated.peak_allocated_bytes == 4 * MIB
    assert isolated.alloc_conf == "expandable_segments:True"
    in_process = estimate_command(["MIB=2", "python", str(script)], gpu="a100-40gb",
                                  mode="fake", isolate=False)
    assert in_process.peak_allocated_bytes == 2 * MIB and in_process.alloc_conf == ""
    assert "MIB" not in os.environ  # put back after the in-process run
    given = estimate_command(argv, gpu="a100-40gb", mode="fake", isolate=False,
                             alloc_conf="max_split_size_mb:64")
    assert given.alloc_conf == "max_split_size_mb:64"  # the option wins over the prefix
    with pytest.raises(EstimateError) as bad:
        estimate_command(["env", "-u", "X", "python", str(script)], isolate=False)
    assert bad.value.reason == "bad_input" and "'-u'" in bad.value.message


def test_fit_fills_a_placeholder_inside_a_variable(script):
    answers = fit_command(["env", "MIB={mib}", "python", str(script)],
                          ArgRange("mib", 1, 1 << 20), ["a100-40gb"], mode="fake",
                          isolate=False)
    capacity = answers[0].capacity_bytes
    assert answers[0].value is not None and answers[0].next_value == answers[0].value + 1
    assert 0.5 * capacity < answers[0].value * MIB <= capacity


def _cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    env.pop("MIB", None)
    return subprocess.run([sys.executable, "-m", "peakmem", *args], capture_output=True,
                          text=True, env=env, timeout=180, cwd=cwd)


def test_cli_shell_style_prefix(script):
    run = _cli(["estimate", "--json", "--gpu", "a100-40gb", "--mode", "fake", "--", "MIB=8",
                "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True", "python", script.name],
               script.parent)
    assert run.returncode == 0, run.stdout + run.stderr
    result = json.loads(run.stdout)
    assert result["peak_allocated_bytes"] == 8 * MIB
    assert result["alloc_conf"] == "expandable_segments:True"
    refused = _cli(["estimate", "--json", "--", "env", "-i", "python", script.name],
                   script.parent)
    assert refused.returncode == 2
    assert json.loads(refused.stdout)["error"]["reason"] == "bad_input"


def test_service_checks_the_script_after_the_prefix():
    files = {"job.py": JOB.encode()}
    assert job_problem(EstimateJob(("env", "MIB=1", "python", "job.py"), files)) is None
    assert job_problem(EstimateJob(("MIB=1", "torchrun", "job.py"), files)) is None
    assert "not among the files sent" in job_problem(
        EstimateJob(("MIB=1", "python", "other.py"), files))
    assert "unsupported env option" in job_problem(
        EstimateJob(("env", "-i", "python", "job.py"), files))


def test_service_and_batch_run_the_prefixed_command(tmp_path):
    from peakmem.service.app import ServiceConfig, create_app
    from peakmem.service.batch import BatchSettings, run_batch

    from ..service.conftest import running_server, wait_final

    app = create_app(ServiceConfig(sandbox="off", workers=1, max_seconds=120))
    with running_server(app) as url, httpx.Client(base_url=url, timeout=30) as client:
        posted = client.post("/v1/estimates", json={
            "files": {"job.py": JOB}, "command": ["env", "MIB=16", "python", "job.py"],
            "gpu": "a100-40gb", "options": {"mode": "fake"}})
        assert posted.status_code == 202, posted.text
        done = wait_final(client, posted.json()["id"], 180)
    assert done["status"] == "done", done
    assert done["result"]["peak_allocated_bytes"] == 16 * MIB

    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text(json.dumps({"id": "prefixed", "files": {"job.py": JOB},
                                "command": ["MIB=32", "python", "job.py"], "gpu": "a100-40gb",
                                "options": {"mode": "fake"}}) + "\n")
    out = tmp_path / "out.jsonl"
    summary = run_batch(jobs, out, BatchSettings(max_seconds=120), in_process=True)
    line = json.loads(out.read_text().splitlines()[0])
    assert summary.done == 1, line
    assert line["result"]["peak_allocated_bytes"] == 32 * MIB


def test_wrapper_programs_are_taken_off():
    from peakmem.jobs.command_wrappers import strip_wrappers

    assert strip_wrappers(["nohup", "python", "t.py"]) == (("python", "t.py"), ("nohup",))
    assert strip_wrappers(["time", "-p", "nice", "-n", "10", "stdbuf", "-oL", "python", "t.py"]) \
        == (("python", "t.py"), ("time", "nice", "stdbuf"))
    assert strip_wrappers(["taskset", "-c", "0-7", "torchrun", "t.py"])[0] == ("torchrun", "t.py")
    assert strip_wrappers(["nice", "-5", "python", "t.py"])[0] == ("python", "t.py")
    plain = parse_launch(["nohup", "env", "A=1", "ionice", "-c", "3", "python", "t.py"])
    assert plain.command == ("python", "t.py") and dict(plain.env) == {"A": "1"}
    assert not plain.distributed
    assert parse_launch(["/usr/bin/nohup", "python", "t.py"]).command == ("python", "t.py")
    ranked = parse_launch(["B=2", "nice", "torchrun", "--nproc-per-node", "2", "t.py"])
    assert ranked.world_size == 2 and ranked.rank_env(1)["B"] == "2"
    with pytest.raises(LaunchError, match="unsupported nice option '--weird'"):
        parse_launch(["nice", "--weird", "python", "t.py"])
    with pytest.raises(LaunchError, match="no command after `nohup`"):
        parse_launch(["nohup"])
    with pytest.raises(LaunchError, match="`nohup` would run a program named 'A=1'"):
        parse_launch(["nohup", "A=1", "python", "t.py"])


def test_a_wrapped_command_is_estimated(script):
    result = estimate_command(["nohup", "env", "MIB=3", "time", "-p", "python", str(script)],
                              gpu="a100-40gb", mode="fake", isolate=False)
    assert result.peak_allocated_bytes == 3 * MIB
