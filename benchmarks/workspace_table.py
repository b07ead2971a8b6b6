"""Extract kernel workspaces from allocator snapshots into a table per op and shape.

    python benchmarks/workspace_table.py SNAPSHOT.pickle... --out table.csv

Two kinds of input:
- windowed snapshots written by benchmarks/workspace_probe.py: {"meta": {...}, "windows": [{"op",
  "direction", "shape", "dtype", "benchmark", "call", "events": [trace events]}]}; each window
  holds the allocator events of exactly one op call, so every allocation made and freed inside
  it is a temporary of that op (the workspace, plus any scratch the kernel needed);
- plain `torch.cuda.memory._dump_snapshot` pickles (e.g. from `peakmem measure --snapshot` with
  `--snapshot-stacks all`): allocations are attributed to a library through their C++ frames
  (cuDNN, cuBLAS, cuBLASLt, SDPA kernels) and to the nearest aten op; shapes are not known there.

Trace events are dicts with `action` (alloc, free_requested, free_completed, segment_alloc, ...),
`addr`, `size`, `stream` and optionally `frames` ([{"name", "filename", "line"}]).
"""

from __future__ import annotations

import argparse
import csv
import pickle
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

# library -> pattern over C++ frame names (first match wins, in this order)
LIBRARY_PATTERNS: dict[str, re.Pattern[str]] = {
    "sdpa-flash": re.compile(r"flash", re.I),
    "sdpa-efficient": re.compile(r"efficient_attention|mem_eff|fmha", re.I),
    "cudnn": re.compile(r"cudnn", re.I),
    "cublaslt": re.compile(r"cublasLt|LtWorkspace|gemm_and_bias|scaled_gemm", re.I),
    "cublas": re.compile(r"cublas|CUDABlas", re.I),
}
ATEN_OP = re.compile(r"at::(?:native|_ops)::(?:\(anonymous namespace\)::)?(\w+)")


@dataclass
class WorkspaceRow:
    source: str
    op: str
    direction: str
    shape: str
    dtype: str
    benchmark: str
    call: str
    library: str
    count: int  # temporaries (allocated and freed inside the window)
    max_bytes: int  # the largest one (requested size)
    peak_concurrent_bytes: int  # the most temporary bytes alive at once
    sizes: str  # distinct requested sizes, largest first
    output_bytes: int  # allocated in the window and still alive at its end


def _free_action(events: list[dict[str, Any]]) -> str:
    """The action that marks a free: `free_requested` (torch >= 2.1: the block is returned to the
    allocator; `free_completed` follows once other streams are done), else the older `free`."""
    actions = {event.get("action") for event in events}
    for action in ("free_requested", "free", "free_completed"):
        if action in actions:
            return action
    return "free_requested"


def temporaries(events: list[dict[str, Any]]) -> tuple[list[int], int, int]:
    """(sizes of the allocations freed within ``events``, the peak of their concurrent bytes,
    bytes allocated and still alive at the end)."""
    free_action = _free_action(events)
    live: dict[int, int] = {}
    deltas: list[tuple[int, int]] = []  # (alloc id, +size or -size)
    ids: dict[int, int] = {}
    freed_ids: set[int] = set()
    freed_sizes: list[int] = []
    for index, event in enumerate(events):
        action = event.get("action")
        if action == "alloc":
            live[event["addr"]] = event["size"]
            ids[event["addr"]] = index
            deltas.append((index, event["size"]))
        elif action == free_action and event["addr"] in live:
            size = live.pop(event["addr"])
            alloc_id = ids.pop(event["addr"])
            freed_ids.add(alloc_id)
            freed_sizes.append(size)
            deltas.append((alloc_id, -size))
    current = peak = 0
    for alloc_id, delta in deltas:
        if alloc_id in freed_ids:
            current += delta
            peak = max(peak, current)
    return freed_sizes, peak, sum(live.values())


def rows_from_windows(data: dict[str, Any], source: str) -> list[WorkspaceRow]:
    rows = []
    for window in data["windows"]:
        sizes, peak, output = temporaries(window["events"])
        rows.append(
            WorkspaceRow(
                source=source,
                op=str(window.get("op", "")),
                direction=str(window.get("direction", "")),
                shape=str(window.get("shape", "")),
                dtype=str(window.get("dtype", "")),
                benchmark=str(window.get("benchmark", "")),
                call=str(window.get("call", "")),
                library=str(window.get("library", "")),
                count=len(sizes),
                max_bytes=max(sizes, default=0),
                peak_concurrent_bytes=peak,
                sizes=";".join(str(s) for s in sorted(set(sizes), reverse=True)),
                output_bytes=output,
            )
        )
    return rows


def library_of(frames: list[dict[str, Any]]) -> tuple[str, str]:
    """(library, aten op) named by an allocation's frames; ("", "") when none matches."""
    names = [str(frame.get("name", "")) for frame in frames]
    library = next(
        (lib for lib, pattern in LIBRARY_PATTERNS.items() if any(pattern.search(n) for n in names)),
        "",
    )
    op = next((m.group(1) for n in names if (m := ATEN_OP.search(n))), "")
    return library, op


def rows_from_snapshot(data: dict[str, Any], source: str) -> list[WorkspaceRow]:
    """Allocations made by a kernel library, grouped by (library, op)."""
    groups: dict[tuple[str, str], list[int]] = {}
    for device_events in data.get("device_traces", []):
        for event in device_events:
            if event.get("action") != "alloc":
                continue
            library, op = library_of(event.get("frames") or [])
            if library:
                groups.setdefault((library, op), []).append(event["size"])
    rows = []
    for (library, op), sizes in sorted(groups.items()):
        rows.append(
            WorkspaceRow(
                source=source, op=op, direction="", shape="", dtype="", benchmark="", call="",
                library=library, count=len(sizes), max_bytes=max(sizes), peak_concurrent_bytes=0,
                sizes=";".join(str(s) for s in sorted(set(sizes), reverse=True)), output_bytes=0,
            )
        )  # fmt: skip
    return rows


def extract(data: dict[str, Any], source: str) -> list[WorkspaceRow]:
    if "windows" in data:
        return rows_from_windows(data, source)
    if "device_traces" in data:
        return rows_from_snapshot(data, source)
    raise ValueError(f"{source}: neither a windowed probe file nor a memory snapshot")


def write_table(rows: list[WorkspaceRow], out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(WorkspaceRow.__dataclass_fields__))
        writer.writeheader()
        for row in rows:
            writer.writerow(asdict(row))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("inputs", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    rows: list[WorkspaceRow] = []
    for path in args.inputs:
        try:
            with path.open("rb") as handle:
                data = pickle.load(handle)
            rows.extend(extract(data, path.name))
        except (OSError, pickle.UnpicklingError, ValueError, KeyError) as exc:
            parser.exit(2, f"workspace_table: {path}: {exc}\n")
    write_table(rows, args.out)
    print(f"wrote {len(rows)} rows to {args.out}")


if __name__ == "__main__":
    main()
