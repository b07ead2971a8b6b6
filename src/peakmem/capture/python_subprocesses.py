"""Python processes the job starts itself (`subprocess.run([sys.executable, "train.py"])`, a
wrapper that runs `torchrun train.py`): peakmem runs the job's own process on the fake GPU, not
the processes it starts, which run on this machine's real (CPU-only) torch. Their device memory
is not in the estimate; where such a process uses CUDA it fails ("Torch not compiled with CUDA
enabled") and the job with it.

During a capture `subprocess.Popen` (under `subprocess.run`, `check_call`, ...) records each
Python script, module or launcher the job starts: a note says so, and a failed job's one-line
error names the command to estimate instead (`CaptureResult.failure_hint`).

multiprocessing's spawn / forkserver children are not started through Popen and run under the
fake GPU, each reporting its own memory (capture.spawned_children).
"""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path
from typing import Any

from peakmem.capture.session import CaptureSession
from peakmem.shell_words import shell_words

_REAL_INIT = subprocess.Popen.__init__

HOST_HELPERS: dict[str, str] = {
    "cpuinfo/cpuinfo.py": "py-cpuinfo's CPU probe (`cpuinfo.py --json`), which DeepSpeed's CPU "
                          "Adam and accelerator detection start: it reads the CPU's flags",
}
"""Python scripts libraries start for host facts only (no torch, no GPU), by the end of their
path: no note and no failure hint for them (the note would tell the user to estimate a CPU
probe)."""


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


def python_command(args: Any, shell: bool = False) -> str | None:
    """`python train.py ...` / `torchrun ...` for a Popen command that starts a Python job, or
    None (another program, `python -c`, a command peakmem cannot read)."""
    from peakmem.jobs.launchers import LAUNCHERS
    from peakmem.jobs.runner import JobSpec, JobSpecError, _is_python

    try:
        if isinstance(args, (str, bytes, os.PathLike)):
            text = os.fsdecode(args)
            words = shell_words(text) if shell else [text]
        else:
            words = [os.fsdecode(word) for word in args]
    except (TypeError, ValueError):
        return None
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


def patches(session: CaptureSession) -> dict[tuple[Any, str], Any]:
    def popen_init(self: subprocess.Popen, args: Any, *rest: Any, **kwargs: Any) -> None:
        command = python_command(args, bool(kwargs.get("shell", False)))
        if command is not None and host_helper(args) is None:
            _record(session, command)
        _REAL_INIT(self, args, *rest, **kwargs)

    return {(subprocess.Popen, "__init__"): popen_init}


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
