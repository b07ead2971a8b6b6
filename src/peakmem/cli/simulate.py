"""`peakmem simulate TRACE`: replay a peakmem trace file (JSON lines) through the allocator."""

from __future__ import annotations

import json

import click

from peakmem.allocator.config import AllocatorConfig
from peakmem.allocator.simulate import TraceError, simulate
from peakmem.cli.common import echo_simulation, parse_bytes, simulation_options
from peakmem.cli.contract import ContractCommand
from peakmem.inputs import InputError
from peakmem.trace.events import Trace


@click.command("simulate", cls=ContractCommand)
@click.argument("trace_file")
@click.option("--alloc-conf", default="", help="PYTORCH_CUDA_ALLOC_CONF to simulate.")
@simulation_options
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def simulate_trace(
    trace_file: str, alloc_conf: str, torch_version: str | None, capacity: str | None, as_json: bool
) -> None:
    """Replay a peakmem TRACE_FILE (JSON lines, as written by Trace.dump) and print the peaks."""
    # Flags first: a bad flag is reported before a large file is read.
    capacity_bytes = parse_bytes(capacity) if capacity is not None else None
    config = AllocatorConfig.parse(alloc_conf, torch_version)
    trace = Trace.load(trace_file)
    try:
        result = simulate(
            trace, config, torch_version=torch_version, capacity_bytes=capacity_bytes
        )
    except TraceError as exc:
        # Trace.load allows no blank line among the events: event i is on line i + 2.
        line = exc.index + 2 if exc.index is not None else None
        raise InputError(str(exc), trace_file, line) from None
    if as_json:
        click.echo(json.dumps(result.to_dict()))
    else:
        echo_simulation(result)
