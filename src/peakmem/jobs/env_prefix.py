"""`env NAME=VALUE ... python train.py`: the job's command after an `env` prefix.

People write the variables a run needs in front of the command
(`env CUDA_VISIBLE_DEVICES=0 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True python train.py`,
`/usr/bin/env python train.py`). peakmem runs the command after the prefix with those
variables set, as `env` would; `env`'s own options (`-i`, `-u NAME`, ...) are refused by name.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


class EnvPrefixError(ValueError):
    """An `env` prefix peakmem cannot follow."""


def split_env_prefix(command: Sequence[str]) -> tuple[tuple[str, ...], dict[str, str]]:
    """(the command after a leading `env [NAME=VALUE ...]`, the variables it sets); a command
    without the prefix comes back unchanged with no variables."""
    words = list(command)
    if not words or Path(words[0]).name != "env":
        return tuple(words), {}
    words = words[1:]
    variables: dict[str, str] = {}
    while words:
        word = words[0]
        if word == "--":
            words = words[1:]
            break
        if word.startswith("-"):
            raise EnvPrefixError(f"unsupported env option {word!r}: give `env NAME=VALUE ... "
                                 "python train.py` or set the variables before peakmem")
        if not _ASSIGNMENT.match(word):
            break
        name, value = word.split("=", 1)
        variables[name] = value
        words = words[1:]
    if not words:
        raise EnvPrefixError("no command after `env`: expected `env NAME=VALUE python train.py`")
    return tuple(words), variables
