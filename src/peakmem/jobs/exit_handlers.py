"""The job's `atexit` handlers, run where `python train.py` runs them: when the script ends.

peakmem's child ends its process at once after the capture (`os._exit`, so that leftover threads
cannot hold it up), which would skip every handler the job registered, and with it what they
do on the device (a checkpoint saved from GPU tensors, a final evaluation, `empty_cache`).
While the job runs, :func:`job_exit_handlers` keeps the functions the job's own code registers
(defined outside the standard library, site-packages and peakmem) in a list of its own; when the
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
        if not is_job_code(func):
            return _REAL_REGISTER(func, *args, **kwargs)
        self.handlers.append((func, args, kwargs))
        return func  # atexit.register returns the function (decorator use)

    def unregister(self, func: Callable[..., Any], /) -> None:
        self.handlers = [entry for entry in self.handlers if entry[0] != func]

    def run(self) -> int:
        """Run every handler, last registered first; the number run."""
        count = 0
        while self.handlers:
            func, args, kwargs = self.handlers.pop()
            count += 1
            try:
                func(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - the interpreter prints and goes on
                from peakmem.jobs.runner import user_traceback  # the job's frames only

                try:
                    name = repr(func)
                except Exception:  # noqa: BLE001 - a hostile __repr__
                    name = f"<{type(func).__name__} object>"
                print(f"Exception ignored in atexit callback: {name}\n{user_traceback(exc)}",
                      end="", file=sys.stderr)
        return count



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
    filename = os.path.realpath(code.co_filename)
    return os.path.isabs(code.co_filename) and not filename.startswith(_LIBRARY_DIRS)


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
