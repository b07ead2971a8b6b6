"""The k5 adversarial sweep's regressions (benchmarks/hostile_sweep_k5.py runs the whole sweep):
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
JOB = ["python", "train.py"]


def peakmem(*args: str, cwd: Path, timeout: float = 60, env: dict[str, str] | None = None,
            ) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "PYTHONPATH": str(SRC), **(env or {})}
    return subprocess.run([sys.executable, "-m", "peakmem", *args], cwd=cwd, env=full_env,
                          capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def stderr_lines(proc: subprocess.CompletedProcess) -> list[str]:
    return [line for line in proc.stderr.splitlines() if line.strip()]


# -- jobs files (batch, pack --jobs) ----------------------------------------------------------


@pytest.mark.parametrize("body", [b"[1, 2]\n", b"{\n", b'{"id": "\xff", "command": []}\n',
                                  b'{"id": 5, "command": ["python", "train.py"]}\n'])
def test_batch_refuses_a_bad_jobs_file_in_one_line(tmp_path, body):
    """The progress bar was drawn before the jobs file was read: a bad file gave two stderr
    lines (an empty bar, then the error)."""
    (tmp_path / "jobs.jsonl").write_bytes(body)
    proc = peakmem("batch", "--in-process", "jobs.jsonl", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    lines = stderr_lines(proc)
    assert len(lines) == 1 and lines[0].startswith("peakmem: error: ") and "jobs.jsonl" in lines[0], lines
    assert "Traceback" not in proc.stderr


def test_batch_summary_of_a_job_with_a_huge_hostile_id_is_fast_and_plain(tmp_path):
    """A 100k-character id: the failure summary went through rich's highlighter, which took
    minutes on it (a hang); rich markup in an id (`[red]`) was interpreted."""
    entries = [{"id": "i" * 100_000, "command": JOB},
               {"id": "[bold red]x\x1b[2J", "command": ["python", "missing.py"]}]
    (tmp_path / "jobs.jsonl").write_text("".join(json.dumps(e) + "\n" for e in entries))
    proc = peakmem("batch", "--in-process", "jobs.jsonl", cwd=tmp_path, timeout=60)
    assert proc.returncode in (0, 1), proc.stderr
    assert "1 failed" in proc.stderr or "2 failed" in proc.stderr
    assert "[bold red]x" in proc.stderr and "\x1b" not in proc.stderr
    assert max(len(line) for line in proc.stderr.splitlines()) < 1000


def test_pack_checks_every_jobs_file_entry_before_the_first_estimate(tmp_path):
    """An unknown GPU on line 2 was found only once job 1 had been estimated (its progress
    line came first; with many jobs, after minutes of estimates)."""
    (tmp_path / "train.py").write_text("import torch\n")
    (tmp_path / "jobs.jsonl").write_text(
        json.dumps({"id": "a", "command": JOB}) + "\n"
        + json.dumps({"id": "b", "command": JOB, "gpu": "no-such-gpu"}) + "\n")
    proc = peakmem("pack", "--gpus", "1xh100-80gb", "--jobs", "jobs.jsonl", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert stderr_lines(proc) == [stderr_lines(proc)[0]]
    assert "job 'b'" in proc.stderr and "no-such-gpu" in proc.stderr
    assert "estimating" not in proc.stderr


# -- jobs that break the interpreter for the code after them ----------------------------------

TRAIN = """import torch
model = torch.nn.Linear(16, 16).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(2):
    model(torch.randn(4, 16, device="cuda")).sum().backward()
    opt.step()
    opt.zero_grad()
"""

BREAK_INTERPRETER = """
import builtins, sys
torch.cuda = None
del sys.modules["torch"]
def _no_imports(*args, **kwargs):
    raise ImportError("imports are off")
