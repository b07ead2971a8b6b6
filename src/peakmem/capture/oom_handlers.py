"""Scripts that catch CUDA's out-of-memory error themselves and go on with a smaller batch:

    while batch_size >= 1:
        try:
            train_step(batch_size)
            break
        except torch.cuda.OutOfMemoryError:      # or torch.OutOfMemoryError,
            batch_size //= 2                     # or RuntimeError + "out of memory" in str(e)

On a GPU the first batch that does not fit raises and the loop halves it; without a memory
fraction the capture lets every allocation through, so such a loop would keep its first (too
large) batch and the estimate would be of a run the job never makes. Like the library retry
loops of capture.oom_retry, an allocation the simulated allocator cannot place raises the error
in the job while a frame on the stack is inside a `try` whose handler names
`OutOfMemoryError` or tests for "out of memory" (read from the frame's exception table:
`with` blocks and nested `try`s in between are followed to the handler that would run) and the
`try` is inside a loop of that function (a retry or a skipped batch can follow; a handler
around the whole job that logs and re-raises is not one)."""

from __future__ import annotations

import dis
import sys
from pathlib import Path
from types import CodeType, FrameType

_OOM_NAME = "OutOfMemoryError"
_OOM_TEXT = "out of memory"
_NAME_LOADS = frozenset({"LOAD_ATTR", "LOAD_GLOBAL", "LOAD_NAME", "LOAD_METHOD", "LOAD_FAST",
                         "LOAD_DEREF"})
_PEAKMEM_DIR = str(Path(__file__).resolve().parents[1])

_Handlers = tuple[list[dis.Instruction], dict[int, int], list]
_code_cache: dict[CodeType, _Handlers] = {}
_answers: dict[tuple[CodeType, int], bool] = {}


def _handlers(code: CodeType) -> _Handlers:
    found = _code_cache.get(code)
    if found is None:
        bytecode = dis.Bytecode(code)
        instructions = list(bytecode)
        index = {instruction.offset: i for i, instruction in enumerate(instructions)}
        found = _code_cache[code] = (instructions, index, list(bytecode.exception_entries))
    return found


def _covering(entries: list, offset: int):
    for entry in entries:
        if entry.start <= offset < entry.end:
            return entry
    return None


def _names_oom(instruction: dis.Instruction) -> bool:
    if instruction.opname in _NAME_LOADS:
        return instruction.argval == _OOM_NAME
    if instruction.opname == "LOAD_CONST" and isinstance(instruction.argval, str):
        return _OOM_TEXT in instruction.argval.lower()
    return False


def catches_oom(code: CodeType, offset: int) -> bool:
    """Whether an exception raised at `offset` of `code` reaches a handler, in the same
    function, that names `OutOfMemoryError` or looks for "out of memory" in the error."""
    key = (code, offset)
    answer = _answers.get(key)
    if answer is None:
        answer = _answers[key] = _search(code, offset)
    return answer


def _in_a_loop(instructions: list[dis.Instruction], offset: int) -> bool:
    """Whether a backward jump after `offset` goes back to it or before it: the protected
    call is in a loop, so a handler that catches the error can try again."""
    return any("BACKWARD" in instruction.opname and instruction.offset > offset
               and instruction.argval <= offset for instruction in instructions)


def _search(code: CodeType, offset: int) -> bool:
    instructions, index, entries = _handlers(code)
    if not _in_a_loop(instructions, offset):
        return False  # `try: main() except OutOfMemoryError: log; raise`: the GPU's error would
        # end the job there; the estimate keeps reporting what the whole job needs
    entry = _covering(entries, offset)
    seen: set[int] = set()
    while entry is not None and entry.target not in seen and entry.target in index:
        seen.add(entry.target)
        last = None
        for instruction in instructions[index[entry.target]:]:
            if _names_oom(instruction):
                return True
            if instruction.opname == "RERAISE":  # not handled here: on to the enclosing handler
                last = instruction
                break
        if last is None:
            return False
        entry = _covering(entries, last.offset)
    return False


def oom_handler_on_stack(frame: FrameType | None = None) -> bool:
    """Whether a frame on the calling thread's stack (outside peakmem) runs inside a `try`
    that catches CUDA's out-of-memory error."""
    frame = frame if frame is not None else sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if (code.co_exceptiontable and not code.co_filename.startswith(_PEAKMEM_DIR)
                and catches_oom(code, frame.f_lasti)):
            return True
        frame = frame.f_back
    return False
