"""Name every fallback where it happens, and say the assumptions in one line.

- a GPU alias (`--gpu a100`) resolves to one profile (`a100-40gb`): say which, and its siblings;
- a torch version without a stack profile of its own uses an older one: say which;
- the values an estimate assumed rather than measured: one line naming them (all of them with
  `--verbose` and in `--json`).
"""

from __future__ import annotations

from collections.abc import Sequence

from peakmem.profiles import GpuProfile, StackProfile, known_gpus

GIB = 2**30


def gpu_alias_note(requested: str, profile: GpuProfile) -> str | None:
    """`--gpu a100` -> "--gpu a100 is a100-40gb (NVIDIA A100-SXM4-40GB, 39.59 GiB); also:
    a100-80gb"; None when the name given is the profile's own."""
    if requested.strip().lower() == profile.name:
        return None
    family = profile.name.split("-")[0]
    siblings = [name for name in known_gpus()
                if name != profile.name and name.split("-")[0] == family]
    note = (f"--gpu {requested.strip()} is {profile.name} ({profile.device_name}, "
            f"{profile.total_memory_bytes / GIB:.2f} GiB)")
    if siblings:
        note += f"; other profiles of this family: {', '.join(siblings)}"
    return note


def stack_note(torch_version: str, stack: StackProfile) -> str | None:
    """The stack profile used for a torch version that has none of its own, named."""
    parts = torch_version.split("+")[0].split(".")
    own = f"torch-{parts[0]}.{parts[1]}" if len(parts) > 1 else f"torch-{parts[0]}"
    if stack.name == own:
        return None
    since = ".".join(str(part) for part in stack.torch_min)
    return (f"torch {torch_version} has no stack profile of its own: the {stack.name} profile "
            f"(torch >= {since}) gives its CUDA context, library workspaces and safety margin")


def _label(assumption: str) -> str:
    """The name of an assumption: the text before its value or its explanation."""
    for stop in (":", " (", ";"):
        head = assumption.split(stop, 1)[0]
        if len(head) < len(assumption):
            assumption = head
    return assumption.strip()[:60]


def assumptions_line(assumptions: Sequence[str]) -> str | None:
    """One line for all the assumptions, e.g. "3 values assumed, not measured for this
    GPU/stack: CUDA context, cuBLASLt per-call workspace, safety margin (--verbose lists
    them)"."""
    if not assumptions:
        return None
    labels = ", ".join(_label(item) for item in assumptions)
    return f"{len(assumptions)} assumption(s): {labels} (--verbose or --json lists them)"
