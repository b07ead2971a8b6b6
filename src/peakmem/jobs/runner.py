"""Run a user's unmodified training script in this process, as `python script.py args` or
`python -m module args` would, optionally stopping it after N optimizer steps.

The script sees the ``sys.argv`` and ``sys.path[0]`` that ``python`` would give it and runs as
``__main__``. Everything it raises is caught and reported as a :class:`JobOutcome`: the clean stop
(:mod:`peakmem.jobs.stop`), a ``SystemExit``, a timeout, or the user's own exception with a
traceback trimmed to the user's frames. Nothing here needs a GPU.
"""

from __future__ import annotations

import builtins
import errno
import importlib.machinery
import importlib.util
import marshal
import os
import runpy
import shutil
import signal
import sys
import threading
import time
import traceback
import types
import zipfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from peakmem.jobs.launchers import APPEND_CWD_ENV
from peakmem.jobs.stop import OnStep, StepLimitReached, stop_after_steps

_PYTHON_NAMES = ("python", "python3")
_IGNORED_PYTHON_FLAGS = frozenset({"-u", "-B", "-O", "-OO", "-s", "-E", "-I"})
_IGNORED_PYTHON_OPTIONS = frozenset({"-W", "-X"})
"""Interpreter options with a value that peakmem's child does not apply (warning filters,
implementation options)."""


class JobSpecError(ValueError):
    """The command line does not name a Python script or module."""


@dataclass(frozen=True)
class JobSpec:
    """What to run: a script path or a module name, and the arguments it receives."""

    script: str | None = None
    module: str | None = None
    args: tuple[str, ...] = ()
    code: str | None = None
    """`python -c CODE`: only where the parse allowed it (`allow_code`: the Python processes a
    job starts itself, capture.python_subprocesses); `peakmem estimate` takes a script or -m."""

    def __post_init__(self) -> None:
        if sum(value is not None for value in (self.script, self.module, self.code)) != 1:
            raise JobSpecError("give exactly one of a script path or a module (-m)")

    @property
    def argv0(self) -> str:
        if self.code is not None:
            return "-c"
        return self.script if self.script is not None else f"-m {self.module}"

    def command_line(self) -> list[str]:
        """The equivalent ``python ...`` command, for logs and CSV rows."""
        if self.code is not None:
            return ["python", "-c", self.code, *self.args]
        head = [self.script] if self.script is not None else ["-m", str(self.module)]
        return ["python", *head, *self.args]

    @classmethod
    def parse(cls, argv: Sequence[str], allow_code: bool = False) -> JobSpec:
        """Parse ``python train.py a b``, ``python -m pkg.mod a``, ``train.py a`` or ``-m mod a``
        (and ``python -c CODE a`` where `allow_code`)."""
        words = list(argv)
        if words and _is_python(words[0]):
            words = words[1:]
        words = skip_interpreter_options(words)
        if not words:
            raise JobSpecError("no script given: expected `python train.py [args]` or `-m module`")
        first = words[0]
        if first == "-m":
            if len(words) < 2:
                raise JobSpecError("`-m` needs a module name")
            return cls(module=words[1], args=tuple(words[2:]))
        if first.startswith("-m") and len(first) > 2:
            return cls(module=first[2:], args=tuple(words[1:]))
        if allow_code and first == "-c" and len(words) > 1:
            return cls(code=words[1], args=tuple(words[2:]))
        if allow_code and first.startswith("-c") and len(first) > 2:
            return cls(code=first[2:], args=tuple(words[1:]))
        if first.startswith("-"):
            raise JobSpecError(f"unsupported python option {first!r}: give a script or -m module")
        return cls(script=first, args=tuple(words[1:]))


def skip_interpreter_options(words: Sequence[str]) -> list[str]:
    """The words after the interpreter options peakmem's child does not apply (`-u`, `-B`,
    `-O`, `-W ignore`, `-Wignore`, `-X dev`, ...): what `python OPTIONS ...` runs."""
    words = list(words)
    while words:
        if words[0] in _IGNORED_PYTHON_FLAGS:
            words = words[1:]
        elif words[0] in _IGNORED_PYTHON_OPTIONS and len(words) > 1:
            words = words[2:]  # `-W ignore`, `-X dev`: no bearing on device memory
        elif words[0][:2] in _IGNORED_PYTHON_OPTIONS and len(words[0]) > 2:
            words = words[1:]  # `-Wignore`, `-Xutf8`
        else:
            break
    return words


