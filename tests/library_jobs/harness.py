"""Run a library job through the real CLI: `python -m peakmem estimate --json -- python SCRIPT`."""

from __future__ import annotations

import contextlib
import io
import json
import os
import runpy
import shutil
import subprocess
import sys
import tempfile
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


def job_env() -> dict[str, str]:
    """The environment `estimate` runs `peakmem estimate` in: this process's, with peakmem's
    source on PYTHONPATH and the hub offline."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SRC), env.get("PYTHONPATH", "")]))
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env["HF_HUB_OFFLINE"] = "1"
    return env


_WARM: dict[str, Path] = {}
"""This process's warm job processes (`peakmem warm`): the private runtime directory of each,
by the start-up environment it was started in, the last used last."""

WARM_PROCESSES = 2
"""At most this many warm processes per pytest process (each ~0.3 GB resident)."""


def warm_runtime_dir() -> Path:
    """A warm job process of this python and peakmem source, started in a private runtime
    directory in `job_env()`'s environment, nothing preloaded: a `peakmem estimate` given
    ``PEAKMEM_RUNTIME_DIR`` = this directory forks its job's child from it (torch and peakmem's
    capture modules already imported, nothing of a job run) instead of starting an
    interpreter; the estimate is the cold one (tests/jobs/test_zygote.py), with the warm note
    added. One per start-up environment (`zygote.startup_env`: PYTHON*, TORCH*, HF_*, ...; the
    warm process refuses a job of another one): a test that sets HF_* / TORCH_* variables, or
    a library imported in the worker that sets one (Lightning's PYTORCH_NVML_BASED_CUDA_CHECK),
    gets its own, the least recently used stopped beyond `WARM_PROCESSES`; started again
    after it exited (10 idle minutes). Stopped by `stop_warm` (tests/library_jobs/conftest.py)."""
    from peakmem.jobs import zygote_client
    from peakmem.jobs.zygote import startup_env
    from peakmem.jobs.zygote_server import socket_path

    env = job_env()
    key = json.dumps(startup_env(env), sort_keys=True)
    directory = _WARM.pop(key, None)
    if directory is not None and not socket_path(directory).exists():  # it exited, idle
        _stop(directory)
        directory = None
    if directory is None:
        directory = Path(tempfile.mkdtemp(prefix="peakmem-tests-warm-"))  # mode 0700
        saved = dict(os.environ)
        try:
            os.environ.clear()
            os.environ.update(env, PEAKMEM_RUNTIME_DIR=str(directory))
            zygote_client.start(idle_seconds=600)
        finally:
            os.environ.clear()
            os.environ.update(saved)
    _WARM[key] = directory  # the most recently used last
    while len(_WARM) > WARM_PROCESSES:
        _stop(_WARM.pop(next(iter(_WARM))))
    return directory


def _stop(directory: Path) -> None:
    from peakmem.jobs import zygote_client

    saved = os.environ.get("PEAKMEM_RUNTIME_DIR")
    os.environ["PEAKMEM_RUNTIME_DIR"] = str(directory)
    try:
        zygote_client.stop()
    finally:
        if saved is None:
            os.environ.pop("PEAKMEM_RUNTIME_DIR", None)
        else:
            os.environ["PEAKMEM_RUNTIME_DIR"] = saved
        shutil.rmtree(directory, ignore_errors=True)


def stop_warm() -> None:
    """Stop this process's warm job processes."""
    while _WARM:
        _stop(_WARM.pop(next(iter(_WARM))))


EXPORT_VARIABLE = "PEAKMEM_EXPORT_JOBS"
"""With this variable set to a directory, `estimate` and `estimate_here` do not estimate: they
copy the job (its working directory and every file or directory its arguments name) under
DIRECTORY/jobs/PID-NNN and append one line to DIRECTORY/jobs.jsonl, then skip the test. What
`benchmarks/gpu_library_jobs.py` measures on a GPU and estimates here, side by side."""

EXPORT_MAX_BYTES = 16 * 2**20
"""A job whose files take more than this is not exported (the device call carries 64 MiB)."""


def _tree_bytes(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def _export(script: str, args: tuple[str, ...], flags: tuple[str, ...],
            launcher: tuple[str, ...] | None, cwd: Path | None) -> None:
    """`EXPORT_VARIABLE`'s export of one job, then `pytest.skip` (nothing when it is unset)."""
    target = os.environ.get(EXPORT_VARIABLE)
    if not target:
        return
    import pytest

    root = Path(target)
    jobs = root / "jobs"
    jobs.mkdir(parents=True, exist_ok=True)
    number = f"{os.getpid()}-{sum(1 for p in jobs.iterdir() if p.name.startswith(f'{os.getpid()}-')):03d}"
    job = jobs / number
    names: list[tuple[Path, str]] = []  # (source, relative name in the job directory)
    if cwd is not None:
        names.append((Path(cwd), "cwd"))
    exported_args: list[str] = []
    for index, arg in enumerate(args):
        path = Path(arg)
        if os.path.isabs(arg) and path.exists() and not str(path).startswith(str(SCRIPTS)):
            if cwd is not None and path.resolve().is_relative_to(Path(cwd).resolve()):
                exported_args.append(os.path.relpath(path.resolve(), Path(cwd).resolve()))
                continue
            names.append((path, f"arg{index}"))
            exported_args.append(f"../arg{index}" + ("" if path.is_dir() else f"/{path.name}"))
        elif os.path.isabs(arg) and path.parent.is_dir() and path.is_relative_to(
                tempfile.gettempdir()):  # a file the job writes: a place for it beside the job
            names.append((path.parent, f"out{index}"))
            exported_args.append(f"../out{index}/{path.name}")
        else:
            exported_args.append(arg)
    if sum(_tree_bytes(source) for source, name in names if not name.startswith("out")) > \
            EXPORT_MAX_BYTES:
        pytest.skip("exported: too large")
    (job / "cwd").mkdir(parents=True)
    for source, name in names:
        if name.startswith("out"):
            (job / name).mkdir()
        elif name == "cwd":
            shutil.copytree(source, job / "cwd", dirs_exist_ok=True, symlinks=True)
        elif source.is_dir():
            shutil.copytree(source, job / name, symlinks=True)
        else:
            (job / name).mkdir()
            shutil.copy2(source, job / name / source.name)
    options = dict(zip(flags[::2], flags[1::2], strict=True))
    line = {"id": number, "test": os.environ.get("PYTEST_CURRENT_TEST", "").split(" ")[0],
            "script": script, "args": exported_args, "launcher": list(launcher or ()),
            "steps": options.get("--steps"), "mode": options.get("--mode")}
    with open(root / "jobs.jsonl", "a") as out:
        out.write(json.dumps(line) + "\n")
    pytest.skip(f"exported as job {number}")


def estimate(script: str, *args: str, timeout: float = 120, flags: tuple[str, ...] = (),
             launcher: tuple[str, ...] | None = None, cwd: Path | None = None,
             cold: bool = False) -> JobEstimate:
    """`peakmem estimate --json --timeout T FLAGS -- python SCRIPT ARGS`; the job's own output
    comes back in `stderr`. `launcher` replaces `python` (e.g. `torchrun --nproc_per_node 2`);
    `cwd` is the directory the job runs in (where it writes relative paths).

    A single-process job's child is forked from this process's warm job process
    (`warm_runtime_dir`): what these tests check is the library's run under the capture, and
    the child's `import torch` (1-2 s of CPU) is paid once per worker. A job started by a
    launcher (its ranks' environments differ from the warm process's) and `cold=True` (a test
    of the child's own host resources: `max_rss_bytes` counts only this wrapper's children)
    start a fresh interpreter as `peakmem estimate` does without `peakmem warm`."""
    _export(script, args, flags, launcher, cwd)
    env = job_env()
    if launcher is None and not cold:
        env["PEAKMEM_RUNTIME_DIR"] = str(warm_runtime_dir())
        env.pop("PEAKMEM_WARM", None)
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

    _export(script, args, flags, None, cwd)
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
