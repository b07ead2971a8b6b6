"""Journal the files written by library code that does not go through Python's ``open`` (so
raises no audit event): each writer in :data:`NATIVE_WRITERS` tells the job's file journal
(:func:`peakmem.jobs.file_journal.before_native_write`) what it is about to write. torch.save and
safetensors' savers are told by the save diverter (capture.side_effects)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from functools import wraps
from typing import Any

from peakmem.capture.on_import import Undo, patch_on_import
from peakmem.jobs.file_journal import before_native_write


@dataclass(frozen=True)
class NativeWriter:
    """`module.owner.method(self, ..., path)`: a method that writes the file at `path`."""

    module: str
    owner: str
    method: str
    path: tuple[int, str]
    """Where the path is: (index in the arguments after self, keyword name)."""

    def apply(self, module: Any) -> Undo:
        owner = getattr(module, self.owner, None)
        original: Callable[..., Any] | None = getattr(owner, self.method, None)
        if original is None:
            return lambda: None
        index, name = self.path

        @wraps(original)
        def write(this: Any, *args: Any, **kwargs: Any) -> Any:
            target = kwargs.get(name, args[index] if len(args) > index else None)
            if target is not None:
                before_native_write(target)
            return original(this, *args, **kwargs)

        setattr(owner, self.method, write)
        return lambda: setattr(owner, self.method, original)


NATIVE_WRITERS: tuple[NativeWriter, ...] = (
    NativeWriter("tokenizers", "Tokenizer", "save", (0, "path")),  # HF tokenizer.json (Rust)
)


@contextmanager
def journal_native_writes() -> Iterator[None]:
    """While the block runs, every writer of :data:`NATIVE_WRITERS` is journaled."""
    with ExitStack() as stack:
        for writer in NATIVE_WRITERS:
            stack.enter_context(patch_on_import(writer.module, writer.apply))
        yield
