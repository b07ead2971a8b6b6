"""Size decisions with thresholds, asked again for a predicted call (capture.length_family).

A CUDA rule whose sizes step with its inputs' numbers (a launch configuration with thresholds, a
dimension padded to a block multiple) is no polynomial in a sequence length, so a growing-length
family's fit cannot carry it. Such a rule records each decision here while a call is observed
(`record(function, call, answer)`: `function(*call) == answer`, `call` and `answer` made of
numbers, tuples and bools); for a predicted call the recorded calls' numbers are predicted with
the rest of the window, and the call is replayed only when every `function` answers the
predicted call as predicted (`hold`). Bools (a branch taken or not) are part of a window's
skeleton, not its numbers: they must answer the same.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

CALLS: list | None = None
"""While a list (capture.repeated_forwards observing a call), each decision's (function, call,
answer) is appended."""


def record(function: Callable[..., Any], call: tuple, answer: Any) -> Any:
    """Note `function(*call) == answer` for a predicted call's check; returns `answer`."""
    if CALLS is not None:
        CALLS.append((function, call, answer))
    return answer


def ask(function: Callable[..., Any], *call: Any) -> Any:
    """`function(*call)`, recorded."""
    return record(function, call, function(*call))


def hold(checks: Iterable[tuple]) -> bool:
    """Every recorded decision answers its (predicted) call as it did (as predicted)."""
    try:
        return all(function(*call) == answer for function, call, answer in checks)
    except Exception:  # noqa: BLE001 - a predicted call the rule cannot take: no replay
        return False
