"""The job's `atexit` handlers, run where `python train.py` runs them: when the script ends.

peakmem's child ends its process at once after the capture (`os._exit`, so that leftover threads
cannot hold it up), which would skip every handler the job registered, and with it what they
do on the device (a checkpoint saved from GPU tensors, a final evaluation, `empty_cache`).
While the job runs, :func:`job_exit_handlers` keeps the functions the job's own code registers
(defined, or registered by code, outside the standard library, site-packages and peakmem: a
builtin the script registers, `atexit.register(os._exit, 5)`, is the job's) in a list of its own; when the
script ends normally (it returns, or `sys.exit(0)`) they are run last-registered first, inside
the capture, as the interpreter would: an exception from one is printed (`Exception ignored in
atexit callback`) and the next one runs. peakmem's control-flow exceptions (a time limit, a step
limit) are not caught. After a failed run they are dropped (there is no fake device left to run
them on). Libraries' handlers (a multiprocessing pool's, a logger's) go to the real `atexit` as
before: run in the job's process they would end state the host process still uses.
"""

from __future__ import annotations

import atexit
import functools
import os
import sys
import sysconfig
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any


@dataclass
class ExitHandlers:
    """The handlers the job registered, in registration order."""

    handlers: list[tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]] = field(
        default_factory=list)

    def register(self, func: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        # the job's handler: one it defined, or one its own code registers (a builtin or a
        # library's function: `atexit.register(os._exit, 5)`, `atexit.register(torch.save, ...)`)
        if not (is_job_code(func) or is_job_file(sys._getframe(1).f_code.co_filename)):
            return _REAL_REGISTER(func, *args, **kwargs)
        self.handlers.append((func, args, kwargs))
        return func  # atexit.register returns the function (decorator use)

    def unregister(self, func: Callable[..., Any], /) -> None:
        self.handlers = [entry for entry in self.handlers if entry[0] != func]

    def run(self) -> int:
        """Run every handler, last registered first; the number run. One that runs past
        :func:`handler_seconds` is stopped (python would wait for it for ever; the capture is
        done by then): a line on stderr says so."""
        count = 0
        limit = handler_seconds()
        while self.handlers:
            func, args, kwargs = self.handlers.pop()
            count += 1
            try:
                with _time_limit(limit):
                    func(*args, **kwargs)
            except HandlerTimeout:
                print(f"peakmem: the job's atexit callback {_name(func)} ran past {limit:g} s "
                      f"and was stopped (python would wait for it; {HANDLER_SECONDS_ENV} sets "
                      "the limit): the estimate covers what it ran until then", file=sys.stderr)
            except Exception as exc:  # noqa: BLE001 - the interpreter prints and goes on
                from peakmem.jobs.runner import user_traceback  # the job's frames only

                print(f"Exception ignored in atexit callback: {_name(func)}\n"
                      f"{user_traceback(exc)}", end="", file=sys.stderr)
        return count


HANDLER_SECONDS_ENV = "PEAKMEM_ATEXIT_SECONDS"
DEFAULT_HANDLER_SECONDS = 120.0
"""How long one of the job's atexit handlers may run (a final evaluation, a checkpoint)."""


class HandlerTimeout(BaseException):  # noqa: N818 - a control-flow signal
    """Raised in the handler that ran past the limit (a BaseException: the job's `except
    Exception` does not swallow it; raised again each second for one that catches it)."""


def handler_seconds(env: Any = None) -> float:
    """PEAKMEM_ATEXIT_SECONDS (a positive number of seconds), else DEFAULT_HANDLER_SECONDS."""
    text = (os.environ if env is None else env).get(HANDLER_SECONDS_ENV, "")
    try:
        seconds = float(text)
    except ValueError:
        return DEFAULT_HANDLER_SECONDS
    return seconds if 0 < seconds < 1e6 else DEFAULT_HANDLER_SECONDS


@contextmanager
def _time_limit(seconds: float) -> Iterator[None]:
    """HandlerTimeout in the main thread after `seconds`, again every second; nothing where
    SIGALRM is not there or not ours to take (another thread; a time limit already running)."""
    import signal
    import threading

    if (not hasattr(signal, "setitimer") or threading.current_thread()
            is not threading.main_thread() or signal.getitimer(signal.ITIMER_REAL)[0] > 0):
        yield
        return

    def expire(signum: int, frame: object) -> None:
        raise HandlerTimeout

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds, 1.0)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, signal.SIG_DFL if previous is None else previous)


def _name(func: Any) -> str:
    try:
        return repr(func)
    except Exception:  # noqa: BLE001 - a hostile __repr__
        return f"<{type(func).__name__} object>"



_REAL_REGISTER = atexit.register
_REAL_UNREGISTER = atexit.unregister
_LIBRARY_DIRS = tuple(
    os.path.realpath(path) + os.sep
    for path in {*(sysconfig.get_paths().get(name) for name in ("stdlib", "platstdlib",
                                                                 "purelib", "platlib")),
                 os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}
    if path
)


def is_job_code(func: Any) -> bool:
    """Whether `func` is defined in the job's own files (not the standard library, an installed
    package or peakmem); a builtin or a callable without code is a library's."""
    while isinstance(func, functools.partial):
        func = func.func
    func = getattr(func, "__func__", func)  # a bound method
    code = getattr(func, "__code__", None)
    if code is None:
        return False
    return is_job_file(code.co_filename)


@functools.lru_cache(maxsize=4096)
def is_job_file(filename: str) -> bool:
    """Whether code of `filename` is the job's own (an absolute path outside the standard
    library, the installed packages and peakmem)."""
    return os.path.isabs(filename) and not os.path.realpath(filename).startswith(_LIBRARY_DIRS)


@contextmanager
def job_exit_handlers() -> Iterator[ExitHandlers]:
    """`atexit.register` / `unregister` redirected to an ExitHandlers for the duration; the
    caller runs them (`run`) when the job ended normally. Whatever is left at the end is
    dropped."""
    kept = ExitHandlers()

    def unregister(func: Callable[..., Any], /) -> None:
        kept.unregister(func)
        _REAL_UNREGISTER(func)  # one registered before the job

    atexit.register, atexit.unregister = kept.register, unregister
    try:
        yield kept
    finally:
        atexit.register, atexit.unregister = _REAL_REGISTER, _REAL_UNREGISTER
        kept.handlers.clear()


def ended_normally(exc: BaseException | None) -> bool:
    """Whether the script ended as one whose atexit handlers run and whose run is a success:
    it returned, or exited with status 0 (`sys.exit()`, `sys.exit(0)`)."""
    if exc is None:
        return True
    code = exc.code if isinstance(exc, SystemExit) else 1
    # int's own __index__: a hostile int subclass's __eq__ / __int__ is never called
    return code is None or (isinstance(code, int) and int.__index__(code) == 0)
