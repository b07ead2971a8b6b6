"""`peakmem estimate -- env NAME=VALUE python train.py` (jobs/env_prefix.py)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from peakmem.jobs.env_prefix import EnvPrefixError, split_env_prefix

SRC = Path(__file__).resolve().parents[2] / "src"


def test_split_env_prefix():
    assert split_env_prefix(["python", "t.py"]) == (("python", "t.py"), {})
    assert split_env_prefix(["/usr/bin/env", "python", "t.py", "A=1"]) == (
        ("python", "t.py", "A=1"), {})
    assert split_env_prefix(["env", "A=1", "B=x=y", "--", "C=2", "t.py"]) == (
        ("C=2", "t.py"), {"A": "1", "B": "x=y"})
    with pytest.raises(EnvPrefixError, match="unsupported env option '-u'"):
        split_env_prefix(["env", "-u", "A", "python", "t.py"])
    with pytest.raises(EnvPrefixError, match="no command after `env`"):
        split_env_prefix(["env", "A=1"])


def test_the_job_runs_with_the_prefix_variables(tmp_path):
    """`/usr/bin/env` used to be run as the job's Python script (SyntaxError: null bytes)."""
    script = tmp_path / "job.py"
    script.write_text(
        "import os, torch\n"
        "x = torch.empty(int(os.environ['ELEMENTS']), device='cuda')\n"
    )
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    run = subprocess.run(
        [sys.executable, "-m", "peakmem", "estimate", "--json", "--gpu", "a100-40gb",
         "--mode", "fake", "--", "/usr/bin/env", "ELEMENTS=1048576",
         "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True", "python", str(script)],
        capture_output=True, text=True, env=env, timeout=120, cwd=tmp_path,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    result = json.loads(run.stdout)
    assert result["peak_allocated_bytes"] == 4 * 2**20
    assert result["alloc_conf"] == "expandable_segments:True"
