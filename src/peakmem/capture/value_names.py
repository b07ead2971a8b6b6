"""File names made from device values, which fake mode reads as zeros.

A job that names its checkpoints after a device value read on the host
(`torch.save(state, f"ckpt_{loss.item():.3f}.pt")`, `f"epoch{acc}"` with `acc` a device tensor)
gets the placeholder zeros of fake mode in those names: every save goes to `ckpt_0.000.pt`.
The memory the job uses does not depend on the names, but the saves collide where the GPU's
would not, and a job whose path depends on them (`if os.path.exists(name)`, loading "the best"
checkpoint back) may run differently. The saves' names are checked here (capture.side_effects
calls `ZeroNamedSaves.saw`): a name with a decimal zero (`0.0`, `0.000`, `0.00e+00`) saved after
a host read that saw zeros is reported in a note, with how often a name was written again.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from dataclasses import dataclass, field

_DECIMAL_ZERO = re.compile(r"(?<![\d.])-?0\.0+(?:e[+-]?0+)?(?![\d])|(?<![\d.])-?0e[+-]?0+(?![\d])")
"""A zero as Python formats a float (`0.0`, `0.000`, `-0.0`, `0.00e+00`, `0e+00`): an integer `0`
(`epoch0`, a step counter) is not one."""
SHOWN = 3


def has_decimal_zero(path: str) -> bool:
    """Whether the file name (not its folders) holds a float zero."""
    return _DECIMAL_ZERO.search(os.path.basename(path)) is not None


@dataclass
class ZeroNamedSaves:
    """Saves whose names may hold device values read as zeros, in the order the job made them."""

    names: Counter[str] = field(default_factory=Counter)

    def saw(self, path: str, host_reads: int) -> None:
        """A save to `path` after `host_reads` host reads answered with zeros."""
        if host_reads and has_decimal_zero(path):
            self.names[path] += 1

    def note(self) -> str | None:
        if not self.names:
            return None
        paths = list(self.names)
        shown = ", ".join(paths[:SHOWN]) + (
            f" (and {len(paths) - SHOWN} more)" if len(paths) > SHOWN else "")
        saves = sum(self.names.values())
        again = saves - len(paths)
        collided = (f"; {saves} saves went to {len(paths)} name(s), {again} of them over an "
                    "earlier one" if again else "")
        return (
            f"the job saved to file name(s) holding a zero ({shown}) after reading device values "
            "on the host, which fake mode answers with zeros: if those names are made from "
            "device values (f\"ckpt_{loss:.3f}.pt\"), the GPU run names its files differently"
            f"{collided}; the memory estimate does not depend on the names, but a job whose "
            "path does (os.path.exists, loading the best checkpoint back) may have run "
            "differently here: --mode eager reads the real values"
        )
