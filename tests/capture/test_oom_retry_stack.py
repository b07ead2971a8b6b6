"""capture.oom_retry's stack walk: a retry loop's frame anywhere on the stack is found, other
frames are not taken for one, and the walk is skipped while no retry loop's file is loaded."""

from __future__ import annotations

import os
import sys
import types

import pytest

from peakmem.capture import oom_retry

ACCELERATE_FILE = os.path.join(os.sep, "site", "accelerate", "utils", "memory.py")
LIGHTNING_FILE = os.path.join(os.sep, "site", "lightning", "pytorch", "tuner", "batch_size_scaling.py")

SOURCE = '''
def find_executable_batch_size(inner):
    def decorator():
        return inner()
    return decorator

def _run_power_scaling(inner):
    return inner()

def unrelated(inner):
    return inner()
'''


def _namespace(filename: str) -> dict:
    namespace: dict = {}
    exec(compile(SOURCE, filename, "exec"), namespace)  # functions whose frames carry filename
    return namespace


def _full_walk() -> bool:
    """The walk without its shortcuts: every frame tested against RETRY_LOOPS."""
    frame = sys._getframe(1)
    while frame is not None:
        if oom_retry._retries(frame.f_code.co_filename, frame.f_code.co_qualname):
            return True
        frame = frame.f_back
    return False


def _both() -> tuple[bool, bool]:
    return oom_retry.retry_loop_on_stack(), _full_walk()


@pytest.fixture
def fresh_index(monkeypatch):
    monkeypatch.setattr(oom_retry, "_INDEX", oom_retry._RetryLoopIndex())


def _load(monkeypatch, name: str, filename: str) -> None:
    module = types.ModuleType(name)
    module.__file__ = filename
    monkeypatch.setitem(sys.modules, name, module)


def test_a_retry_loop_anywhere_on_the_stack_is_found(monkeypatch, fresh_index):
    _load(monkeypatch, "fake_accelerate_memory", ACCELERATE_FILE)
    accelerate = _namespace(ACCELERATE_FILE)
    assert _both() == (False, False)
    assert accelerate["find_executable_batch_size"](_both)() == (True, True)
    deep = accelerate["find_executable_batch_size"](lambda: accelerate["unrelated"](_both))
    assert deep() == (True, True)
    # the right function name in another file, or another function in the right file: no
    elsewhere = _namespace(os.path.join(os.sep, "site", "mine", "memory.py"))
    assert elsewhere["find_executable_batch_size"](_both)() == (False, False)
    assert accelerate["unrelated"](_both) == (False, False)
    assert oom_retry.retry_loop_on_stack() is False  # the loop has returned


def test_lightning_loops_and_a_compiled_module_file(monkeypatch, fresh_index):
    _load(monkeypatch, "fake_bs_scaling", LIGHTNING_FILE + "c")  # sourceless: a .pyc file
    lightning = _namespace(LIGHTNING_FILE)
    assert lightning["_run_power_scaling"](_both) == (True, True)
    assert lightning["unrelated"](_both) == (False, False)


def test_without_a_retry_loop_file_loaded_the_walk_is_skipped(monkeypatch, fresh_index):
    for name, module in list(sys.modules.items()):  # the real libraries, if another test loaded them
        filename = getattr(module, "__file__", None)
        if isinstance(filename, str) and filename.endswith(tuple(oom_retry.RETRY_LOOPS)):
            monkeypatch.delitem(sys.modules, name)
    accelerate = _namespace(ACCELERATE_FILE)  # exec'd, never imported: no module has the file
    assert accelerate["find_executable_batch_size"](_both)() == (False, True)
    _load(monkeypatch, "fake_accelerate_memory", ACCELERATE_FILE)  # imported now: walked
    assert accelerate["find_executable_batch_size"](_both)() == (True, True)


def test_a_retry_loop_added_to_the_table_is_looked_for(monkeypatch, fresh_index):
    tail = os.path.join("mylib", "tuning.py")
    filename = os.path.join(os.sep, "site", tail)
    mine = _namespace(filename)
    _load(monkeypatch, "fake_mylib_tuning", filename)
    assert mine["unrelated"](_both) == (False, False)
    monkeypatch.setitem(oom_retry.RETRY_LOOPS, tail, frozenset({"unrelated"}))
    assert mine["unrelated"](_both) == (True, True)
