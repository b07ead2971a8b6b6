"""`peakmem replay SNAPSHOT`: replay a real memory snapshot through the allocator simulation."""

from __future__ import annotations

import json

import click

from peakmem.allocator.config import AllocatorConfig, AllocatorConfigError
from peakmem.allocator.simulate import simulate
from peakmem.cli.common import echo_simulation, format_bytes, parse_bytes, simulation_options
from peakmem.cli.contract import ContractCommand
from peakmem.inputs import InputError
from peakmem.trace.snapshot import SnapshotError, load_snapshot, snapshot_to_trace


@click.command(cls=ContractCommand)
@click.argument("snapshot")
@click.option(
    "--alloc-conf",
    default=None,
    help="PYTORCH_CUDA_ALLOC_CONF to simulate "
    "(default: the one recorded in the snapshot, else none).",
)
@simulation_options
@click.option("--device", type=click.IntRange(min=0), default=None,
              help="Device of the snapshot to replay.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def replay(
    snapshot: str,
    alloc_conf: str | None,
    torch_version: str | None,
    capacity: str | None,
    device: int | None,
    as_json: bool,
) -> None:
    """Replay the alloc/free events of a memory SNAPSHOT (a pickle written by
    torch.cuda.memory._dump_snapshot()) and print the simulated peaks, next to the recorded ones.

    The pickle is read with an allow-list unpickler: only plain data, no code from the file runs.
    """
    # Flags first: a bad flag is reported before a large file is read.
    capacity_bytes = parse_bytes(capacity) if capacity is not None else None
    if torch_version is not None or alloc_conf is not None:
        AllocatorConfig.parse(alloc_conf or "", torch_version)
    data = load_snapshot(snapshot)
    try:
        trace, facts = snapshot_to_trace(data, device)
    except SnapshotError as exc:
        raise exc.at(snapshot) from None
    if alloc_conf is not None:
        config = AllocatorConfig.parse(alloc_conf, torch_version)
    else:
        try:
            config = AllocatorConfig.parse(facts.alloc_conf or "", torch_version)
        except AllocatorConfigError as exc:
            raise InputError(
                f"the recorded PYTORCH_CUDA_ALLOC_CONF {facts.alloc_conf!r}: {exc} "
                "(override it with --alloc-conf)",
                snapshot,
            ) from None
    result = simulate(
        trace,
        config,
        torch_version=torch_version,
        capacity_bytes=capacity_bytes,
        segment_address_hints=facts.segment_addresses,
    )

    out = result.to_dict()
    if facts.peak_reserved_bytes is not None:
        # Segments older than the trace are reserved throughout: the simulation starts empty.
        out["recorded_peak_reserved_bytes"] = facts.peak_reserved_bytes
        out["recorded_baseline_reserved_bytes"] = facts.baseline_reserved_bytes
        out["difference_bytes"] = (
            result.peak_reserved_bytes + facts.baseline_reserved_bytes - facts.peak_reserved_bytes
        )
    out["snapshot_oom_events"] = facts.oom_events
    if as_json:
        click.echo(json.dumps(out))
        return
    echo_simulation(result)
    if facts.peak_reserved_bytes is not None:
        click.echo(f"peak reserved (recorded) {format_bytes(facts.peak_reserved_bytes)}")
        diff = out["difference_bytes"]
        verdict = "exact" if diff == 0 else f"{'+' if diff > 0 else '-'}{format_bytes(abs(diff))}"
        click.echo(f"difference             {verdict}")
