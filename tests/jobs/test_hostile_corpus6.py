"""The k6 adversarial sweep's regressions (benchmarks/hostile_sweep_k6.py runs the whole sweep):
one test per class of hostile input that broke the contract before its fix. Each docstring says
what went wrong."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
TRAIN = """import torch
model = torch.nn.Linear(16, 16).cuda()
model(torch.randn(4, 16, device="cuda")).sum().backward()
"""


def run(*args: str, cwd: Path, timeout: float = 120, env: dict[str, str] | None = None,
        ) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "PYTHONPATH": str(SRC), "PEAKMEM_WARM": "0", **(env or {})}
    return subprocess.run([sys.executable, *args], cwd=cwd, env=full_env, capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def stderr_lines(proc: subprocess.CompletedProcess) -> list[str]:
    return [line for line in proc.stderr.splitlines() if line.strip()]


# -- a module next to the script that shadows one torch imports -------------------------------


def _torch_import_not_at_startup() -> str:
    """A standard-library module `import torch` loads that a plain python has not loaded at its
    start (this machine's site and .pth files load some: json, typing, ... here)."""
    probe = ("import sys, json; before = set(sys.modules); import torch; "
             "print(json.dumps(sorted(set(sys.modules) - before)))")
    loaded = json.loads(subprocess.check_output([sys.executable, "-c", probe], text=True))
    for name in ("dataclasses", "inspect", "pickle", "ctypes", "numbers", "decimal"):
        if name in loaded:
            return name
    pytest.skip("import torch loads none of the probed standard-library modules")


def test_a_local_standard_library_name_that_torch_imports_is_refused_as_python_would_fail(tmp_path):
    """job/dataclasses.py next to the script: `python job/train.py` imports it in place of the
    standard library's from inside `import torch` and fails; peakmem's job got the copy peakmem
    had loaded and was estimated (exit 0) as a run that cannot happen. Only a local torch.py
    was checked."""
    name = _torch_import_not_at_startup()
    job = tmp_path / "job"
    job.mkdir()
    (job / "train.py").write_text(TRAIN)
    (job / f"{name}.py").write_text("X = 1\n")
    plain = run("job/train.py", cwd=tmp_path)
    assert plain.returncode != 0 and "job/" in plain.stderr  # what python itself does
    proc = run("-m", "peakmem", "estimate", "--json", "job/train.py", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    error = json.loads(proc.stdout)["error"]
    assert error["reason"] == "bad_input"
    assert f"job/{name}.py shadows the standard library's {name}" in error["message"]
    assert "\n" not in error["message"] and "Traceback" not in proc.stderr


def test_a_local_name_loaded_at_python_startup_or_only_by_peakmem_is_not_refused(tmp_path):
    """No false alarm: a local module of a name python had loaded before the script's directory
    joined sys.path (peakmem.startup_modules), a built-in one, and a dependency of peakmem's
    alone (click) are what `python train.py` imports too."""
    import torch  # noqa: F401 - loaded, as in the job's child

    from peakmem.capture.child import shadow_candidates, shadowed_frameworks
    from peakmem.jobs.runner import JobSpec
    from peakmem.startup_modules import MODULES

    candidates = shadow_candidates()
    assert "torch" in candidates and "click" not in candidates and "sys" not in candidates
    assert not set(candidates) & MODULES
    assert "peakmem" not in candidates
    job = tmp_path / "job"
    job.mkdir()
    (job / "train.py").write_text(TRAIN)
    for name in ["click", "sys", "peakmem", *sorted(MODULES)[:3]]:
        (job / f"{name.split('.')[0]}.py").write_text("X = 1\n")
    assert shadowed_frameworks(JobSpec(script=str(job / "train.py"))) is None
    (job / "torch.py").write_text("X = 1\n")
    found = shadowed_frameworks(JobSpec(script=str(job / "train.py")))
    assert found is not None and "torch.py shadows the installed torch" in found


def test_a_local_name_only_peakmem_loads_is_not_refused_and_the_job_runs(tmp_path):
    """job/profile.py, statistics.py, secrets.py, tomllib.py next to the script: `import torch`
    loads none of them, so `python job/train.py` runs with them there; peakmem's own modules
    load some (cProfile's profile, ...), and the check counts only what torch's import loaded
    (peakmem.torch_import_modules, recorded in the child before the capture's imports)."""
    probe = ("import sys; before = set(sys.modules); import torch; "
             "print(' '.join(sorted(set(sys.modules) - before)))")
    by_torch = set(subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                                  check=True).stdout.split())
    names = [name for name in ("profile", "statistics", "secrets", "tomllib", "sysconfig",
                               "decimal", "getpass") if name not in by_torch]
    assert names, "torch's import loads every probed name"
    job = tmp_path / "job"
    job.mkdir()
    (job / "train.py").write_text(TRAIN)
    for name in names:
        (job / f"{name}.py").write_text("X = 1\n")
    proc = run("-m", "peakmem", "estimate", "--json", "job/train.py", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert json.loads(proc.stdout)["peak_bytes"] > 0


# -- output flags --------------------------------------------------------------------------------


def test_measure_refuses_an_output_over_its_script_in_one_line_and_one_json_object(tmp_path):
    """`measure --out train.py`: the check raised click's UsageError from the command's body,
    which click printed as three lines (usage, hint, `Error: ...`) and, with --json, no JSON
    object."""
    (tmp_path / "train.py").write_text(TRAIN)
    proc = run("-m", "peakmem", "measure", "--out", "train.py", "train.py", cwd=tmp_path)
    assert proc.returncode == 2
    assert stderr_lines(proc) == ["peakmem: error: --out train.py would overwrite a Python "
                                  "source file"]
    proc = run("-m", "peakmem", "measure", "--json", "--out", "train.py", "train.py", cwd=tmp_path)
    assert proc.returncode == 2 and len(stderr_lines(proc)) == 1
    assert json.loads(proc.stdout)["error"]["kind"] == "bad_input"
    assert (tmp_path / "train.py").read_text() == TRAIN


@pytest.mark.parametrize("argv, flags", [
    (["estimate", "--json", "--job-log", "out.bin", "--snapshot", "out.bin", "train.py"],
     "--job-log and --snapshot"),
    (["estimate", "--json", "--job-log", "link.bin", "--snapshot", "out.bin", "train.py"],
     "--job-log and --snapshot"),
    (["measure", "--json", "--out", "out.bin", "--snapshot", "out.bin", "train.py"],
     "--out and --snapshot"),
])
def test_two_output_flags_naming_one_file_are_refused_before_the_job(tmp_path, argv, flags):
    """`--job-log x --snapshot x` (or a link to x): the snapshot replaced the job's log after the
    estimate, exit 0, and the command said it had written both."""
    (tmp_path / "train.py").write_text(TRAIN)
    (tmp_path / "link.bin").symlink_to("out.bin")
    proc = run("-m", "peakmem", *argv, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    message = json.loads(proc.stdout)["error"]["message"]
    assert message.startswith(f"{flags} name the same file")
    assert len(stderr_lines(proc)) <= 1 and not (tmp_path / "out.bin").exists()


def test_shared_output_tells_apart_distinct_files(tmp_path):
    from peakmem.cli.output_paths import shared_output

    (tmp_path / "a").write_text("x")
    os.link(tmp_path / "a", tmp_path / "hard")
    assert shared_output({"--x": str(tmp_path / "a"), "--y": str(tmp_path / "b"), "--z": None}) is None
    found = shared_output({"--x": str(tmp_path / "a"), "--y": str(tmp_path / "hard")})
    assert found is not None and found.startswith("--x and --y name the same file")


# -- settings read in the job's process, and the terminal's encoding -----------------------------


@pytest.mark.parametrize("value, where", [("nan", "environment"), ("9" * 5000, "env prefix")])
def test_a_bad_transformers_release_setting_is_bad_input_not_internal(tmp_path, value, where):
    """PEAKMEM_TRANSFORMERS_RELEASE=nan is read in the job's process: its InputError there was
    reported as a peakmem internal error (exit 70, a traceback); 5000 digits raised int()'s
    ValueError (more digits than sys.get_int_max_str_digits())."""
    (tmp_path / "train.py").write_text(TRAIN)
    variable = f"PEAKMEM_TRANSFORMERS_RELEASE={value}"
    if where == "env prefix":
        proc = run("-m", "peakmem", "estimate", "--json", "--", "env", variable, "python",
                   "train.py", cwd=tmp_path)
    else:
        proc = run("-m", "peakmem", "estimate", "--json", "train.py", cwd=tmp_path,
                   env={"PEAKMEM_TRANSFORMERS_RELEASE": value})
    assert proc.returncode == 2, proc.stderr[-2000:]
    error = json.loads(proc.stdout)["error"]
    assert error["kind"] == "bad_input" and error["traceback"] is None
    assert error["message"].startswith("PEAKMEM_TRANSFORMERS_RELEASE=")
    assert "is not a release number" in error["message"] and len(error["message"]) < 200


def test_an_ascii_only_terminal_gets_the_report_with_escapes_not_an_internal_error(tmp_path):
    """PYTHONIOENCODING=ascii:strict (a C locale's terminal): the report's `…` raised
    UnicodeEncodeError after the estimate had succeeded, exit 70 with a traceback."""
    (tmp_path / "train.py").write_text(TRAIN)
    proc = run("-m", "peakmem", "estimate", "train.py", cwd=tmp_path,
               env={"PYTHONIOENCODING": "ascii:strict"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Peak reserved" in proc.stdout and "Traceback" not in proc.stderr
    assert proc.stdout.isascii()
