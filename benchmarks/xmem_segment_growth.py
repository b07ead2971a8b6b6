"""Which simulated segments push reserved memory above allocated memory in one of xMem's CNN jobs.

Estimates `benchmarks/zoo/xmem_cnn.py` (the rebuilt xMem CNN run) on the given GPU profile and
torch version, replays the estimate's trace into its allocator snapshot
(`peakmem.estimate.memory_snapshot.estimate_snapshot`), and prints:

- the peak reserved bytes, the bytes allocated at that moment and their gap;
- every segment alive at the peak, in creation order: the event index, its size, the request
  that made the allocator cudaMalloc it (size, phase, op, module), the step it came in (0: before
  the first forward; a step starts where a forward allocation follows one of another phase), the bytes allocated just
  before it, and the cached free bytes (reserved - allocated) at that moment (free, but in
  blocks too small or in the wrong pool for the request);
- per (step, phase): how many segments, and their bytes; and the part of them that lies above
  the run's peak allocated bytes (what reserved grows by after it holds as many bytes as the
  job ever has allocated: the reserved - allocated excess of the estimate, by where it came in).

Run (job arguments only; no dataset rows are read or printed):
    PYTHONPATH=src python benchmarks/xmem_segment_growth.py --model RegNetY400MF --batch-size 503 \\
        --optimizer SGD --gpu rtx3060-12gb
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MiB = 2**20
JOB = Path(__file__).resolve().parent / "zoo" / "xmem_cnn.py"


@dataclass
class SegmentBirth:
    index: int
    addr: int
    size: int
    step: int
    allocated_before: int
    reserved_before: int
    request: int = 0
    frames: tuple[str, ...] = ()

    @property
    def cached_free(self) -> int:
        return self.reserved_before - self.allocated_before

    @property
    def phase(self) -> str:
        return self.frames[-1] if self.frames else "?"


def _names(frames: list[dict[str, Any]]) -> tuple[str, ...]:
    return tuple(frame["name"] for frame in frames)


def segment_births(snapshot: dict[str, Any]) -> tuple[list[SegmentBirth], int, int]:
    """The segments alive at the peak of reserved memory (creation order), the peak reserved
    bytes and the bytes allocated (requested) at that peak."""
    live: dict[int, SegmentBirth] = {}
    at_peak: list[SegmentBirth] = []
    allocated = reserved = peak = allocated_at_peak = 0
    step, last_phase = 0, ""
    waiting: SegmentBirth | None = None
    for entry in snapshot["device_traces"][0]:
        action, size = entry["action"], entry["size"]
        if action == "segment_alloc":
            waiting = SegmentBirth(entry["time_us"], entry["addr"], size, step, allocated, reserved)
            live[entry["addr"]] = waiting
            reserved += size
        elif action == "segment_free":
            live.pop(entry["addr"], None)
            reserved -= size
        elif action == "alloc":
            phase = entry["frames"][-1]["name"] if entry["frames"] else ""
            if "(forward)" in phase and "(forward)" not in last_phase:
                step += 1
                if waiting is not None:
                    waiting.step = step
            last_phase = phase
            if waiting is not None:
                waiting.request, waiting.frames = size, _names(entry["frames"])
                waiting = None
            allocated += size
        elif action == "free_completed":
            allocated -= size
        if reserved > peak:
            peak, allocated_at_peak = reserved, allocated
            at_peak = sorted(live.values(), key=lambda birth: birth.index)
    return at_peak, peak, allocated_at_peak


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--batch-size", type=int, required=True)
    p.add_argument("--optimizer", default="AdamW")
    p.add_argument("--zero-grad-mode", type=int, default=1)
    p.add_argument("--gpu", default="rtx3060-12gb")
    p.add_argument("--torch", default="2.6.0")
    args = p.parse_args()

    from peakmem.estimate import estimate_command
    from peakmem.estimate.memory_snapshot import estimate_snapshot

    argv = ["python", str(JOB), "--model", args.model, "--batch-size", str(args.batch_size),
            "--optimizer", args.optimizer, "--zero-grad-mode", str(args.zero_grad_mode)]
    estimate = estimate_command(argv, gpu=args.gpu, torch_version=args.torch)
    births, peak, allocated = segment_births(estimate_snapshot(estimate))
    print(f"{' '.join(argv[1:])} on {args.gpu} / torch {args.torch}")
    print(f"estimate: peak allocated {estimate.peak_allocated_bytes / MiB:.0f} MiB, peak reserved "
          f"{estimate.peak_reserved_bytes / MiB:.0f} MiB, libraries {estimate.library_bytes / MiB:.0f}"
          f" MiB, context {estimate.context_bytes / MiB:.0f} MiB")
    print(f"peak reserved {peak / MiB:.0f} MiB, allocated then {allocated / MiB:.0f} MiB, "
          f"gap {(peak - allocated) / MiB:.0f} MiB; {len(births)} segments")
    print("index     step  size MiB  request MiB  cached free MiB  alloc before MiB  phase / op / module")
    groups: dict[tuple[int, str], list[int]] = defaultdict(lambda: [0, 0, 0])
    reserved = 0
    for b in births:
        above = max(0, reserved + b.size - max(reserved, estimate.peak_allocated_bytes))
        reserved += b.size
        groups[(b.step, b.phase)][0] += 1
        groups[(b.step, b.phase)][1] += b.size
        groups[(b.step, b.phase)][2] += above
        print(f"{b.index:>8} {b.step:>5} {b.size / MiB:>9.1f} {b.request / MiB:>12.1f} "
              f"{b.cached_free / MiB:>16.1f} {b.allocated_before / MiB:>17.1f}  "
              f"{' / '.join(reversed(b.frames))}")
    print(f"above the peak allocated ({estimate.peak_allocated_bytes / MiB:.0f} MiB): "
          f"{sum(g[2] for g in groups.values()) / MiB:.0f} MiB")
    print("step  phase                        segments    MiB  MiB above peak allocated")
    for (step, phase), (count, size, above) in sorted(groups.items()):
        print(f"{step:>4}  {phase:<28} {count:>8} {size / MiB:>6.0f}  {above / MiB:>6.0f}")


if __name__ == "__main__":
    sys.exit(main())
