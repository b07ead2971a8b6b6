"""Output files of `peakmem estimate` (--job-log, --snapshot, --timeline) that would overwrite
the job's own inputs: the job's script, a file its command names, or any Python source file.

`--job-log train.py` truncated the script before the job ran (the empty job then "fit" with a
0-byte peak); `--snapshot train.py` wrote a pickle over it after the estimate.

Two output flags naming one file (`--job-log x --snapshot x`, `measure --out x --snapshot x`):
the later write replaced the earlier one and the command said it had written both."""

from __future__ import annotations

import errno
import os
import stat

import click

_HELD_FIFOS: list[int] = []
"""Write ends of output FIFOs probed by `fifo_without_reader`, open until peakmem exits."""


def clobbered_input(output: str, command: tuple[str, ...] | list[str]) -> str | None:
    """Why writing `output` would destroy one of the job's inputs, or None when it would not."""
    if not os.path.isfile(output):
        return None
    if output.lower().endswith(".py"):
        return "a Python source file"
    for word in command:
        candidate = word.split("=", 1)[1] if word.startswith("-") and "=" in word else word
        try:
            if candidate and os.path.samefile(candidate, output):
                return f"a file the job's command names ({word})"
        except (OSError, ValueError):
            continue
    return None


def fifo_without_reader(output: str) -> bool:
    """Whether `output` is a named FIFO that no process reads: the write after the job (the
    snapshot's pickle, the timeline) blocked in `open` for ever. A FIFO with a reader is held
    open for writing until peakmem exits, so the reader does not take this probe's close for
    the end of its data before the real write comes."""
    try:
        if not stat.S_ISFIFO(os.stat(output).st_mode):
            return False
        fd = os.open(output, os.O_WRONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        return exc.errno == errno.ENXIO
    _HELD_FIFOS.append(fd)
    return False


def empty_output(outputs: dict[str, str | None]) -> str | None:
    """Why an output flag given an empty name (`--job-log ''`) cannot be written, or None. The
    commands read `if path:`, so '' was taken for the flag left out: nothing was written and
    nothing said so."""
    for flag, path in outputs.items():
        if path is not None and not path:
            return f"{flag} '' is not a file name"
    return None


def refuse_empty(ctx, param, value):  # noqa: ANN001, ANN201 - a click option callback
    """Click callback of an output path option: '' is refused before click.Path makes it
    Path('') (the current directory), which is not what was given."""
    if value is not None and not str(value):
        raise click.BadParameter("'' is not a file name", ctx, param)
    return value


def shared_output(outputs: dict[str, str | None]) -> str | None:
    """Why two of `outputs` (flag -> path, None where not given) cannot both be written: they
    name one file (the same path, or two links to one file). None when they are all apart."""
    seen: dict[str, str] = {}
    for flag, path in outputs.items():
        if not path:
            continue
        key = os.path.realpath(path)
        if key in seen:
            return f"{seen[key]} and {flag} name the same file ({path}): give each its own"
        for other_key, other_flag in seen.items():
            try:
                if os.path.samefile(other_key, key):
                    return f"{other_flag} and {flag} name the same file ({path}): give each its own"
            except (OSError, ValueError):
                continue
        seen[key] = flag
    return None
