"""The `--steps` value: an integer >= 1 or "all"."""

from __future__ import annotations

from typing import Any

import click

from peakmem.jobs.stop import Steps, parse_steps


class StepsType(click.ParamType):
    """`--steps 3` or `--steps all` (run the job to its end, nothing shortened)."""

    name = "N|all"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Steps:
        try:
            return parse_steps(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


STEPS = StepsType()
