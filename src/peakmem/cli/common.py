"""Small helpers shared by the commands: byte formatting/parsing and one-line failures."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NoReturn

import click

from peakmem.allocator.simulate import SimulationResult
from peakmem.cli.contract import BadInput
from peakmem.inputs import one_line, parse_size

MAX_CAPACITY_BYTES = 2**64 - 1
"""The largest --capacity accepted (size_t)."""


def simulation_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """The allocator options shared by the commands that replay memory events."""
    command = click.option(
        "--capacity",
        default=None,
        metavar="BYTES",
        help="Device memory the allocator may reserve (e.g. 80GiB); default unbounded.",
    )(command)
    command = click.option(
        "--torch",
        "torch_version",
        default=None,
        metavar="VERSION",
        help="PyTorch version whose allocator rules apply (default: the newest supported).",
    )(command)
    return command


def fail(message: str, code: int = 2) -> NoReturn:
    """Print a one-line error and exit non-zero (no traceback)."""
    click.echo(f"peakmem: error: {one_line(message, 1000)}", err=True)
    raise SystemExit(code)


def parse_bytes(text: str, flag: str = "--capacity") -> int:
    """'80GiB', '40GB', '1024', '1.5GiB' -> bytes; BadInput naming `flag` for anything else
    (negative, nan, garbage, more than 2**64 - 1)."""
    value = parse_size(text)
    if value is None or value > MAX_CAPACITY_BYTES:
        raise BadInput(
            f"{flag} {one_line(repr(text), 60)} is not a size (use e.g. 80GiB, 40GB or a number "
            f"of bytes, at most {MAX_CAPACITY_BYTES})"
        )
    return value


def format_bytes(n: int) -> str:
    """Bytes with their binary unit, exact to the MiB where it matters: '1.50 GiB (1610612736 B)'."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit} ({n} B)"
    return f"{n} B"


def echo_simulation(result: SimulationResult) -> None:
    """The human summary of a simulated run."""
    click.echo(f"events replayed        {result.events}")
    click.echo(f"allocator config       {result.alloc_conf or '(default)'}")
    click.echo(f"torch rules            {result.torch_version or 'newest'}")
    click.echo(f"peak reserved (sim)    {format_bytes(result.peak_reserved_bytes)}")
    click.echo(f"peak allocated (sim)   {format_bytes(result.peak_allocated_bytes)}")
    click.echo(f"peak requested (sim)   {format_bytes(result.peak_requested_bytes)}")
    click.echo(f"segments at peak       {result.num_segments}")
    click.echo(f"fragmentation at peak  {result.fragmentation_at_peak:.1%}")
    if result.oom:
        click.echo(f"OUT OF MEMORY at event {result.oom_index}: {result.oom_message}")


def row_progress(title: str, as_json: bool) -> Any:
    """The bench's progress bar over rows, on stderr (gone when the run ends, with --json)."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )

    return Progress(TextColumn(title), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                    console=Console(stderr=True), transient=as_json)
