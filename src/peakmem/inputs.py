"""Reading untrusted input files: size caps, regular files only, one-line errors.

Every loader of a file a user hands to peakmem (memory snapshots, peakmem traces, benchmark CSVs)
opens it through `open_regular_file` and reports what is wrong with an `InputError`, whose text
is one line: `FILE:LINE: what is wrong` (or `FILE: what is wrong` where a line means nothing).
Nothing here imports the rest of peakmem.
"""

from __future__ import annotations

import math
import os
import stat
from collections.abc import Iterator
from typing import IO, Any, BinaryIO

GiB = 2**30
DEFAULT_MAX_INPUT_BYTES = 2 * GiB
MAX_INPUT_BYTES_ENV = "PEAKMEM_MAX_INPUT_BYTES"
_MESSAGE_CHARS = 300


class InputError(ValueError):
    """A malformed, oversized or hostile input file (exit code 2, `bad_input`)."""

    def __init__(self, detail: str, path: str | os.PathLike[str] | None = None,
                 line: int | None = None) -> None:
        self.detail = one_line(detail)
        self.path = None if path is None else os.fspath(path)
        self.line = line
        super().__init__(self._text())

    def _text(self) -> str:
        if self.path is None:
            return self.detail
        where = self.path if self.line is None else f"{self.path}:{self.line}"
        return f"{where}: {self.detail}"

    def at(self, path: str | os.PathLike[str] | None, line: int | None = None) -> InputError:
        """This error, located in `path` (and `line`) unless it already names a file."""
        if self.path is None and path is not None:
            self.path = os.fspath(path)
            if self.line is None:
                self.line = line
            self.args = (self._text(),)
        return self

    def __str__(self) -> str:
        return self._text()


class JobInputError(InputError):
    """Bad input found by peakmem's own code running in the job (the `--model` script's config
    check, scriptgen.config_check): the capture reports it as `bad_input` (exit code 2, this
    one line), not as the job's failure with a traceback."""


def one_line(text: str, limit: int = _MESSAGE_CHARS) -> str:
    """`text` without line breaks or control characters, cut to `limit` characters."""
    cleaned = "".join(
        ch if ch.isprintable() else repr(ch)[1:-1] for ch in str(text)
    )
    return cleaned if len(cleaned) <= limit else cleaned[: limit - 3] + "..."


def describe(value: Any) -> str:
    """A short, safe description of an untrusted value for an error message (never recursive,
    never a huge repr)."""
    if value is None or isinstance(value, bool):
        return repr(value)
    if isinstance(value, int):
        if value.bit_length() > 64:
            return f"an integer of {value.bit_length()} bits"
        return repr(value)
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else f"{value!r} (not a finite number)"
    if isinstance(value, str):
        shown = value if len(value) <= 40 else value[:37] + "..."
        return f"the string {one_line(repr(shown), 60)}"
    if isinstance(value, (bytes, bytearray)):
        return f"{len(value)} bytes"
    return f"a {type(value).__name__}"


def max_input_bytes() -> int:
    """The cap on an input file's size: PEAKMEM_MAX_INPUT_BYTES (bytes, or e.g. 4GiB), else
    2 GiB."""
    raw = os.environ.get(MAX_INPUT_BYTES_ENV)
    if raw is None or not raw.strip():
        return DEFAULT_MAX_INPUT_BYTES
    value = parse_size(raw)
    if value is None or value <= 0:
        raise InputError(
            f"{MAX_INPUT_BYTES_ENV}={one_line(raw, 40)!r} is not a size in bytes "
            "(use e.g. 4294967296 or 4GiB)"
        )
    return value


_SIZE_UNITS = {
    "": 1, "b": 1, "k": 2**10, "kib": 2**10, "kb": 10**3, "m": 2**20, "mib": 2**20,
    "mb": 10**6, "g": 2**30, "gib": 2**30, "gb": 10**9, "t": 2**40, "tib": 2**40, "tb": 10**12,
}


def parse_size(text: str) -> int | None:
    """'4GiB', '40GB', '1024', '1.5GiB' -> bytes; None when `text` is not a finite size >= 0."""
    import re

    if not isinstance(text, str) or len(text) > 64:
        return None
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", text)
    if not match:
        return None
    unit = _SIZE_UNITS.get(match.group(2).lower())
    if unit is None:
        return None
    number = match.group(1)
    if "." in number:
        whole, _, frac = number.partition(".")
        value = (int(whole or "0") * 10 ** len(frac) + int(frac)) * unit // 10 ** len(frac)
    else:
        value = int(number) * unit
    return value


def open_regular_file(path: str | os.PathLike[str], cap: int | None = None) -> BinaryIO:
    """Open `path` for binary reading after checking, on the open file itself, that it is a
    regular file of at most `cap` bytes (default `max_input_bytes()`). Directories, devices
    (/dev/zero), FIFOs and sockets are refused without blocking."""
    limit = max_input_bytes() if cap is None else cap
    name = os.fspath(path)
    try:
        fd = os.open(name, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise InputError("no such file", name) from None
    except IsADirectoryError:
        raise InputError("is a directory, not a file", name) from None
    except PermissionError:
        raise InputError("permission denied", name) from None
    except OSError as exc:
        raise InputError(f"cannot open it ({exc.strerror or exc})", name) from None
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise InputError("is a directory, not a file", name)
        if not stat.S_ISREG(info.st_mode):
            kind = (
                "a FIFO" if stat.S_ISFIFO(info.st_mode)
                else "a socket" if stat.S_ISSOCK(info.st_mode)
                else "a device" if stat.S_ISCHR(info.st_mode) or stat.S_ISBLK(info.st_mode)
                else "not a regular file"
            )
            raise InputError(f"is {kind}, not a regular file", name)
        if info.st_size > limit:
            raise InputError(
                f"is {info.st_size} bytes, over the {limit}-byte cap on input files "
                f"(raise it with {MAX_INPUT_BYTES_ENV})",
                name,
            )
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_capped(handle: BinaryIO, cap: int, name: str) -> bytes:
    """All of `handle`, refusing more than `cap` bytes (a file that grew after it was opened)."""
    data = handle.read(cap + 1)
    if len(data) > cap:
        raise InputError(f"is over the {cap}-byte cap on input files", name)
    return data


def capped_lines(
    handle: IO[bytes] | IO[str], name: str, first_cap: int, line_cap: int
) -> Iterator[tuple[int, str]]:
    """(line number, text without its line break) of each line of `handle`, decoded as UTF-8.
    The first line may be `first_cap` characters long, the others `line_cap`; a longer line is
    refused without reading it whole."""
    lineno = 0
    while True:
        lineno += 1
        cap = first_cap if lineno == 1 else line_cap
        raw = handle.readline(cap + 1)
        if not raw:
            return
        if len(raw) > cap and not (len(raw) == cap + 1 and raw[-1:] in (b"\n", "\n")):
            raise InputError(
                f"line is longer than {cap} {'bytes' if isinstance(raw, bytes) else 'characters'}",
                name,
                lineno,
            )
        if isinstance(raw, bytes):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise InputError(
                    f"not UTF-8 text (byte {exc.start + 1} of the line)", name, lineno
                ) from None
        else:
            text = raw
        yield lineno, text.rstrip("\r\n")