builtins.__import__ = _no_imports
"""


@pytest.mark.parametrize("ending, code, message", [
    ("", 0, None),
    ("raise ValueError('the job failed')\n", 1, "the job raised ValueError: the job failed"),
])
def test_a_job_that_breaks_imports_torch_cuda_and_sys_modules_is_still_reported(
        tmp_path, ending, code, message):
    """`builtins.__import__` rebound to a raising function, `torch.cuda = None` and `del
    sys.modules["torch"]` after training (valid under python: the process ends next) each made
    peakmem's own code after the job fail: exit 70, "peakmem internal error in the job's
    process" and a 60-line peakmem traceback."""
    (tmp_path / "train.py").write_text(TRAIN + BREAK_INTERPRETER + ending)
    proc = peakmem("estimate", "--json", "train.py", cwd=tmp_path, timeout=120)
    assert proc.returncode == code, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    if code == 0:
        assert out["peak_bytes"] > 0
    else:
        assert out["error"]["kind"] == "job_failed" and out["error"]["message"] == message
        assert "peakmem/capture" not in out["error"]["traceback"]
    assert "internal error" not in proc.stderr


def test_interpreter_state_restored_puts_back_what_the_job_removed_or_rebound():
    import builtins

    import torch

    from peakmem.capture.interpreter_state import interpreter_state_restored

    original_import, original_cuda, original_modules = builtins.__import__, torch.cuda, sys.modules
    with interpreter_state_restored():
        builtins.__import__ = None
        builtins.k5_added = 1  # what the job adds stays
        torch.cuda = None
        del sys.modules["json"]
        sys.modules = {}
    try:
        assert builtins.__import__ is original_import and torch.cuda is original_cuda
        assert sys.modules is original_modules and "json" in sys.modules
        assert builtins.k5_added == 1
    finally:
        del builtins.k5_added


# -- environment --------------------------------------------------------------------------------


def test_workspace_config_bytes_reads_as_torch_does_and_refuses_what_stoi_cannot():
    """CUBLAS_WORKSPACE_CONFIG=:9999999999999999999:8 made an OverflowError inside the job
    (a job_failed with a peakmem traceback); :2147483647:2147483647 (2**72 bytes) the same."""
    from peakmem.cublas_workspace_config import WorkspaceConfigError, workspace_config_bytes

    assert workspace_config_bytes(":4096:8") == 4096 * 1024 * 8
    assert workspace_config_bytes(":4096:2:16:8") == 4096 * 1024 * 2 + 16 * 1024 * 8
    assert workspace_config_bytes(":0004096:8") == 4096 * 1024 * 8  # stoi takes leading zeros
    assert workspace_config_bytes("garbage") is None  # torch warns and keeps its default
    assert workspace_config_bytes(":2147483647:2147483647") == 2**56  # capped: out of memory
    for value in (":2147483648:1", ":1:9999999999999999999", ":" + "9" * 5000 + ":8"):
        with pytest.raises(WorkspaceConfigError, match="over 2147483647"):
            workspace_config_bytes(value)


@pytest.mark.parametrize("args, env", [
    (["train.py"], {"CUBLAS_WORKSPACE_CONFIG": ":9999999999999999999:8"}),
    (["env", "CUBLAS_WORKSPACE_CONFIG=:2147483648:1", "python", "train.py"], {}),
])
def test_a_cublas_workspace_config_torch_cannot_read_is_bad_input(tmp_path, args, env):
    (tmp_path / "train.py").write_text(TRAIN)
    proc = peakmem("estimate", *args, cwd=tmp_path, env=env)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert stderr_lines(proc) == [stderr_lines(proc)[0]]
    assert "CUBLAS_WORKSPACE_CONFIG" in proc.stderr and "std::stoi" in proc.stderr


# -- --model CONFIG -------------------------------------------------------------------------------

GPT2 = '{"model_type": "gpt2", "n_layer": 1, "n_head": 2, "vocab_size": 100, "n_embd": %s}'


