"""The child side of a Python process the job starts itself (capture.python_subprocesses):
`python [options] -c BOOT REQUEST WORDS...`, where WORDS are the command's words after its
interpreter and REQUEST is the job's own request file (capture.child).

`main` decides first, importing neither torch nor the capture: a command peakmem does not
capture (`python --version`, `python -`, a standard-library-only `-c` program, a host helper)
is run unchanged by the real interpreter (os.execv, same pid). Otherwise the command is
captured in this process as the job's own is (`capture.child._run` with the job's request, this
command's argv and `role` "subprocess": the job's GPU, torch version, mode, step limit,
allocator configuration and file journal; its own spawn children and Python subprocesses are
captured too and report beside it). Afterwards the process writes one report
(spawned_children's format, `method` "subprocess": its own device memory, when it was alive,
its optimizer steps), prints the job's error as python would (the traceback, or peakmem's
one-line reason) and ends with the status python would have given: 0, sys.exit's code,
os._exit's, 1 after an error. The job's process reads the reports when its job ends
(`spawned_children.attach`).
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any


def main(args: list[str]) -> None:
    start = time.monotonic()
    del sys.path[0]  # peakmem's entry, in place of python -c's ''
    request_path, words = args[0], ["python", *args[1:]]
    from peakmem.capture.python_subprocesses import capture_target

    spec = capture_target(words)
    if spec is None:  # not captured: the command as it was, in this process
        sys.stdout.flush()
        os.execv(sys.executable, [sys.executable, *args[1:]])
    from peakmem.jobs.child import ResultWriter, end_process

    request = json.loads(Path(request_path).read_text(encoding="utf-8"))
    directory = Path(request["result"]).parent
    name = shlex.join(spec.command_line())
    request.update(
        argv=spec.command_line(), allow_code=True, role="subprocess", start=start,
        request_path=request_path, notes=[],
        # (the file the os._exit hook guards; the report is what is delivered)
        result=str(directory / f".subprocess-{os.getpid()}.result"),
    )
    writer = ResultWriter(request["result"])
    config = {"dir": str(directory), "gpu": request["gpu"],
              "torch_version": request["torch_version"], "mode": request["mode"],
              "method": "subprocess", "start": start}
    from peakmem.capture.child import _run
    from peakmem.profiles import load_gpu, load_stack

    gpu, stack = load_gpu(request["gpu"]), load_stack(request["torch_version"])

    def deliver(result: Any) -> None:  # os._exit(n) in the middle of the run
        _report(result, config, gpu, stack, result.job_exit_code or 0, name)

    try:
        result = _run(request, writer, deliver)
    except BaseException as exc:  # noqa: BLE001 - peakmem's own failure: as an error of the run
        with contextlib.suppress(BaseException):
            sys.stderr.write(f"peakmem: the captured subprocess `{name[:200]}` failed in "
                             f"peakmem ({type(exc).__name__}: {exc})\n")
        end_process(1)
        return
    code = exit_status(result)
    if code and result.reason != "exit":
        with contextlib.suppress(BaseException):
            sys.stderr.write((result.error_text or "").rstrip() + "\n")
    _report(result, config, gpu, stack, code, name)
    with contextlib.suppress(BaseException):
        writer_file = Path(request["result"])
        for leftover in (writer_file, writer_file.with_name(f".{writer_file.name}."
                                                            f"{os.getpid()}.tmp")):
            leftover.unlink(missing_ok=True)
    end_process(code)


def exit_status(result: Any) -> int:
    """The status `python COMMAND` would end with after this run: 0 (ended, or stopped after
    the step limit), sys.exit's code, 124 for peakmem's time limit, 1 after an error."""
    if result.error is None:
        return 0
    if result.reason in ("exit", "os_exit") and type(result.job_exit_code) is int:
        return result.job_exit_code & 0xFF if result.job_exit_code >= 0 else 255
    if result.reason == "timeout":
        return 124
    return 1


def _report(result: Any, config: dict[str, Any], gpu: Any, stack: Any, code: int,
            name: str) -> None:
    from peakmem.capture import spawned_children

    with contextlib.suppress(BaseException):
        spawned_children._write_report(result, config, gpu, stack, code, name)
