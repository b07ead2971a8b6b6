"""`peakmem simulate TRACE`: replay a peakmem trace file (JSON lines) through the allocator."""

from __future__ import annotations

import json

import click

from peakmem.allocator.config import AllocatorConfigError
from peakmem.allocator.simulate import TraceError, simulate
from peakmem.cli.common import echo_simulation, fail, parse_bytes, simulation_options
from peakmem.trace.events import Trace


@click.command("simulate")
@click.argument("trace_file", type=click.Path(dir_okay=False))
@click.option("--alloc-conf", default="", help="PYTORCH_CUDA_ALLOC_CONF to simulate.")
@simulation_options
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def simulate_trace(
    trace_file: str, alloc_conf: str, torch_version: str | None, capacity: str | None, as_json: bool
) -> None:
    """Replay a peakmem TRACE_FILE (JSON lines, as written by Trace.dump) and print the peaks."""
    try:
        trace = Trace.load(trace_file)
        capacity_bytes = parse_bytes(capacity) if capacity is not None else None
        result = simulate(
            trace, alloc_conf, torch_version=torch_version, capacity_bytes=capacity_bytes
        )
    except FileNotFoundError:
        fail(f"no such file: {trace_file}")
    except (TraceError, AllocatorConfigError, ValueError) as exc:
        fail(str(exc))
    if as_json:
        click.echo(json.dumps(result.to_dict()))
    else:
        echo_simulation(result)
