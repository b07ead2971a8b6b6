"""Run a library job through the real CLI: `python -m peakmem estimate --json -- python SCRIPT`."""

from __future__ import annotations

import contextlib
import io
import json
import os
import runpy
import subprocess
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parent / "scripts"
SRC = Path(__file__).resolve().parents[2] / "src"


RSS_MARK = "library-jobs-max-rss-kb="
RSS_WRAPPER = (
    "import resource, subprocess, sys\n"
    "code = subprocess.run(sys.argv[1:]).returncode\n"
    f"print('{RSS_MARK}%d' % resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss,"
    " file=sys.stderr)\n"
    "sys.exit(code)\n"
)
"""Runs the estimate as this wrapper's only child and reports its peak resident memory
(Linux: KiB): what estimating the job cost the host."""


@dataclass
class JobEstimate:
    returncode: int
    data: dict
    stderr: str
    max_rss_bytes: int

    @property
    def breakdown(self) -> dict[str, int]:
        return self.data.get("breakdown", {})

    def failure(self) -> str:
        """One line saying why there is no estimate (for assertion messages)."""
        if "error" in self.data:
            return f"{self.data['error'].get('kind')}: {self.data['error'].get('message')}"
        lines = [line for line in self.stderr.strip().splitlines() if line.strip()]
        job_error = next((line for line in reversed(lines) if "Error" in line), "")
        return f"exit {self.returncode}: {job_error or (lines[-1] if lines else '')}"


def estimate(script: str, *args: str, timeout: float = 120, flags: tuple[str, ...] = (),
             launcher: tuple[str, ...] | None = None, cwd: Path | None = None) -> JobEstimate:
    """`peakmem estimate --json --timeout T FLAGS -- python SCRIPT ARGS`; the job's own output
    comes back in `stderr`. `launcher` replaces `python` (e.g. `torchrun --nproc_per_node 2`);
    `cwd` is the directory the job runs in (where it writes relative paths)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SRC), env.get("PYTHONPATH", "")]))
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env["HF_HUB_OFFLINE"] = "1"
    command = [sys.executable, "-m", "peakmem", "estimate", "--json", "--timeout", str(timeout),
               *flags, "--", *(launcher or (sys.executable,)), str(SCRIPTS / script), *args]
    done = subprocess.run([sys.executable, "-c", RSS_WRAPPER, *command], capture_output=True,
                          text=True, env=env, timeout=timeout + 120, cwd=cwd)
    try:
        data = json.loads(done.stdout) if done.stdout.strip() else {}
    except json.JSONDecodeError:
        data = {}
    stderr, _, rss = done.stderr.rpartition(RSS_MARK)
    return JobEstimate(done.returncode, data, stderr, int(rss.strip() or 0) * 1024)


def _print_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """What Python prints for a warning when nothing records it (the child's behaviour)."""
    sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))


def estimate_here(script: str, *args: str, timeout: float = 120, flags: tuple[str, ...] = (),
                  cwd: Path | None = None) -> JobEstimate:
    """`estimate` in this process (``estimate_command(..., isolate=False)``): the same JSON
    object as `peakmem estimate --json` prints, without starting python, torch and peakmem
    again for the job. For jobs that need torch alone, whose child-process path the other
    library-job tests cover; the job's Python-level output (stdout and stderr, as the CLI
    passes it on) comes back in `stderr`. `flags`: `--gpu NAME`, `--mode MODE` and
    `--steps N|all` only."""
    from peakmem.estimate import estimate_command
    from peakmem.estimate.api import DEFAULT_GPU, EstimateError
    from peakmem.jobs.stop import parse_steps

    options = dict(zip(flags[::2], flags[1::2], strict=True))
    assert set(options) <= {"--gpu", "--mode", "--steps"}, flags
    job_stderr = io.StringIO()
    here = Path.cwd()
    try:
        if cwd is not None:
            os.chdir(cwd)
        with contextlib.redirect_stdout(job_stderr), contextlib.redirect_stderr(job_stderr), \
                warnings.catch_warnings():
            warnings.showwarning = _print_warning  # to the job's stderr, not pytest's record
            target = [script] if script == "-m" else [str(SCRIPTS / script)]  # -m MODULE
            result = estimate_command(["python", *target, *args],
                                      gpu=options.get("--gpu", DEFAULT_GPU),
                                      mode=options.get("--mode", "auto"), timeout=timeout,
                                      steps=parse_steps(options.get("--steps")),  # the CLI default: None
                                      isolate=False)
        returncode, data = 0, result.to_json()
    except EstimateError as exc:
        returncode, data = exc.exit_code, exc.to_json()
    finally:
        os.chdir(here)
    # the JSON text as the CLI prints it, read back (tuples become lists)
    return JobEstimate(returncode, json.loads(json.dumps(data)), job_stderr.getvalue(), 0)


def estimate_module_here(module: str, *args: str, timeout: float = 120,
                         flags: tuple[str, ...] = (), cwd: Path | None = None) -> JobEstimate:
    """`estimate_here` for `python -m MODULE ARGS` (a library's installed training entry
    point, run as it is)."""
    return estimate_here("-m", module, *args, timeout=timeout, flags=flags, cwd=cwd)


def run_script_here(script: str, *args: str) -> None:
    """`python SCRIPT ARGS` for a helper script that writes the files a job reads (a tiny
    checkpoint), in this process: the libraries it imports (transformers, diffusers) are
    imported once per test process rather than once per file written. Torch's global random
    state is put back afterwards (the scripts seed it); a failure raises."""
    import torch

    argv = sys.argv
    try:
        sys.argv = [str(SCRIPTS / script), *args]
        with torch.random.fork_rng(devices=[]), contextlib.redirect_stdout(io.StringIO()):
            runpy.run_path(str(SCRIPTS / script), run_name="__main__")
    finally:
        sys.argv = argv


def write_llama_checkpoint(out: Path) -> Path:
    """A tiny LlamaForCausalLM saved with save_pretrained (config.json + model.safetensors)."""
    run_script_here("make_llama_checkpoint.py", str(out))
    assert (out / "config.json").is_file() and (out / "model.safetensors").is_file()
    return out


def write_mnist(raw: Path, train: int, test: int) -> None:
    """torchvision's (Fashion)MNIST raw idx files (big-endian magic, counts, sizes, then uint8
    pixels or labels, seeded random): with them in <root>/<Name>/raw, `download=True` downloads
    nothing."""
    import random
    import struct

    rng = random.Random(0)
    raw.mkdir(parents=True)
    for prefix, count in (("train", train), ("t10k", test)):
        pixels = bytes(rng.randrange(256) for _ in range(count * 28 * 28))
        (raw / f"{prefix}-images-idx3-ubyte").write_bytes(
            struct.pack(">IIII", 2051, count, 28, 28) + pixels)
        labels = bytes(rng.randrange(10) for _ in range(count))
        (raw / f"{prefix}-labels-idx1-ubyte").write_bytes(struct.pack(">II", 2049, count) + labels)
