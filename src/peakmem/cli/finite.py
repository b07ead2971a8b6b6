"""`FiniteFloatRange`: click's FloatRange, without NaN and the infinities.

click.FloatRange checks its bounds with `<` and `>`, which NaN passes whatever they are (and a
range open at the top takes `inf`): `batch --max-seconds nan` ran every job with a NaN deadline
and `serve --admission-budget nan` started. A number of seconds, a margin or a rate is finite.
"""

from __future__ import annotations

import math
from typing import Any

import click


class FiniteFloatRange(click.FloatRange):
    """A FloatRange whose value must also be a finite number (usage error otherwise)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return number
