"""Ending a loop in a running CPython 3.11 frame where no line leads to its exit.

`frame.f_lineno` (capture/loop_ends.py's jump) needs a line that starts at the loop's exit and
that CPython resolves to it. A loop that is the last statement of its function exits into the
implicit `return None` (no line of its own), a `for` loop followed by a `with` statement or
wrapped in `try: ... finally:` exits onto a line that CPython would resolve elsewhere. Two
moves reach those exits without a line, from a `line` trace event at the loop's head (the moment
the trace function runs, CPython 3.11 has stored the frame's value stack pointer and re-reads it
and the next instruction afterwards, as it does after an `f_lineno` jump):

- `exhaust`: a `for` loop's head is its `FOR_ITER`, with the loop's iterator on top of the value
  stack; the iterator is replaced by an exhausted one, so CPython's own `FOR_ITER` finds the loop
  done: it drops the iterator and goes to the loop's exit (its `else:`, the code after it, the
  `with`'s exit, the `finally:`, the implicit return), exactly as when the data runs out. The
  job's iterator is released as a `break` releases it (a generator is closed when its last
  reference goes).
- `goto`: a `while` loop's head (its body's first instruction) has the same value stack as its
  exit (a `while` pushes nothing), so the frame's next instruction is set to the exit, as
  `f_lineno` sets it, with nothing to pop.

Both write the frame's interpreter record (`_PyInterpreterFrame`, CPython 3.11's
Include/internal/pycore_frame.h) through ctypes, after checking it is that record: the
`PyFrameObject`'s `f_frame` pointer leads to a record whose `f_code` and `frame_obj` are this
frame's, the value stack's depth there is the one loop_exits.py works out for the head from the
bytecode, and (`exhaust`) the object on top is an iterator. Anything else (another CPython, a
debug build, a different layout) refuses the move (`None`): the caller stops the job as before.
"""

from __future__ import annotations

import ctypes
import sys
from types import CodeType, FrameType

from peakmem.capture import loop_exits

LAYOUT_VERSION = (3, 11)
"""The CPython minor whose frame layout the offsets below are: Include/internal/pycore_frame.h
(`struct _frame`: PyObject_HEAD, f_back, f_frame; `_PyInterpreterFrame`: f_func, f_globals,
f_builtins, f_locals, f_code, frame_obj, previous, prev_instr, stacktop, is_entry, owner,
localsplus)."""
_POINTER = ctypes.sizeof(ctypes.c_void_p)
_F_FRAME = 3 * _POINTER  # PyFrameObject.f_frame (after ob_refcnt, ob_type, f_back)
_F_CODE = 4 * _POINTER  # _PyInterpreterFrame.f_code
_FRAME_OBJ = 5 * _POINTER  # _PyInterpreterFrame.frame_obj
_PREV_INSTR = 7 * _POINTER  # _PyInterpreterFrame.prev_instr
_STACKTOP = 8 * _POINTER  # _PyInterpreterFrame.stacktop (int)
_LOCALSPLUS = 9 * _POINTER  # _PyInterpreterFrame.localsplus (after stacktop, is_entry, owner)


def supported() -> bool:
    """Whether this interpreter's frames have the layout the moves were written for: CPython
    3.11, a release build (a debug build's object header is larger), 64-bit pointers."""
    return (sys.implementation.name == "cpython"
            and sys.version_info[:2] == LAYOUT_VERSION
            and not hasattr(sys, "gettotalrefcount")
            and _POINTER == 8)


def exhaust(frame: FrameType, head: int) -> bool:
    """At a `line` event on a `for` loop's head (offset `head`, its `FOR_ITER`): replace the
    loop's iterator by an exhausted one, so the loop ends there. False (nothing changed) when
    the frame is not at that head or its record does not check out."""
    record = _record(frame, head)
    if record is None:
        return False
    slot = record + _LOCALSPLUS + _POINTER * (_stacktop(record) - 1)
    address = ctypes.c_void_p.from_address(slot).value
    if not address:
        return False
    old = ctypes.cast(address, ctypes.py_object).value  # a reference of ours meanwhile
    if not hasattr(type(old), "__next__"):
        return False
    done = iter(())
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(done))  # the stack's reference
    ctypes.c_void_p.from_address(slot).value = id(done)
    ctypes.pythonapi.Py_DecRef(ctypes.py_object(old))  # the stack's old reference
    return True


def goto(frame: FrameType, head: int, target: int) -> bool:
    """At a `line` event on a `while` loop's head (offset `head`): the frame goes on at offset
    `target`, whose value stack must be the head's (same depth, read from the bytecode). False
    (nothing changed) otherwise."""
    depths = loop_exits.stack_depths(frame.f_code)
    if depths is None or depths.get(target) != depths.get(head):
        return False
    record = _record(frame, head)
    if record is None:
        return False
    prev_instr = ctypes.c_void_p.from_address(record + _PREV_INSTR)
    code_start = prev_instr.value - frame.f_lasti
    prev_instr.value = code_start + target
    if frame.f_lasti != target:  # the record said otherwise after all: put it back
        prev_instr.value = code_start + head
        return False
    return True


def _record(frame: FrameType, head: int) -> int | None:
    """The address of `frame`'s `_PyInterpreterFrame` when it checks out: this frame's code and
    frame object, at `head`, with the value stack depth the bytecode says."""
    if not supported() or frame.f_lasti != head:
        return None
    record = ctypes.c_void_p.from_address(id(frame) + _F_FRAME).value
    if not record:
        return None
    if (ctypes.c_void_p.from_address(record + _F_CODE).value != id(frame.f_code)
            or ctypes.c_void_p.from_address(record + _FRAME_OBJ).value != id(frame)):
        return None
    depths = loop_exits.stack_depths(frame.f_code)
    expected = None if depths is None else depths.get(head)
    if expected is None or _stacktop(record) - _locals_plus(frame.f_code) != expected:
        return None
    return record


def _stacktop(record: int) -> int:
    return ctypes.c_int.from_address(record + _STACKTOP).value


def _locals_plus(code: CodeType) -> int:
    """`co_nlocalsplus`: the frame's slots before its value stack (locals, cells that are not
    arguments, free variables)."""
    cells = [name for name in code.co_cellvars if name not in code.co_varnames]
    return len(code.co_varnames) + len(cells) + len(code.co_freevars)