def missing_script(path: str) -> str:
    """The message for a script that is not there; a program on PATH given in its place
    (`bash -c ...`, `make train`) is named as such."""
    message = f"script not found: {path}"
    if os.path.isdir(path):  # python: "can't find '__main__' module in 'DIR'"
        return f"{message} (a directory without a __main__.py)"
    if os.path.islink(path):
        return f"{message} ({_dangling_link(path)})"
    if not path.endswith(".py") and os.sep not in path and shutil.which(path) is not None:
        message += (f" ({path} is a program, not a Python script: peakmem runs `python "
                    "train.py [args]`, `python -m module` or torchrun / accelerate launch / "
                    "deepspeed / fabric run / trl sft)")
    return message


def _dangling_link(path: str) -> str:
    """Why the symlink `path` leads to no file: a loop (ELOOP), or a missing target."""
    try:
        os.stat(path)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "a symlink loop"
    return f"a symlink to {os.readlink(path)!r}, which is not there"


def script_exists(path: str) -> bool:
    """What `python PATH` can run: a file, or a directory / zip file with a __main__.py."""
    # os.path's tests, not Path's: a name too long for the file system (ENAMETOOLONG) or with
    # a NUL byte is no script either, where Path.is_file raises
    return os.path.isfile(path) or (os.path.isdir(path)
                                    and os.path.isfile(os.path.join(path, "__main__.py")))


def _runs_as_file(path: str) -> bool:
    return os.path.isfile(path) and not zipfile.is_zipfile(path)


def _is_python(word: str) -> bool:
    name = Path(word).name
    return word == sys.executable or name in _PYTHON_NAMES or name.startswith("python3.")


class JobStatus(StrEnum):
    STOPPED = "stopped"  # reached the optimizer step limit
    FINISHED = "finished"  # the script returned or called sys.exit(0)
    ERROR = "error"  # the script raised, or exited non-zero
    TIMEOUT = "timeout"  # ran past the time limit


@dataclass
class JobOutcome:
    status: JobStatus
    steps: int
    seconds: float
    exit_code: int = 0
    error: BaseException | None = field(default=None, repr=False)
    traceback_text: str = ""

    @property
    def ok(self) -> bool:
        return self.status in (JobStatus.STOPPED, JobStatus.FINISHED)


class JobTimeout(BaseException):  # noqa: N818 - a control-flow signal
    """Raised in the main thread when the time limit expires."""


def run_job(
    spec: JobSpec,
    *,
    steps: int | None = None,
    timeout: float | None = None,
    on_step: OnStep | None = None,
) -> JobOutcome:
    """Run the job in this process; stop after ``steps`` optimizer steps (None: run to the end).

    ``timeout`` (seconds) needs the main thread (it uses ``SIGALRM``).
    """
    if spec.script is not None and not script_exists(spec.script):
        raise JobSpecError(missing_script(spec.script))
    started = time.perf_counter()
    counter_steps = 0
    try:
        with (
            script_environment(spec),
            time_limit(timeout),
            stop_after_steps(steps, on_step=on_step) as counter,
        ):
            try:
                execute(spec)
            finally:
                counter_steps = counter.steps
    except StepLimitReached as stop:
        return JobOutcome(JobStatus.STOPPED, stop.steps, time.perf_counter() - started)
    except JobTimeout as exc:
        return JobOutcome(
            JobStatus.TIMEOUT,
            counter_steps,
            time.perf_counter() - started,
            exit_code=124,
            error=exc,
        )
    except SystemExit as exc:
        code = _exit_code(exc)
        status = JobStatus.FINISHED if code == 0 else JobStatus.ERROR
        return JobOutcome(status, counter_steps, time.perf_counter() - started, code, error=exc)
    except BaseException as exc:  # the user's exception, KeyboardInterrupt included
        return JobOutcome(
            JobStatus.ERROR,
            counter_steps,
            time.perf_counter() - started,
            exit_code=1,
            error=exc,
            traceback_text=user_traceback(exc),
        )
    return JobOutcome(JobStatus.FINISHED, counter_steps, time.perf_counter() - started)


def execute(spec: JobSpec) -> None:
    """Run the script or module as `__main__` (argv and sys.path set by script_environment)."""
    if spec.code is not None:
        run_code(spec.code)
    elif spec.script is not None:
        if _runs_as_file(spec.script):
            run_script_file(spec.script)
        else:  # a directory or zip file with a __main__.py
            runpy.run_path(spec.script, run_name="__main__")
    else:
        runpy.run_module(str(spec.module), run_name="__main__", alter_sys=True)


def run_code(source: str) -> None:
    """Run `python -c SOURCE`'s program: `__main__` without a `__file__`, compiled as
    "<string>"."""
    code = compile(source, "<string>", "exec", dont_inherit=True)
    _exec_as_main(code, __loader__=importlib.machinery.BuiltinImporter)


