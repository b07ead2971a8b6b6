"""`--emit FORMAT`, `--emit-option KEY=VALUE` and `--mib-per-shard`, shared by `estimate` and
`pack` (formats and their options: `peakmem.schedule.emit.FORMATS`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import click

from peakmem.cli.contract import BadInput


def emit_options(command: Callable[..., Any]) -> Callable[..., Any]:
    from peakmem.schedule.emit import FORMATS

    command = click.option(
        "--mib-per-shard",
        type=click.IntRange(min=1),
        default=None,
        metavar="MIB",
        help="--emit slurm: the site's GPU memory per Slurm shard, in MiB.",
    )(command)
    command = click.option(
        "--emit-option",
        "emit_option",
        multiple=True,
        metavar="KEY=VALUE",
        help="An option of the --emit format (e.g. fraction=true, queue=team-a, image=repo/img:tag, "
        "gpucores=50, mig=3g.20gb); repeatable.",
    )(command)
    command = click.option(
        "--emit",
        "emit",
        type=click.Choice(sorted(FORMATS), case_sensitive=False),
        default=None,
        help="Print the scheduler's request (a Pod manifest or the lines to add) instead of the "
        "table; with --json it goes under \"emit\".",
    )(command)
    return command


def parse_emit_options(pairs: Sequence[str], mib_per_shard: int | None) -> dict[str, Any]:
    """`KEY=VALUE` pairs as keyword options of `peakmem.schedule.emit.render`."""
    options: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key.isidentifier():
            raise BadInput(f"--emit-option {pair!r} is not KEY=VALUE")
        options[key] = value.strip()
    if mib_per_shard is not None:
        options["mib_per_shard"] = mib_per_shard
    return options
