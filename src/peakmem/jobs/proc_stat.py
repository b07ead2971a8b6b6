"""A process's `/proc/PID/stat` line (Linux), read safely.

The command name (field 2) may hold spaces and parentheses, so the fields are split after the
last ')': the list returned starts at field 3 (state), i.e. field N is at index N - 3.
"""

from __future__ import annotations


def stat_fields(pid: int | str) -> list[bytes] | None:
    """The fields of `/proc/PID/stat` after the command name, or None where /proc does not say
    (not Linux, no such process)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            raw = handle.read()
    except OSError:
        return None
    end = raw.rfind(b")")
    return raw[end + 2:].split() if end >= 0 else None
