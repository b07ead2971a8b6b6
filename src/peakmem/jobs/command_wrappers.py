"""Programs that run a command unchanged for its device memory: `nohup python train.py`,
`time python train.py`, `nice -n 10 torchrun ...`, `stdbuf -oL python ...`, `ionice -c 3 ...`,
`taskset -c 0-7 python ...`. The launch parsing (`jobs.launchers.parse_launch`) takes them off
the front of the command, as it takes off an environment prefix, and runs what they would run.

Each wrapper is registered with its options: those that take a value (the next word, or after
`=` / attached: `-n10`, `--adjustment=10`) and flags. An option not registered is refused by
name rather than guessed at.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path


class WrapperError(ValueError):
    """A wrapper's command line peakmem cannot follow."""


@dataclass(frozen=True)
class Wrapper:
    """A wrapper program's options (before the command it runs)."""

    with_value: frozenset[str] = frozenset()
    flags: frozenset[str] = frozenset()
    positional: int = 0
    """Words the wrapper itself takes before the command (taskset's CPU mask)."""


WRAPPERS: dict[str, Wrapper] = {
    "nohup": Wrapper(),
    "time": Wrapper(with_value=frozenset({"-f", "--format", "-o", "--output"}),
                    flags=frozenset({"-p", "--portability", "-v", "--verbose", "-a", "--append",
                                     "-q", "--quiet"})),
    "nice": Wrapper(with_value=frozenset({"-n", "--adjustment"})),
    "ionice": Wrapper(with_value=frozenset({"-c", "--class", "-n", "--classdata"}),
                      flags=frozenset({"-t", "--ignore"})),
    "stdbuf": Wrapper(with_value=frozenset({"-i", "--input", "-o", "--output", "-e",
                                            "--error"})),
    "taskset": Wrapper(flags=frozenset({"-c", "--cpu-list", "-a", "--all-tasks"}),
                       positional=1),
}
"""Program name -> its options."""


def _option_words(word: str, wrapper: Wrapper) -> int | None:
    """How many words option `word` spans (1 or 2), None when it is not the wrapper's."""
    name, eq, _ = word.partition("=")
    if name in wrapper.flags and not eq:
        return 1
    if name in wrapper.with_value:
        return 1 if eq else 2
    if not word.startswith("--") and word[:2] in wrapper.with_value:
        return 1  # `-n10`, `-oL`
    if word.startswith("-") and word[1:].isdigit() and "-n" in wrapper.with_value:
        return 1  # `nice -10`
    return None


def strip_wrappers(command: Sequence[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(the command after any leading wrappers, the wrappers' names); a command without one
    comes back unchanged."""
    words, names = list(command), []
    while words and Path(words[0]).name in WRAPPERS:
        name = Path(words[0]).name
        wrapper, words = WRAPPERS[name], words[1:]
        while words and words[0].startswith("-") and words[0] != "-":
            if words[0] == "--":
                words = words[1:]
                break
            span = _option_words(words[0], wrapper)
            if span is None:
                raise WrapperError(f"unsupported {name} option {words[0]!r}: give `{name} "
                                   "python train.py` or run the command without it")
            if span > len(words):
                raise WrapperError(f"{name}: option {words[0]!r} needs a value")
            words = words[span:]
        words = words[wrapper.positional:]
        if not words:
            raise WrapperError(f"no command after `{name}`: expected `{name} python train.py`")
        names.append(name)
    return tuple(words), tuple(names)
