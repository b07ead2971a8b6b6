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


GPT2 = '{"model_type": "gpt2", "n_layer": 1, "n_head": 2, "vocab_size": 100, "n_positions": 64, "n_embd": %s}'


def model_estimate_reporting_parent_imports(tmp_path, config: str) -> subprocess.CompletedProcess:
    """`peakmem estimate --model CONFIG` through a wrapper that prints, at exit, whether torch and
    transformers were imported in the parent (`IN-PARENT=torch,transformers`)."""
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import atexit, sys\n"
        "atexit.register(lambda: sys.stderr.write('IN-PARENT=%s,%s\\n' % (\n"
        "    'torch' in sys.modules, 'transformers' in sys.modules)))\n"
        "from peakmem.cli.main import main\n"
        "sys.argv = ['peakmem'] + sys.argv[1:]\n"
        "main()\n")
    return subprocess.run(
        [sys.executable, str(probe), "estimate", "--gpu", "l4", "--json", "--steps", "1",
         "--model", config, "--seq", "8"],
        capture_output=True, text=True, env=dict(os.environ, PEAKMEM_WARM="0"), timeout=300,
        cwd=tmp_path)


def test_a_model_estimate_leaves_torch_and_transformers_unimported_in_the_parent(tmp_path):
    """`--model CONFIG` checked the config with transformers' AutoConfig.for_model in the
    parent (seconds of imports on every --model estimate); that check runs in the job now
    (scriptgen.config_check), and a value it refuses is still one bad-input line, exit 2."""
    (tmp_path / "good.json").write_text(GPT2 % "16")
    (tmp_path / "bad.json").write_text(GPT2 % '"big"')
    done = model_estimate_reporting_parent_imports(tmp_path, "good.json")
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout)["peak_bytes"] > 0
    assert "IN-PARENT=False,False" in done.stderr, done.stderr[-2000:]

    done = model_estimate_reporting_parent_imports(tmp_path, "bad.json")
    assert done.returncode == 2, done.stderr[-2000:]
    error = json.loads(done.stdout)["error"]
    assert error["kind"] == "bad_input" and error["traceback"] is None
    assert error["message"].startswith("--model bad.json: transformers refuses the config: ")
    assert "field 'n_embd'" in error["message"] and "\n" not in error["message"]
    assert "IN-PARENT=False,False" in done.stderr, done.stderr[-2000:]


def test_a_config_only_the_model_build_refuses_is_bad_input_with_nothing_imported_in_the_parent(
        tmp_path):
    """vocab_size x n_embd past int64 passes every check of the config (each field alone is in
    range) and failed while the job built the model: exit 1 after a traceback (`the job raised
    RuntimeError: numel: integer multiplication overflow`). Now one bad_input line naming the
    fields, exit 2, still with neither torch nor transformers imported in the parent."""
    (tmp_path / "huge.json").write_text(
        '{"model_type": "gpt2", "n_layer": 1, "n_head": 2, "n_positions": 16, '
        '"vocab_size": 1099511627776, "n_embd": 1099511627776}')
    done = model_estimate_reporting_parent_imports(tmp_path, "huge.json")
    assert done.returncode == 2, done.stderr[-2000:]
    error = json.loads(done.stdout)["error"]
    assert error["kind"] == "bad_input" and error["traceback"] is None
    assert error["message"].startswith("--model huge.json: the config's sizes make a tensor too "
                                       "large for torch (largest: 'vocab_size' 1099511627776, "
                                       "'n_embd' 1099511627776): ")
    assert "IN-PARENT=False,False" in done.stderr, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