def _exec_as_main(code: types.CodeType, **names: object) -> None:
    """Run `code` as a fresh `__main__` module holding `names` (sys.modules' own `__main__`
    while it runs, put back after)."""
    module = types.ModuleType("__main__")
    module.__dict__.update(__builtins__=builtins, __spec__=None, __package__=None, **names)
    saved = sys.modules.get("__main__")
    sys.modules["__main__"] = module
    try:
        exec(code, module.__dict__)
    finally:
        if saved is not None:
            sys.modules["__main__"] = saved


def run_script_file(path: str) -> None:
    """Run a script file as `python path` does: `__main__` with an absolute `__file__` (python
    3.9+), sys.argv[0] left as given (runpy.run_path would set both to the same string)."""
    filename = os.path.abspath(path)
    with open(filename, "rb") as handle:
        source = handle.read()
    if is_compiled_script(filename, source):  # `python train.pyc`: the code python compiled
        code = compiled_script_code(source)
        loader = importlib.machinery.SourcelessFileLoader("__main__", filename)
    else:
        code = compile(source, filename, "exec", dont_inherit=True)
        loader = importlib.machinery.SourceFileLoader("__main__", filename)
    _exec_as_main(code, __file__=filename, __cached__=None, __loader__=loader)


def is_compiled_script(filename: str, data: bytes) -> bool:
    """Whether `python FILE` runs FILE as compiled code (CPython's `maybe_pyc_file`): a name
    ending in .pyc, or a file whose first two bytes are the magic number's."""
    return filename.endswith(".pyc") or data[:2] == importlib.util.MAGIC_NUMBER[:2]


def compiled_script_code(data: bytes) -> types.CodeType:
    """The code of a .pyc file's bytes as `python train.pyc` runs it (CPython's `run_pyc_file`:
    the magic number, three header words, the marshalled code), refused as python refuses it:
    RuntimeError `Bad magic number in .pyc file` / `Bad code object in .pyc file`."""
    if data[:4] != importlib.util.MAGIC_NUMBER:
        raise RuntimeError("Bad magic number in .pyc file")
    try:
        code = marshal.loads(data[16:])
    except (EOFError, ValueError, TypeError):
        code = None
    if not isinstance(code, types.CodeType):
        raise RuntimeError("Bad code object in .pyc file")
    return code


def _exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    return 1  # sys.exit("message")


@contextmanager
def script_environment(spec: JobSpec) -> Iterator[None]:
    """Set sys.argv and sys.path[0] as `python` would (and append the cwd where the launcher
    did, APPEND_CWD_ENV); restore both afterwards, peakmem's own modules in sys.modules, and
    the environment variables (a job's `os.environ["CUDA_VISIBLE_DEVICES"] = "3"` must not
    reach the next job run in this process: its own process would start without it)."""
    saved_argv, saved_path = sys.argv[:], sys.path[:]
    saved_environ = dict(os.environ)
    saved_modules = _own_modules()
    before = set(sys.modules)
    script_dir: str | None = None
    if spec.code is not None:
        sys.argv = ["-c", *spec.args]
        if not sys.flags.safe_path:  # python -c puts the current directory first ('')
            sys.path.insert(0, "")
    elif spec.script is not None:
        sys.argv = [spec.script, *spec.args]
        if _runs_as_file(spec.script):  # a directory or zip: runpy puts it on sys.path itself
            script_dir = str(Path(spec.script).resolve().parent)
            sys.path.insert(0, script_dir)
    else:
        sys.argv = [str(spec.module), *spec.args]  # runpy replaces argv[0] with the file
        sys.path.insert(0, os.getcwd())
    if os.environ.get(APPEND_CWD_ENV) == "1":  # the launcher's own sys.path entry (tune run)
        sys.path.append(os.getcwd())
    try:
        yield
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
        _restore_environ(saved_environ)
        _restore_own_modules(saved_modules)
        if script_dir is not None:
            _forget_script_modules(script_dir, before)


def _restore_environ(saved: dict[str, str]) -> None:
    """`os.environ` as it was (`saved`): what the job added removed, what it changed or removed
    put back; untouched variables are not rewritten."""
    for name in [name for name in os.environ if name not in saved]:
        os.environ.pop(name, None)
    for name, value in saved.items():
        if os.environ.get(name) != value:
            os.environ[name] = value


