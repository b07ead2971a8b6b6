"""The job's process: capture one unmodified script in a child interpreter and report the result.

Started by :mod:`peakmem.capture.supervised` as ``python -c BOOT REQUEST.json``. The request (written
by peakmem) names the command, the GPU, the torch version, the step limit and the mode. The child
runs the script as ``python script.py`` would (argv, ``sys.path[0]``, cwd and environment
unchanged), captures it in-process (:func:`peakmem.capture.runner.capture_command`) and writes
one result file (:mod:`peakmem.capture.result_io`), from the original process only. It then ends
at once: the job's leftover threads and atexit handlers do not hold it up.

``os._exit(n)`` called by the job in the original process delivers what was captured until then:
with n == 0 the job ended normally (the estimate covers what it ran), otherwise it failed with
reason ``os_exit``. A failure of peakmem's own code here is reported as ``internal``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import peakmem

# sys.path[0] is '' for `python -c` (nothing prepended with -P / PYTHONSAFEPATH): peakmem's source
# directory takes that place until the job's own sys.path[0] replaces it.
_BOOT = (
    "import sys; sys.path[0:int(not sys.flags.safe_path)] = [{src!r}]; "
    "from peakmem.capture.child import main; main(sys.argv[1:])"
)


def child_command(request_path: str | Path) -> list[str]:
    """The command line of a child that runs the request at `request_path`."""
    src = str(Path(peakmem.__file__).resolve().parents[1])
    return [sys.executable, "-c", _BOOT.format(src=src), str(request_path)]


def main(args: list[str]) -> None:
    from peakmem.capture.result_io import encode, encode_internal
    from peakmem.jobs.child import ResultWriter, end_process

    writer: ResultWriter | None = None
    try:
        request = json.loads(Path(args[0]).read_text(encoding="utf-8"))
        request["request_path"] = os.path.abspath(args[0])  # the job's Python subprocesses'
        writer = ResultWriter(request["result"])
        del sys.path[0]  # peakmem's entry: the job's script directory goes there instead
        from peakmem.torch_import_modules import record

        record()  # before the capture's imports: what a plain run has loaded after `import torch`
        result = _run(request, writer)
    except BaseException:  # noqa: BLE001 - peakmem's own failure, reported as internal
        text = traceback.format_exc()
        if writer is not None and writer.in_original_process:
            try:
                writer.write(encode_internal(text, writer.pid))
            except BaseException:  # noqa: BLE001
                sys.stderr.write(text)
                end_process(70)
            end_process(0)
        if writer is None:
            sys.stderr.write(text)
        end_process(70)
        return
    if not writer.in_original_process:  # a fork of the job ran to the end: no second result
        end_process(0)
    try:
        writer.write(encode(result, writer.pid))
    except BaseException as exc:  # noqa: BLE001 - the job broke the way back (deleted the
        # directory, patched json or open): peakmem reports that no result came
        with contextlib.suppress(BaseException):
            os.write(2, f"peakmem: the job's process could not deliver its result "
                        f"({type(exc).__name__})\n".encode())
        end_process(1)
    end_process(0)


def _run(request: dict[str, Any], writer: Any,
         deliver: Callable[[Any], None] | None = None) -> Any:
    """Capture the request's job in this process. `deliver`: what a job that ends its process
    with os._exit(n) delivers (default: its result through `writer`)."""
    import time

    start = float(request.get("start") or time.monotonic())
    from peakmem.capture.result_io import encode
    from peakmem.capture.runner import capture_command, capture_in_progress
    from peakmem.jobs.child import os_exit_hook
    from peakmem.jobs.own_session import own_session_calls
    from peakmem.jobs.runner import JobSpec
    from peakmem.profiles import load_gpu, load_stack

    gpu, stack = load_gpu(request["gpu"]), load_stack(request["torch_version"])
    from peakmem.capture import fake_nvidia_smi, python_subprocesses

    with contextlib.suppress(OSError):  # a directory the job cannot write: no nvidia-smi then
        fake_nvidia_smi.install(
            Path(request["result"]).parent / "bin", gpu.device_name, gpu.total_memory_bytes,
            gpu.capability, stack.driver_version, stack.driver_cuda_version,
        )
        if request.get("request_path"):  # `python ...` through a shell (os.system) captured
            python_subprocesses.install_shims(Path(request["result"]).parent / "bin",
                                              request["request_path"])
    from peakmem.capture import side_effects

    # diverted saves go in the parent's directory: removed with it however the job ends
    side_effects.SCRATCH_PARENT = Path(request["result"]).parent
    argv = list(request["argv"])
    allow_code = bool(request.get("allow_code"))
    spec = JobSpec.parse(argv, allow_code)
    missing = _missing_module(spec) or shadowed_frameworks(spec)
    if missing is not None:
        return _bad_input(ModuleNotFoundError(missing), request["mode"])

    from peakmem.capture import spawned_children

    def on_exit(code: int) -> None:
        snapshot = capture_in_progress()
        if snapshot is None:
            return
        mark_os_exit(snapshot, code)
        spawned_children.attach(snapshot, shutdown=False)
        if snapshot.processes:
            snapshot.trace.meta["process_span"] = [start, time.monotonic()]
        if deliver is not None:
            deliver(snapshot)
            return
        writer.write(encode(snapshot, writer.pid))

    from peakmem.capture.fake_memory import allocator_target
    from peakmem.capture.job_alloc_conf import job_environment

    native_writes: Any = contextlib.nullcontext()
    if request.get("job_files"):  # journal what the job writes: peakmem puts it back afterwards
        from peakmem.capture.native_writes import journal_native_writes
        from peakmem.jobs.file_journal import install

        install(request["job_files"], exempt=[Path(request["result"]).parent])
        native_writes = journal_native_writes()
    from peakmem.inputs import InputError

    # the job's spawn / forkserver children run under the fake GPU too, reporting here
    spawned_children.configure(Path(request["result"]).parent, gpu.name, request["torch_version"],
                               request["mode"], request.get("request_path"),
                               request.get("role", "job"))
    try:
        with os_exit_hook(writer, on_exit), own_session_calls(), native_writes, job_environment(
            request.get("alloc_conf"), request["torch_version"]
        ), allocator_target(request.get("alloc_conf"), request["torch_version"]):
            result = capture_command(
                argv, gpu=gpu, stack=stack, steps=request["steps"], mode=request["mode"],
                allow_code=allow_code,
            )
        spawned_children.attach(result)
        result.notes[:0] = [str(note) for note in request.get("notes", [])]
        if result.processes:  # when this process ran, against its children's spans
            result.trace.meta["process_span"] = [start, time.monotonic()]
        return result
    except InputError as exc:  # a setting read in the job's process (an `env NAME=VALUE`
        # prefix's PEAKMEM_TRANSFORMERS_RELEASE) refused before the job ran: was internal (70)
        return _bad_input(exc, request["mode"])


def _bad_input(error: Exception, mode: str) -> Any:
    """The result of a job refused before it ran: one line naming the input, exit 2."""
    from peakmem.capture.runner import CaptureResult

    return CaptureResult(
        trace=_empty_trace(), steps=0, stopped=False, forward_calls=0, seconds=0, mode=mode,
        error=error, error_text=str(error), exit_code=1, reason="bad_input",
    )


def mark_os_exit(result: Any, code: Any) -> None:
    """The job ended its process with os._exit(code) in the middle of the capture."""
    result.job_exit_code = code if type(code) is int else None
    if code == 0:
        result.notes.append(
            "the job ended its own process with os._exit(0): the estimate covers what it ran "
            "until then"
        )
        return
    from peakmem.capture.result_io import JobError

    result.error = JobError("os._exit", f"os._exit({code!r})")
    result.error_type = None
    result.exit_code, result.reason = 1, "os_exit"
    result.error_text = f"the job ended its process with os._exit({code!r}) before the estimate"


def _missing_module(spec: Any) -> str | None:
    """For `-m module`: a one-line reason when the module's top-level package cannot be found
    (found without importing anything: a package's own code runs under the capture only)."""
    if spec.module is None:
        return None
    import os

    top = spec.module.split(".")[0]
    sys.path.insert(0, os.getcwd())  # as `python -m` would see it
    try:
        found = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        found = None
    finally:
        del sys.path[0]
    return None if found is not None else f"no module named {top!r} (python -m {spec.module})"


SHADOW_CHECKED = (
    "torch", "torchgen", "numpy", "typing_extensions", "sympy", "mpmath", "filelock", "fsspec",
    "jinja2", "markupsafe", "networkx",
)
"""Frameworks peakmem (or torch's import) has loaded before the job starts: a module of the same
name in the job's own sys.path[0] is what `python train.py` would import instead, but the job
here would get peakmem's copy and be estimated as a run that cannot happen. The standard
library's modules are checked the same way (`shadow_candidates`); peakmem's own dependencies
(click, ...) are not: a plain run imports those only where the job does."""


def shadow_candidates() -> list[str]:
    """Top-level modules loaded in this process now that `python train.py` would look for on its
    sys.path at run time: the frameworks (SHADOW_CHECKED) and the standard library's modules,
    less those the interpreter had loaded at its start (peakmem.startup_modules: a plain run has
    them before the script's directory joins sys.path) and the built-in and frozen ones (found
    before any path entry)."""
    from peakmem.startup_modules import MODULES
    from peakmem.torch_import_modules import recorded

    stdlib = getattr(sys, "stdlib_module_names", frozenset())
    # where the child recorded them, only the modules loaded by torch's import count: those
    # that peakmem's own modules load (cProfile, statistics, secrets, tomllib, ...) a plain run
    # never looks for unless the job imports them itself
    after_torch = recorded()
    names = []
    for name, module in list(sys.modules.items()):
        if "." in name or name in MODULES or name.startswith("_") or module is None:
            continue
        if after_torch is not None and name not in after_torch:
            continue
        if name not in SHADOW_CHECKED and name not in stdlib:
            continue
        origin = getattr(getattr(module, "__spec__", None), "origin", None)
        if name in sys.builtin_module_names or origin in {"built-in", "frozen"}:
            continue
        names.append(name)
    return sorted(names)


def shadowed_frameworks(spec: Any) -> str | None:
    """A one-line reason when the job's sys.path[0] (the script's directory, or the cwd for
    `-m`) holds a module that shadows one peakmem has loaded (`shadow_candidates`: a local
    torch.py or torch/, a local dataclasses.py, ...)."""
    import importlib.machinery

    if sys.flags.safe_path:  # python -P / PYTHONSAFEPATH: no script directory on sys.path
        return None
    if spec.script is not None:
        script = os.path.abspath(spec.script)
        first = os.path.dirname(script) if os.path.isfile(script) else script
    else:
        first = os.getcwd()
    for name in shadow_candidates():
        loaded = sys.modules.get(name)
        try:
            local = importlib.machinery.PathFinder.find_spec(name, [first])
        except (ImportError, ValueError, OSError):
            local = None
        if local is None or loaded is None:
            continue
        where = local.origin if local.has_location else None  # None: a namespace directory
        # (a plain `torch/` folder), which python passes over for the installed package
        if where is None or _same_file(where, getattr(loaded, "__file__", None)):
            continue
        what = "the installed" if name in SHADOW_CHECKED else "the standard library's"
        return (f"{where} shadows {what} {name}: `python` would import it instead of {name} "
                f"for this job wherever the job or torch imports {name} (rename it)")
    return None


def _same_file(path: str, other: str | None) -> bool:
    return other is not None and os.path.realpath(path) == os.path.realpath(other)


def _empty_trace() -> Any:
    from peakmem.trace.events import Trace

    return Trace()
