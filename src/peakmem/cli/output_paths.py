"""Output files of `peakmem estimate` (--job-log, --snapshot, --timeline) that would overwrite
the job's own inputs: the job's script, a file its command names, or any Python source file.

`--job-log train.py` truncated the script before the job ran (the empty job then "fit" with a
0-byte peak); `--snapshot train.py` wrote a pickle over it after the estimate."""

from __future__ import annotations

import os


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
