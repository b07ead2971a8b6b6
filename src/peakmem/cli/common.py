"""Small helpers shared by the commands: byte formatting/parsing and one-line failures."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, NoReturn

import click

from peakmem.allocator.simulate import SimulationResult

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
    "k": 2**10,
    "m": 2**20,
    "g": 2**30,
    "t": 2**40,
}


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
    click.echo(f"peakmem: error: {message}", err=True)
    raise SystemExit(code)


def parse_bytes(text: str) -> int:
    """'80GiB', '40GB', '1024', '1.5GiB' -> bytes."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", text)
    if not match or match.group(2).lower() not in _UNITS:
        raise ValueError(f"not a size: {text!r} (use e.g. 80GiB, 40GB or a number of bytes)")
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


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
