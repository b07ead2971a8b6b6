"""The estimate's own process (the parent that supervises the job's child) never imports torch:
importing it costs seconds on every estimate, and the parent only reads the trace."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

JOB = Path(__file__).resolve().parents[1] / "library_jobs" / "scripts" / "pytorch_tutorial_manual_sgd.py"


def test_a_whole_estimate_leaves_torch_unimported_in_the_parent(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import atexit, sys\n"
        "atexit.register(lambda: sys.stderr.write('TORCH-IN-PARENT=%s\\n' % ('torch' in sys.modules)))\n"
        "from peakmem.cli.main import main\n"
        "sys.argv = ['peakmem'] + sys.argv[1:]\n"
        "main()\n")
    env = dict(os.environ, PEAKMEM_WARM="0")
    done = subprocess.run(
        [sys.executable, str(probe), "estimate", "--gpu", "a100-40gb", "--json", "--",
         sys.executable, str(JOB)],
        capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    assert result["peak_bytes"] > 0
    assert result["utilization"]["iteration_seconds"] > 0  # the record was read and modelled
    assert "TORCH-IN-PARENT=False" in done.stderr, done.stderr[-2000:]