@pytest.mark.parametrize("value, words", [
    ("NaN", "'n_embd' is nan, not a finite number"),
    ("Infinity", "'n_embd' is inf, not a finite number"),
    ("99999999999999999999", "'n_embd' is 99999999999999999999, out of any model's range"),
    ("-8", "'n_embd' is -8: a size or count is not negative"),
])
def test_a_model_config_value_no_tensor_shape_holds_is_bad_input(tmp_path, value, words):
    """These values passed the config check, and the generated job failed on them: exit 1,
    `the job raised ...` after a 30-line traceback, instead of one line naming the field.
    Checked in the estimate's own process (no transformers needed)."""
    from peakmem.scriptgen import ConfigError, find_config

    path = tmp_path / "config.json"
    path.write_text(GPT2 % value)
    with pytest.raises(ConfigError) as caught:
        find_config(str(path))
    assert words in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize("value, words", [
    ('"big"', "transformers refuses the config: StrictDataclassFieldValidationError: "
              "Validation error for field 'n_embd'"),
    ("[64]", "transformers refuses the config"),
])
def test_a_model_config_value_transformers_refuses_is_bad_input_in_the_job(tmp_path, value, words):
    """transformers' own check runs in the job (scriptgen.config_check), whose process
    imports it anyway: the estimate's parent passes the config on, the job's `built_config`
    raises a ConfigError, which the capture reports as bad input (test_parent_imports runs
    the whole estimate)."""
    from peakmem.inputs import JobInputError
    from peakmem.scriptgen import ConfigError, find_config
    from peakmem.scriptgen.config_check import built_config

    path = tmp_path / "config.json"
    path.write_text(GPT2 % value)
    config, _ = find_config(str(path))  # nothing the parent can see
    with pytest.raises(ConfigError) as caught:
        built_config(config, str(path))
    assert isinstance(caught.value, JobInputError)
    assert words in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize("sizes, words", [
    ({"vocab_size": 2**40, "n_embd": 2**40},
     "the config's sizes make a tensor too large for torch (largest: 'vocab_size' "
     "1099511627776, 'n_embd' 1099511627776): "),  # then torch's words (CPU and fake differ)
    ({"vocab_size": 100, "n_embd": 63},
     "transformers refuses the config: ValueError: `embed_dim` must be divisible by num_heads"),
])
def test_a_config_only_the_model_construction_refuses_is_bad_input_in_the_job(tmp_path, sizes, words):
    """Each field passes the range checks, but the model cannot be built: vocab_size x n_embd
    overflows torch's int64 element count; gpt2's attention needs n_embd divisible by n_head.
    Both were the job's failure (exit 1, `the job raised RuntimeError: numel: integer
    multiplication overflow` after a 30-line traceback); the estimated script builds the model
    with built_model, which reports them as bad input (one line naming the fields)."""
    from peakmem.capture.vision_ops import declare_torchvision_ops

    declare_torchvision_ops()  # as the capture does: transformers' models import torchvision
    from transformers import AutoModelForCausalLM

    from peakmem.inputs import JobInputError
    from peakmem.scriptgen import ConfigError, find_config
    from peakmem.scriptgen.config_check import built_config, built_model

    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "gpt2", "n_layer": 1, "n_head": 2, **sizes}))
    config = built_config(find_config(str(path))[0], str(path))  # nothing found before
    with pytest.raises(ConfigError) as caught:
        built_model(AutoModelForCausalLM, config, "config.json")
    assert isinstance(caught.value, JobInputError)
    assert str(caught.value).startswith("--model config.json: ") and "\n" not in str(caught.value)
    assert words in str(caught.value), str(caught.value)


def test_built_model_leaves_other_failures_to_the_job():
    """Only torch's size overflow and transformers' own ValueError are the config's: another
    RuntimeError / ValueError (peakmem's, torch's) is still the job's error with its traceback."""
    from peakmem.scriptgen.config_check import built_model

    class Raises:
        def __init__(self, exc):
            self.exc = exc

        def from_config(self, config):
            raise self.exc

    for exc in (RuntimeError("CUDA error: boom"), ValueError("not transformers'")):
        with pytest.raises(type(exc)):
            built_model(Raises(exc), {"model_type": "gpt2"}, "c.json")


