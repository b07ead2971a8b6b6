"""Compare two snapshot digests (benchmarks/snapshots/digest.py): a measured one and the digest
of the estimate's own snapshot (`peakmem estimate --snapshot S.pickle`, then digest.py).

    python benchmarks/snapshots/compare_digests.py MEASURED.json.gz ESTIMATE.json.gz

Prints, for each: the peak of the live requested bytes (each rounded up to 512 B, as the
allocator's blocks are) and the allocation that reached it; the sizes whose count of live blocks
differs at the two peaks; and the sizes whose number of allocations over the whole run differs
(transients included). Sizes are requested bytes, as the snapshot records them.
"""

from __future__ import annotations

import argparse
import gzip
import json
from collections import Counter
from pathlib import Path

MiB = 1 << 20


def block(size: int) -> int:
    return max(512, -(-size // 512) * 512)


def peak_live(events: list) -> tuple[int, int, Counter]:
    """(peak bytes, index of the event that reached it, Counter of live block sizes then)."""
    live: dict[int, int] = {}
    current = peak = peak_at = 0
    at_peak: Counter = Counter()
    for index, event in enumerate(events):
        action, addr, size = event[0], event[1], event[2]
        if action == "alloc":
            live[addr] = block(size)
            current += live[addr]
            if current > peak:
                peak, peak_at, at_peak = current, index, Counter(live.values())
        elif action == "free_requested" and addr in live:
            current -= live.pop(addr)
    return peak, peak_at, at_peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("measured", type=Path)
    parser.add_argument("estimate", type=Path)
    args = parser.parse_args()
    runs = {}
    for name, path in (("measured", args.measured), ("estimate", args.estimate)):
        with gzip.open(path, "rt") as fh:
            events = json.load(fh)["events"]
        peak, peak_at, at_peak = peak_live(events)
        allocs = Counter(e[2] for e in events if e[0] == "alloc")
        print(f"{name}: {sum(allocs.values())} allocations; peak of live blocks {peak} B at event "
              f"{peak_at} (an allocation of {events[peak_at][2]} B)")
        runs[name] = (at_peak, allocs)
    (m_live, m_allocs), (e_live, e_allocs) = runs["measured"], runs["estimate"]
    print("live blocks at the peak, where the counts differ (size: measured / estimate):")
    for size in sorted(set(m_live) | set(e_live), reverse=True):
        if m_live[size] != e_live[size]:
            print(f"  {size} B: {m_live[size]} / {e_live[size]}")
    print("allocations over the run, where the counts differ (size: measured / estimate):")
    for size in sorted(set(m_allocs) | set(e_allocs), reverse=True):
        if m_allocs[size] != e_allocs[size]:
            print(f"  {size} B ({size / MiB:.3f} MiB): {m_allocs[size]} / {e_allocs[size]}")


if __name__ == "__main__":
    main()
