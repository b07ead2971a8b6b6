"""`shell_words`: shlex.split, bounded in length.

shlex builds each word by string concatenation (`self.token += char`), quadratic in the word's
length: one 5 MB word in a pod's peakmem.io/command annotation held the admission webhook's
thread for over ten minutes (80 k characters: 0.2 s; x4 for each doubling). A command longer than
Linux's limit on one exec argument (MAX_ARG_STRLEN, 128 KiB: what `sh -c COMMAND` gets) cannot
run as a shell command anyway, and is refused before it is split.
"""

from __future__ import annotations

import shlex

MAX_SHELL_COMMAND_CHARS = 128 * 1024
"""The longest text split into shell words (Linux's MAX_ARG_STRLEN, in characters)."""


class CommandTooLong(ValueError):
    """The text is longer than MAX_SHELL_COMMAND_CHARS (a ValueError, as shlex's own errors)."""


def shell_words(text: str, limit: int = MAX_SHELL_COMMAND_CHARS) -> list[str]:
    """shlex.split(text); CommandTooLong (a ValueError) for a text over `limit` characters."""
    if len(text) > limit:
        raise CommandTooLong(f"the command is {len(text)} characters long, over the {limit} a "
                             "shell command may have")
    return shlex.split(text)