def _forget_script_modules(script_dir: str, before: set[str]) -> None:
    """Drop from sys.modules what the job imported from its script's directory (its
    `model.py`, `previous_chapters.py`): a later job run in this process from another
    directory imports its own file of that name, as `python` would, instead of getting the
    earlier job's module (an ImportError, or the other script's code). peakmem's own modules,
    submodules of packages imported before the job (a script run from inside an installed
    package: its package stays whole) and everything imported from elsewhere stay."""
    root = os.path.join(os.path.normcase(os.path.abspath(script_dir)), "")
    for name in [name for name in list(sys.modules) if name not in before]:
        if name.partition(".")[0] in before or name in ("peakmem", "__main__"):
            continue
        path = getattr(sys.modules.get(name), "__file__", None)
        if isinstance(path, str) and os.path.normcase(os.path.abspath(path)).startswith(root):
            sys.modules.pop(name, None)


def _own_modules() -> dict[str, types.ModuleType]:
    return {name: module for name, module in list(sys.modules.items())
            if (name == "peakmem" or name.startswith("peakmem."))
            and isinstance(module, types.ModuleType)}


def _restore_own_modules(saved: dict[str, types.ModuleType]) -> None:
    """Put back peakmem's modules as they were before the job: a job that removed them from
    sys.modules or blocked them (`sys.modules[name] = None`, harmless under python) made
    peakmem's imports after the job fail (no result), or load second copies."""
    for name in [name for name in list(sys.modules)
                 if (name == "peakmem" or name.startswith("peakmem.")) and name not in saved
                 and not isinstance(sys.modules.get(name), types.ModuleType)]:
        sys.modules.pop(name, None)
    for name, module in saved.items():
        if sys.modules.get(name) is not module:
            sys.modules[name] = module


TIME_LIMIT_RETRY_S = 1.0
"""After the time limit, its JobTimeout is raised again this often until the job has ended."""


@contextmanager
def time_limit(seconds: float | None) -> Iterator[None]:
    """Raise JobTimeout in the main thread after `seconds` (None: no limit)."""
    if seconds is None:
        yield
        return
    if seconds <= 0:
        raise ValueError(f"the timeout must be positive, got {seconds}")
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError("a job timeout needs the main thread")

    def _expire(signum: int, frame: object) -> None:
        if isinstance(sys.exc_info()[1], JobTimeout):
            return  # the limit's exception is on its way out (finally blocks, __exit__s)
        raise JobTimeout(f"ran past the time limit of {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, _expire)
    # repeated every TIME_LIMIT_RETRY_S: an exception raised where Python only prints it
    # ("Exception ignored in": a weakref callback, __del__, a GC callback) does not end the
    # job, and a one-shot alarm left it running to its end
    signal.setitimer(signal.ITIMER_REAL, seconds, TIME_LIMIT_RETRY_S)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


_PACKAGE_DIR = str(Path(__file__).resolve().parents[1])
TRACEBACK_FRAMES = 1000
"""The innermost frames of a job's traceback that are kept (python's own default,
``sys.tracebacklimit``): a recursion a million frames deep is formatted in milliseconds, not
minutes."""


def user_traceback(exc: BaseException) -> str:
    """The traceback of ``exc`` as the job's author would want it: without runpy's frames and
    without peakmem's own (runner, capture hooks, fake device); the innermost TRACEBACK_FRAMES
    frames of each exception in the chain, as python prints them."""
    with _innermost_frames(exc, TRACEBACK_FRAMES):
        tb = traceback.TracebackException.from_exception(exc)
    tb.stack = traceback.StackSummary.from_list(
        [frame for frame in tb.stack if not _is_runner_frame(frame.filename)]
    )
    return "".join(tb.format())


@contextmanager
def _innermost_frames(exc: BaseException, keep: int) -> Iterator[None]:
    """While the block runs, every exception of `exc`'s chain carries only its innermost `keep`
    traceback entries (traceback's own `limit` still walks, and looks up the source position
    of, every frame)."""
    saved: list[tuple[BaseException, types.TracebackType | None]] = []
    seen: set[int] = set()
    pending: list[BaseException | None] = [exc]
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        tb = current.__traceback__
        depth, walker = 0, tb
        while walker is not None:
            depth, walker = depth + 1, walker.tb_next
        if depth > keep:
            trimmed = tb
            for _ in range(depth - keep):
                trimmed = trimmed.tb_next
            saved.append((current, tb))
            current.__traceback__ = trimmed
        pending += [current.__cause__, current.__context__]
    try:
        yield
    finally:
        for current, tb in saved:
            current.__traceback__ = tb


def _is_runner_frame(filename: str) -> bool:
    return (
        filename.startswith("<frozen runpy")
        or Path(filename).name == "runpy.py"
        or os.path.abspath(filename).startswith(_PACKAGE_DIR)
    )
