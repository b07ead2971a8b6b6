"""The loops of a code object and where each one exits, read from its bytecode.

A loop is a backward jump's span: from its target (a `for` loop's `FOR_ITER`, a `while` loop's
body) to the last backward jump to that target (`continue` jumps back too). Its exit is the
instruction right after that last jump: where a `for` loop goes when its iterator is exhausted
(its `else:` clause first, if any), where a `while` loop's condition goes when false, and after
a `break`'s target when neither has an `else`.

A running frame can be moved to the exit only through `frame.f_lineno` from a `line` trace
event, which takes a LINE and picks among the instructions starting that line the one with the
deepest compatible value stack (CPython's `frame_setlineno`). So an exit is usable only when it
starts a line that CPython resolves to it without doubt: it is the first instruction of that
line, and no other instruction starting the same line lies in a `for` loop (whose iterator on
the stack would make it the deeper choice). A loop that is the last statement of its function
exits into the implicit `return None`, which starts no line of its own: no usable exit
(`Loop.exit_line` None).
"""

from __future__ import annotations

import dis
from dataclasses import dataclass
from types import CodeType

_BACKWARD_JUMPS = frozenset({
    "JUMP_BACKWARD",
    "POP_JUMP_BACKWARD_IF_TRUE",
    "POP_JUMP_BACKWARD_IF_FALSE",
    "POP_JUMP_BACKWARD_IF_NONE",
    "POP_JUMP_BACKWARD_IF_NOT_NONE",
})
"""Backward jumps that close a loop (3.11's conditional ones included). Not
`JUMP_BACKWARD_NO_INTERRUPT`: the send loop of `yield from` / `await`, no loop of the job's."""
_RETURN_TAIL = frozenset({"NOP", "LOAD_CONST", "RETURN_VALUE", "RETURN_CONST"})


@dataclass(frozen=True)
class Loop:
    start: int
    """Offset of the loop's first instruction: the target of its backward jumps."""
    end: int
    """Offset of its last backward jump."""
    exit: int | None
    """Offset of the instruction after the loop (None: the code ends there)."""
    exit_line: int | None
    """The line `frame.f_lineno` must be set to to reach `exit`; None when no line does."""
    is_for: bool
    ends_code: bool
    """Nothing but the implicit `return None` follows the loop."""

    def encloses(self, offset: int) -> bool:
        return self.start <= offset <= self.end


_CACHE: dict[CodeType, tuple[Loop, ...]] = {}
_LINES: dict[CodeType, tuple[tuple[int, int], ...]] = {}


def line_starts(code: CodeType) -> tuple[tuple[int, int], ...]:
    """(offset, line) of each instruction that starts a line, as `frame.f_lineno` sees them."""
    cached = _LINES.get(code)
    if cached is None:
        cached = _LINES[code] = tuple(
            (offset, line) for offset, line in dis.findlinestarts(code) if line is not None
        )
    return cached


def loops_of(code: CodeType) -> tuple[Loop, ...]:
    """The loops of `code` (not of the functions defined in it), outermost first."""
    cached = _CACHE.get(code)
    if cached is None:
        cached = _CACHE[code] = _read_loops(code)
    return cached


def enclosing(code: CodeType, *offsets: int) -> list[Loop]:
    """The loops of `code` that enclose every one of `offsets`, outermost first."""
    return [loop for loop in loops_of(code) if all(loop.encloses(at) for at in offsets)]


def returns_after(code: CodeType, offset: int) -> bool:
    """Whether the code returns right after the instruction at `offset` (a call whose result
    is dropped, then the implicit `return None`)."""
    return _returns_from(code, offset, {"POP_TOP"})


def _returns_from(code: CodeType, after: int, also: set[str] = frozenset()) -> bool:
    """Whether the instructions after offset `after`, in order, only return None."""
    for ins in dis.get_instructions(code):
        if ins.offset <= after:
            continue
        if ins.opname in ("RETURN_VALUE", "RETURN_CONST"):
            return True
        if ins.opname not in _RETURN_TAIL and ins.opname not in also:
            return False
        if ins.opname == "LOAD_CONST" and ins.argval is not None:
            return False
    return False


def _read_loops(code: CodeType) -> tuple[Loop, ...]:
    instructions = list(dis.get_instructions(code))
    following = {ins.offset: nxt.offset
                 for ins, nxt in zip(instructions, instructions[1:], strict=False)}
    names = {ins.offset: ins.opname for ins in instructions}
    spans: dict[int, int] = {}
    for ins in instructions:
        if ins.opname in _BACKWARD_JUMPS and isinstance(ins.argval, int):
            spans[ins.argval] = max(spans.get(ins.argval, -1), ins.offset)
    starts = line_starts(code)
    line_at = dict(starts)
    for_spans = [(start, end) for start, end in spans.items() if names.get(start) == "FOR_ITER"]
    loops = []
    for start, end in sorted(spans.items()):
        exit_offset = following.get(end)
        exit_line = None
        if exit_offset is not None and exit_offset in line_at:
            line = line_at[exit_offset]
            others = [at for at, number in starts if number == line and at != exit_offset]
            if all(at > exit_offset and not any(s <= at <= e for s, e in for_spans)
                   for at in others):
                exit_line = line
        loops.append(Loop(
            start=start, end=end, exit=exit_offset, exit_line=exit_line,
            is_for=names.get(start) == "FOR_ITER",
            ends_code=exit_offset is None or _returns_from(code, end),
        ))
    return tuple(loops)
