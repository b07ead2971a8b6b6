"""Python processes the job starts itself: `subprocess.run([sys.executable, "train.py", ...])`,
`subprocess.Popen(["python3", "-m", "pkg.train"])`, `os.system("python x.py")`, a shell
pipeline naming `python`, `os.execv(sys.executable, [...])` (a re-exec after setting variables).
Wrapper scripts launch the real training this way (sweep drivers, `run.py` calling `train.py`).

In a supervised job's process (capture.child: `spawned_children.configure` was given the job's
request) such a process runs under the fake GPU, like the multiprocessing children
(capture.spawned_children): a command whose program is a Python interpreter (`sys.executable`,
`python`, `python3`, `python3.N`, a venv's `bin/python`) running a script, `-m module` or a `-c`
program that imports something outside the standard library is started as
`python [its interpreter options] -c BOOT REQUEST WORDS...` instead (`booted_command`): the
child (capture.subprocess_child) captures that command as the job's own process is captured
(the job's GPU, torch version, mode, step limit and allocator configuration; its own files
journal), replays its trace and writes a report (`method` "subprocess") with its own device
memory and when it was alive; it ends with the status python would (0, sys.exit's, 1 after the
traceback). Commands run through a shell find `python` / `python3` / `python3.N` first on the
job's PATH (`install_shims`: the directory of the fake nvidia-smi); the child then decides, and
runs what it does not capture (`python --version`, `python -`, a standard-library-only `-c`
program, HOST_HELPERS, HOST_MODULES) with the real interpreter, unchanged (os.execv).
`os.execv` / `os.execve` (and the os.exec* functions built on them) of a Python command in the
job's own process re-enter the job's capture with the new command (the same process: its
result is the job's); elsewhere (a subprocess, a fork) they re-enter a subprocess capture. The
part before the exec reports its device memory as ended there (`method` "exec").

Left as before: launchers (`torchrun`, `python -m torch.distributed.run`, `accelerate launch`,
...) started by the job run outside the fake GPU (a note names the command to estimate
instead, and a failed job's one-line error too: `CaptureResult.failure_hint`); so does
everything outside a supervised job's process (the
in-process API, `isolate=False`). Non-Python programs are left alone (`nvidia-smi` finds the
fake one on PATH).
"""

from __future__ import annotations

import ast
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from peakmem.shell_words import shell_words

if TYPE_CHECKING:  # torch-free: the subprocess bootstrap decides before importing torch
    from peakmem.capture.session import CaptureSession

_REAL_INIT = subprocess.Popen.__init__
_REAL_EXECV, _REAL_EXECVE = os.execv, os.execve

HOST_HELPERS: dict[str, str] = {
    "cpuinfo/cpuinfo.py": "py-cpuinfo's CPU probe (`cpuinfo.py --json`), which DeepSpeed's CPU "
                          "Adam and accelerator detection start: it reads the CPU's flags",
}
"""Python scripts libraries start for host facts only (no torch, no GPU), by the end of their
path: no note and no failure hint for them (the note would tell the user to estimate a CPU
probe), and not captured."""

HOST_MODULES: dict[str, str] = {
    "pip": "installs packages",
    "ensurepip": "installs pip",
    "venv": "makes a virtual environment",
    "virtualenv": "makes a virtual environment",
    "pydoc": "prints documentation",
    "json": "`python -m json.tool` formats JSON",
    "http": "`python -m http.server` serves files",
    "site": "prints the interpreter's paths",
    "cpuinfo": "py-cpuinfo's CPU probe",
    "setuptools": "builds packages",
    "build": "builds packages",
    "peakmem": "peakmem itself (a nested `peakmem estimate` runs as it would)",
}
"""`python -m MODULE` commands run unchanged, by MODULE's top-level package: tools that never
use a GPU (capturing them would only cost a torch import each)."""

SHELL_SYNTAX = frozenset("|&;<>()$`\\\"'*?[]{}~#\n=")
"""Characters after which a shell command is more than one plain command (`>` a redirection,
`|` a pipeline, `$` an expansion, `VAR=x` a prefix, ...): such a command is not rewritten word
for word; its `python` is reached through the PATH shims instead."""

SHIM_NAMES = ("python", "python3", f"python3.{sys.version_info.minor}")
"""The names a shell finds first on the job's PATH (`install_shims`)."""

_BOOT = (
    "import sys; sys.path[0:int(not sys.flags.safe_path)] = [{src!r}]; "
    "from peakmem.capture.subprocess_child import main; main(sys.argv[1:])"
)


def host_helper(args: Any) -> str | None:
    """What a Popen command that runs one of HOST_HELPERS' scripts is, or None."""
    if isinstance(args, (str, bytes, os.PathLike)) or not isinstance(args, list | tuple):
        words = [args]
    else:
        words = list(args)
    for word in words:
        try:
            path = Path(os.fsdecode(word)).as_posix()
        except (TypeError, ValueError):
            continue
        for suffix, what in HOST_HELPERS.items():
            if path == suffix or path.endswith("/" + suffix):
                return what
    return None


