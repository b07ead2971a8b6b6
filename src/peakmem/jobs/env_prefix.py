"""`env NAME=VALUE ... python train.py` / `NAME=VALUE python train.py`: the job's command after an
environment prefix.

People write the variables a run needs in front of the command
(`env CUDA_VISIBLE_DEVICES=0 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True python train.py`,
`/usr/bin/env python train.py`, or as a shell would take it, `OMP_NUM_THREADS=1 torchrun ...`).
peakmem runs the command after the prefix with those variables set, as `env` (or the shell) would;
`env`'s own options (`-i`, `-u NAME`, ...) are refused by name.

The launch parsing layer (:func:`peakmem.jobs.launchers.parse_launch`) is the one caller: every
front end (the Python API, `peakmem estimate` / `fit`, `peakmem batch`, the service) gets the
variables from the :class:`~peakmem.jobs.launchers.Launch` it returns.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


class EnvPrefixError(ValueError):
    """An `env` prefix peakmem cannot follow."""


def _assignments(words: list[str]) -> tuple[list[str], dict[str, str]]:
    """The leading `NAME=VALUE` words as variables (a later one wins), and the words after."""
    variables: dict[str, str] = {}
    while words and _ASSIGNMENT.match(words[0]):
        name, value = words[0].split("=", 1)
        variables[name] = value
        words = words[1:]
    return words, variables


def split_env_prefix(command: Sequence[str]) -> tuple[tuple[str, ...], dict[str, str]]:
    """(the command after a leading `env [NAME=VALUE ...]` or shell-style `NAME=VALUE ...`, the
    variables it sets); a command without a prefix comes back unchanged with no variables.
    Shell-style assignments may precede `env` (`A=1 env B=2 python t.py`)."""
    words, variables = _assignments(list(command))
    if words and Path(words[0]).name == "env":
        words = words[1:]
        while words and words[0].startswith("-"):
            if words[0] == "--":
                words = words[1:]
                break
            raise EnvPrefixError(f"unsupported env option {words[0]!r}: give `env NAME=VALUE ... "
                                 "python train.py` or set the variables before peakmem")
        words, more = _assignments(words)
        variables.update(more)
        if words and words[0] == "--":  # `env A=1 -- python t.py`
            words = words[1:]
        if not words:
            raise EnvPrefixError("no command after `env`: expected `env NAME=VALUE python "
                                 "train.py`")
    elif variables and not words:
        raise EnvPrefixError("no command after the variables: expected `NAME=VALUE python "
                             "train.py`")
    return tuple(words), variables
