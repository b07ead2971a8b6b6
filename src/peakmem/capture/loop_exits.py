"""The loops of a code object and where each one exits, read from its bytecode.

A loop is a backward jump's span: from its target (a `for` loop's `FOR_ITER`, a `while` loop's
body) to the last backward jump to that target (`continue` jumps back too). Its exit is the
instruction right after that last jump: where a `for` loop goes when its iterator is exhausted
(its `else:` clause first, if any), where a `while` loop's condition goes when false, and after
a `break`'s target when neither has an `else`.

A running frame can be moved to the exit only through `frame.f_lineno` from a `line` trace
event, which takes a LINE and picks, among the instructions starting that line whose value stack
is compatible with the one at the jump (no deeper; an iterator may stand for any object), the
one with the deepest stack (CPython's `frame_setlineno`). So an exit is usable from a loop's
head only when it starts a line and every other instruction starting the same line that is no
deeper than the head has a shallower stack than the exit: the stack depths are worked out from
the bytecode (`dis.stack_effect` along every path, exception handlers included). A `with`
statement right after the loop is not usable: its exit code starts the same line with the
context manager's `__exit__` on the stack, which CPython would pick (and call the loop's
iterator). A loop that is the last statement of its function exits into the implicit `return
None`, which starts no line of its own: no usable exit (`Loop.exit_line` None).
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
_NO_FALLTHROUGH = frozenset({
    "RETURN_VALUE", "RETURN_CONST", "RAISE_VARARGS", "RERAISE", "JUMP_FORWARD", "JUMP_BACKWARD",
    "JUMP_BACKWARD_NO_INTERRUPT", "JUMP", "JUMP_NO_INTERRUPT",
})
_JUMPS = frozenset(dis.hasjrel) | frozenset(dis.hasjabs)


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
_DEPTHS: dict[CodeType, dict[int, int] | None] = {}
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


def stack_depths(code: CodeType) -> dict[int, int] | None:
    """The value stack's depth before each instruction (by offset), along every path from the
    entry and from each exception handler; None when the bytecode cannot be read so."""
    if code in _DEPTHS:
        return _DEPTHS[code]
    try:
        depths = _read_depths(code)
    except (ValueError, TypeError, AttributeError, IndexError):
        depths = None
    _DEPTHS[code] = depths
    return depths


def _read_depths(code: CodeType) -> dict[int, int]:
    instructions = list(dis.get_instructions(code))
    index = {ins.offset: i for i, ins in enumerate(instructions)}
    work = [(instructions[0].offset, 0)]
    for entry in dis._parse_exception_table(code):  # noqa: SLF001 - 3.11+'s table reader
        work.append((entry.target, entry.depth + int(entry.lasti) + 1))
    depths: dict[int, int] = {}
    while work:
        offset, depth = work.pop()
        while offset in index and offset not in depths:
            depths[offset] = depth
            ins = instructions[index[offset]]
            arg = ins.arg if ins.opcode >= dis.HAVE_ARGUMENT else None
            if ins.opcode in _JUMPS and isinstance(ins.argval, int):
                work.append((ins.argval, depth + dis.stack_effect(ins.opcode, arg, jump=True)))
            if ins.opname in _NO_FALLTHROUGH or index[offset] + 1 >= len(instructions):
                break
            depth += dis.stack_effect(ins.opcode, arg, jump=False)
            offset = instructions[index[offset] + 1].offset
    return depths


def jump_line(code: CodeType, head: int, target: int) -> int | None:
    """The line that `frame.f_lineno` must be set to, at a `line` event on the instruction at
    `head`, for the frame to go on at `target`; None when no line leads there for sure."""
    line = dict(line_starts(code)).get(target)
    depths = stack_depths(code)
    if line is None or depths is None or head not in depths or target not in depths:
        return None
    head_depth, target_depth = depths[head], depths[target]
    if target_depth > head_depth:
        return None
    for offset, number in line_starts(code):
        if number != line or offset == target:
            continue
        depth = depths.get(offset)
        if depth == target_depth == 0 and offset > target:
            continue  # an empty stack as well, later: CPython keeps the first (a `while` line)
        if depth is None or target_depth <= depth <= head_depth:
            return None  # CPython could pick that instruction instead (or it is unreachable)
    return line


def handlers(code: CodeType) -> frozenset[int]:
    """The offsets exception handlers start at (an `async for` loop's exit is one: reached only
    by its `StopAsyncIteration`, never by a jump)."""
    return frozenset(entry.target
                     for entry in dis._parse_exception_table(code))  # noqa: SLF001 - 3.11+


def return_none(code: CodeType, head: int) -> int | None:
    """Where a frame at `head` may go on to return None at once: the first `LOAD_CONST None;
    RETURN_VALUE` with an empty value stack, when `head` has an empty stack too and no
    exception handler covers it (no `with` or `try` around it whose exit code a return would
    skip). A `while True:` loop that is the last statement of its function has no exit: the
    compiler copies its `break` into a `return None` inside the loop (none when it has none)."""
    depths = stack_depths(code)
    if depths is None or depths.get(head) != 0:
        return None
    for entry in dis._parse_exception_table(code):  # noqa: SLF001 - 3.11+'s table reader
        if entry.start <= head < entry.end:
            return None
    instructions = list(dis.get_instructions(code))
    for ins, nxt in zip(instructions, instructions[1:], strict=False):
        if (ins.opname == "LOAD_CONST" and ins.argval is None and nxt.opname == "RETURN_VALUE"
                and depths.get(ins.offset) == 0):
            return ins.offset
    return None


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
    loops = []
    for start, end in sorted(spans.items()):
        exit_offset = following.get(end)
        exit_line = None if exit_offset is None else jump_line(code, start, exit_offset)
        head = following.get(start) if names.get(start) == "EXTENDED_ARG" else start
        loops.append(Loop(
            start=start, end=end, exit=exit_offset, exit_line=exit_line,
            is_for=names.get(head) == "FOR_ITER",
            ends_code=exit_offset is None or _returns_from(code, end),
        ))
    return tuple(loops)