def _words(args: Any, shell: bool = False) -> list[str] | None:
    """A Popen command's words (a shell command's as the shell splits a plain command), or None
    where peakmem cannot read it."""
    try:
        if isinstance(args, (str, bytes, os.PathLike)):
            text = os.fsdecode(args)
            return shell_words(text) if shell else [text]
        return [os.fsdecode(word) for word in args]
    except (TypeError, ValueError):
        return None


def python_command(args: Any, shell: bool = False) -> str | None:
    """`python train.py ...` / `torchrun ...` for a Popen command that starts a Python job, or
    None (another program, `python -c`, a command peakmem cannot read)."""
    from peakmem.jobs.launchers import LAUNCHERS
    from peakmem.jobs.runner import JobSpec, JobSpecError, _is_python

    words = _words(args, shell)
    if not words:
        return None
    if _is_python(words[0]):
        try:
            spec = JobSpec.parse(words)
        except JobSpecError:
            return None  # `python -c ...`, `python --version`
        return shlex.join(spec.command_line())
    if Path(words[0]).name in LAUNCHERS:
        return shlex.join([Path(words[0]).name, *words[1:]])
    return None


_RUNS_CODE = frozenset({"exec", "__import__", "import_module", "run_path", "run_module"})


def beyond_stdlib(code: str) -> bool:
    """Whether a `-c` program imports a module outside the standard library (or runs code it
    loads: exec, runpy, importlib): read with `ast`, never run. A program python cannot compile
    is not (python reports it), nor one that imports peakmem (peakmem's own bootstraps: a
    nested estimate's job process, multiprocessing children already booted)."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    stdlib = getattr(sys, "stdlib_module_names", frozenset())
    beyond = False
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""] if not node.level else ["."]
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
            beyond = beyond or name in _RUNS_CODE
            continue
        else:
            continue
        tops = {name.split(".")[0] for name in names}
        if "peakmem" in tops:
            return False
        beyond = beyond or any(top not in stdlib for top in tops)
    return beyond


def capture_target(words: list[str]) -> Any:
    """The JobSpec a Python command's words run where peakmem captures it (a script, `-m
    module` outside HOST_MODULES, a `-c` program beyond the standard library; not
    HOST_HELPERS), else None."""
    from peakmem.jobs.runner import JobSpec, JobSpecError, _is_python

    if not words or not _is_python(words[0]):
        return None
    try:
        spec = JobSpec.parse(words, allow_code=True)
    except JobSpecError:
        return None  # `python`, `python -`, `python --version`
    if spec.module is not None and spec.module.split(".")[0] in HOST_MODULES:
        return None
    from peakmem.jobs.launchers import LAUNCHERS

    if spec.module is not None and spec.module in LAUNCHERS:  # `-m torch.distributed.run`:
        return None  # a launcher, left alone and noted as `torchrun` is
    if spec.code is not None and not beyond_stdlib(spec.code):
        return None
    if spec.script is not None and host_helper([spec.script]) is not None:
        return None
    return spec


def interpreter_options(words: list[str]) -> list[str]:
    """The interpreter options of a Python command (`-u`, `-X dev`, ...), before its target."""
    from peakmem.jobs.runner import skip_interpreter_options

    rest = skip_interpreter_options(words[1:])
    return words[1:len(words) - len(rest)]


def _src() -> str:
    import peakmem

    return str(Path(peakmem.__file__).resolve().parents[1])


def booted_command(words: list[str], request: str) -> list[str]:
    """The command that runs a Python command's `words` under a capture of its own
    (capture.subprocess_child), reporting as the job's `request` says."""
    return [sys.executable, *interpreter_options(words), "-c", _BOOT.format(src=_src()), request,
            *words[1:]]


def _request() -> str | None:
    """The job's request file where Python subprocesses are captured (None: they are not)."""
    from peakmem.capture import spawned_children

    return spawned_children._CONFIG.get("request")


def rewritten(args: Any, shell: bool = False) -> Any:
    """The Popen `args` that run a Python command under a capture of its own, or None (not a
    Python command peakmem captures; not in a job's process; a shell command that is more than
    one plain command: the PATH shims meet its `python`)."""
    request = _request()
    if request is None:
        return None
    if shell:
        if not isinstance(args, (str, bytes)):
            return None
        text = os.fsdecode(args) if isinstance(args, bytes) else args
        if any(char in SHELL_SYNTAX for char in text.replace("'", "").replace('"', "")):
            return None
    words = _words(args, shell)
    if not words or capture_target(words) is None:
        return None
    command = booted_command(words, request)
    return shlex.join(command) if shell else command


def _launched() -> None:
    from peakmem.capture import spawned_children

    spawned_children._LAUNCHED["subprocess"] += 1


def install_shims(directory: Path, request: str) -> None:
    """`python`, `python3` and `python3.N` first on this process's PATH (the directory the
    fake nvidia-smi is in, already first): each runs the job's interpreter with the subprocess
    bootstrap, which captures the command or runs it unchanged (capture.subprocess_child)."""
    import stat

    directory.mkdir(parents=True, exist_ok=True)
    command = shlex.join([sys.executable, "-c", _BOOT.format(src=_src()), request])
    for name in SHIM_NAMES:
        shim = directory / name
        shim.write_text(f'#!/bin/sh\nexec {command} "$@"\n', encoding="utf-8")
        shim.chmod(shim.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    path = os.environ.get("PATH", "")
    if path.split(os.pathsep)[0] != str(directory):
        os.environ["PATH"] = os.pathsep.join([str(directory), path])


def patches(session: CaptureSession) -> dict[tuple[Any, str], Any]:
    def popen_init(self: subprocess.Popen, args: Any, *rest: Any, **kwargs: Any) -> None:
        shell = bool(kwargs.get("shell", False))
        booted = rewritten(args, shell) if kwargs.get("executable") is None and not rest else None
        if booted is not None:
            args = booted
            _launched()
        else:
            command = python_command(args, shell)
            if command is not None and host_helper(args) is None and (
                    _request() is None or capture_target(_words(args, shell) or []) is None):
                _record(session, command)
        _REAL_INIT(self, args, *rest, **kwargs)

    real_system = os.system

    def system(command: Any) -> int:
        booted = rewritten(command, shell=True)
        if booted is not None:
            _launched()
            return real_system(booted)
        return real_system(command)

    def execv(path: Any, args: Any) -> None:
        _exec(path, args, None)

    def execve(path: Any, args: Any, env: Any) -> None:
        _exec(path, args, env)

    return {(subprocess.Popen, "__init__"): popen_init, (os, "system"): system,
            (os, "execv"): execv, (os, "execve"): execve}


def _exec(path: Any, args: Any, env: Any) -> None:
    """os.execv / os.execve: a Python command re-enters a capture in this same process."""
    words = None
    if _request() is not None:
        try:
            words = [os.fsdecode(path), *(os.fsdecode(word) for word in list(args)[1:])]
        except (TypeError, ValueError):
            words = None
    if not words or capture_target(words) is None:
        if env is None:
            _REAL_EXECV(path, args)
        _REAL_EXECVE(path, args, env)
        return
    command = reentry_command(words)
    if env is None:
        _REAL_EXECV(command[0], command)
    _REAL_EXECVE(command[0], command, env)


def reentry_command(words: list[str]) -> list[str]:
    """What an exec of the Python command `words` runs instead: in the job's own process, the
    job's capture again with the new command (a request of its own, whose result is the job's);
    elsewhere, a subprocess capture. What this process held on the device is reported first,
    as ended now (`method` "exec")."""
    from peakmem.capture import spawned_children
    from peakmem.capture.child import child_command

    config = spawned_children._CONFIG
    report_before_exec(words)
    if config.get("role") != "job" or os.getpid() != config.get("pid"):
        return booted_command(words, config["request"])
    request = json.loads(Path(config["request"]).read_text(encoding="utf-8"))
    spec = capture_target(words)
    request.update(
        argv=spec.command_line(), allow_code=True, start=time.monotonic(),
        notes=[*request.get("notes", []), (
            f"the job replaced its process with `{shlex.join(spec.command_line())[:300]}` "
            "(os.exec*): the estimate is of that program's run in the same process (what ran "
            "before the exec reports its device memory as a process that ended there)")],
    )
    request.pop("request_path", None)
    directory = Path(config["dir"])
    path = directory / f"exec-request-{os.getpid()}-{time.monotonic_ns()}.json"
    path.write_text(json.dumps(request), encoding="utf-8")
    command = child_command(path)
    return [command[0], *interpreter_options(words), *command[1:]]


def report_before_exec(words: list[str]) -> None:
    """The device memory this process's capture holds now, reported as a process that ends
    here (its CUDA context goes with the exec)."""
    import contextlib

    from peakmem.capture import spawned_children
    from peakmem.capture.runner import capture_in_progress
    from peakmem.profiles import load_gpu, load_stack

    snapshot = capture_in_progress()
    if snapshot is None or not spawned_children.used_device(snapshot):
        return
    config = spawned_children._CONFIG
    with contextlib.suppress(Exception):  # the exec goes on whatever happens here
        part = {**config, "method": "exec", "part": f"exec{time.monotonic_ns()}"}
        name = "before os.exec*: " + shlex.join(["python", *sys.argv])
        spawned_children._write_report(snapshot, part, load_gpu(config["gpu"]),
                                       load_stack(config["torch_version"]), 0, name)


def _record(session: CaptureSession, command: str) -> None:
    note = (f"the job started another Python process (`{command}`): it ran outside the fake GPU "
            "and its device memory is not in this estimate; estimate that command itself "
            f"(`peakmem estimate -- {command}`)")
    if note in session.notes:
        return
    session.notes.append(note)
    if not session.failure_hints:
        session.failure_hints.append(
            f"the job started `{command}` in a process of its own, which peakmem does not run "
            f"on the fake GPU: estimate it directly (`peakmem estimate -- {command}`)")