def test_the_estimated_script_builds_the_model_with_built_model_the_printed_one_does_not():
    from peakmem.scriptgen import TrainingSpec, render_script

    config = {"model_type": "gpt2", "n_embd": 64}
    checked = render_script(TrainingSpec(), config, "c.json", checked=True)
    printed = render_script(TrainingSpec(), config, "c.json")
    assert "model = built_model(AutoModelForCausalLM, config, 'c.json')" in checked
    assert "model = AutoModelForCausalLM.from_config(config)" in printed
    assert "peakmem" not in printed.split('"""')[-1]  # the printed script runs on its own


def test_a_usable_model_config_still_passes(tmp_path):
    from peakmem.scriptgen import find_config

    path = tmp_path / "config.json"
    path.write_text((GPT2 % "64")[:-1] + ', "pad_token_id": -1}')  # a token id may be -1
    assert find_config(str(path))[0]["n_embd"] == 64
    from peakmem.scriptgen.config_check import built_config

    assert built_config(find_config(str(path))[0], str(path)).n_embd == 64


# -- peakmem serve's files --------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["/dev/zero", "fifo", "directory"])
def test_serve_refuses_a_token_file_that_is_not_a_regular_file_without_blocking(tmp_path, kind):
    """`--token-file /dev/zero` read forever and a FIFO blocked forever: the server hung before
    it started instead of refusing the flag."""
    path = {"/dev/zero": "/dev/zero", "fifo": str(tmp_path / "fifo"), "directory": str(tmp_path)}[kind]
    if kind == "fifo":
        os.mkfifo(path)
    proc = peakmem("serve", "--token-file", path, "--port", "0", cwd=tmp_path, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert stderr_lines(proc) == [stderr_lines(proc)[0]]
    assert stderr_lines(proc)[0].startswith("peakmem: error: ") and "--token-file" in proc.stderr


def test_serve_refuses_a_tls_pair_that_is_not_a_certificate_and_key(tmp_path):
    """A certificate file that is not PEM was exit 70 (`peakmem internal error: SSLError`)."""
    (tmp_path / "c.pem").write_text("not a certificate\n")
    (tmp_path / "k.pem").write_text("not a key\n")
    proc = peakmem("serve", "--tls-cert", "c.pem", "--tls-key", "k.pem", "--port", "0",
                   cwd=tmp_path, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert stderr_lines(proc) == [stderr_lines(proc)[0]]
    assert "not a usable certificate and key" in proc.stderr


# -- measure / warm command lines -----------------------------------------------------------------


@pytest.mark.parametrize("args, words", [
    (["measure", "--steps", "0", "train.py"], "Invalid value for '--steps'"),
    (["measure", "--out", ".", "train.py"], "is a directory"),
    (["warm", "--status", "--stop"], "give --stop or --status, not both"),
])
def test_measure_and_warm_usage_errors_are_one_contract_line(tmp_path, args, words):
    """click's own usage error: three lines (Usage, Try, Error) and, for warm, exit 1."""
    proc = peakmem(*args, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert stderr_lines(proc) == [stderr_lines(proc)[0]]
    assert stderr_lines(proc)[0].startswith("peakmem: error: ") and words in proc.stderr


def test_warm_status_with_an_unusable_runtime_dir_is_bad_input_not_no_process(tmp_path):
    """PEAKMEM_RUNTIME_DIR=/dev/null gave exit 1, which `warm --status` uses for "no warm
    process", with click's `Error:` line."""
    proc = peakmem("warm", "--status", cwd=tmp_path, env={"PEAKMEM_RUNTIME_DIR": "/dev/null"})
    assert proc.returncode == 2, proc.stderr
    assert stderr_lines(proc) == ["peakmem: error: no private runtime directory: /dev/null is "
                                  "not a directory owned by this user"]
