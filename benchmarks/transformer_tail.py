"""The GPUMemNet Transformer rows peakmem still under-estimates, sorted into what the misses are
(issue 13, the A100 / torch-2.4 large-vocabulary tail).

    python benchmarks/transformer_tail.py HELD.json [SPLIT.json ...] [--data DIR] [--min-mib 100]
    python benchmarks/transformer_tail.py HELD.json SPLIT.json --probe   # + the layout probe

The inputs are result files of `score_transformer_rows.py --out`. For every row at least
`--min-mib` under, it prints the launcher campaign the row was measured in (GPUMemNet's step-1
or step-2 runs: the dataset README, `source_offset`), the miss, the row's largest-gradient
segment (the embedding's) and what the miss matches:
- `N x segment`: N (1 or 2) whole segments of the largest gradient, to 16 MiB or 3%: the real
  allocator held that many more segments of the job's largest size;
- `shared ~X`: the same amount (to 12 MiB) as another tail row whose largest segment differs by
  more than 10%: an amount that does not depend on the job.
`--probe-all OUT.json` probes every scored row (`--campaign` to keep one campaign's) and
writes the moves; `--layout-margin OUT.json --fraction F` counts the rows still under when each
states `estimate x (1 + F) + its upward layout excess` instead of the stated margin.
`--scan-margins SPLIT.json HELD.json`: the stated-margin forms `fraction + N segments + a
constant` (the constant: an amount independent of the job), fitted on the split.
`--over` lists the rows over by at least `--min-mib` instead, classified the same way.
`--probe` re-captures each tail row and replays its trace with the layout probe
(estimate/layout_probe.py): `up +X` / `down -X` is how far a small perturbation (one extra 2-8
MiB block, or the cuBLAS workspaces at another CUBLAS_WORKSPACE_CONFIG size) moves the reserved
peak beyond what the perturbation itself takes, i.e. whether the estimate sits on a layout edge.
The table holds row ids and derived figures only; the measurements stay in ../shared/datasets.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

DATASET = "gpumemnet-transformer"
STEP2_FIRST_OFFSET = 4_285_310
"""`source_offset` of the first page of GPUMemNet's step-2 runs in transformer_data_sample.csv
(README: the first ~4.2 M characters, rows 00000-00532, are step-1 runs)."""
SEGMENT_TOLERANCE_MIB = 16.0
SEGMENT_TOLERANCE_SHARE = 0.03
SHARED_TOLERANCE_MIB = 12.0
SHARED_MIN_SEGMENT_RATIO = 1.10


@dataclass
class TailRow:
    """One under-estimated row and what its miss matches."""

    row_id: str
    deficit_mib: float
    segment_mib: float
    measured_mib: float
    campaign: str
    config: str = ""
    whole_segments: int | None = None
    shared_with: list[str] = field(default_factory=list)

    @property
    def kind(self) -> str:
        parts = []
        if self.whole_segments:
            parts.append(f"{self.whole_segments} x segment")
        if self.shared_with:
            parts.append(f"shared ~{self.deficit_mib:.0f} ({', '.join(self.shared_with)})")
        return "; ".join(parts) or "other"


def campaign_of(source_offset: int) -> str:
    """GPUMemNet's launcher campaign of a row ("step 1" / "step 2") by its page offset."""
    return "step 1" if source_offset < STEP2_FIRST_OFFSET else "step 2"


def whole_segments(deficit_mib: float, segment_mib: float, most: int = 2) -> int | None:
    """N in 1..most when the deficit is N segments to SEGMENT_TOLERANCE (MiB or share)."""
    if segment_mib <= 0:
        return None
    for n in range(1, most + 1):
        tolerance = max(SEGMENT_TOLERANCE_MIB, SEGMENT_TOLERANCE_SHARE * n * segment_mib)
        if abs(deficit_mib - n * segment_mib) <= tolerance:
            return n
    return None


def mark_shared(rows: list[TailRow]) -> None:
    """Fill `shared_with`: rows missing the same amount (to SHARED_TOLERANCE_MIB) while their
    largest segments differ by more than SHARED_MIN_SEGMENT_RATIO."""
    for row in rows:
        row.shared_with = sorted(
            other.row_id for other in rows
            if other is not row
            and abs(other.deficit_mib - row.deficit_mib) <= SHARED_TOLERANCE_MIB
            and max(other.segment_mib, row.segment_mib)
            > SHARED_MIN_SEGMENT_RATIO * max(min(other.segment_mib, row.segment_mib), 1e-9)
        )


def tail_rows(results: Mapping[str, dict], offsets: Mapping[str, int],
              min_mib: float = 100.0, over: bool = False) -> list[TailRow]:
    """The rows of `results` (score_transformer_rows.py's format) at least `min_mib` under
    (`over`: over; `deficit_mib` is then the excess), worst first, classified."""
    rows = []
    sign = 1.0 if over else -1.0
    for row_id, r in results.items():
        if "error_mib" not in r or sign * r["error_mib"] < min_mib:
            continue
        deficit = sign * r["error_mib"]
        segment = r.get("largest_gradient_segment_mib", 0.0)
        rows.append(TailRow(row_id, deficit, segment, r["measured_mib"],
                            campaign_of(offsets.get(row_id, 0)), r.get("config", ""),
                            whole_segments(deficit, segment)))
    mark_shared(rows)
    return sorted(rows, key=lambda t: -t.deficit_mib)


def campaign_counts(results: Mapping[str, dict], offsets: Mapping[str, int],
                    tail: Iterable[TailRow]) -> dict[str, tuple[int, int]]:
    """campaign -> (scored rows, tail rows)."""
    scored: dict[str, int] = {}
    for row_id, r in results.items():
        if "error_mib" in r:
            name = campaign_of(offsets.get(row_id, 0))
            scored[name] = scored.get(name, 0) + 1
    under: dict[str, int] = {}
    for t in tail:
        under[t.campaign] = under.get(t.campaign, 0) + 1
    return {name: (count, under.get(name, 0)) for name, count in sorted(scored.items())}


def table(rows: list[TailRow], probes: Mapping[str, str] | None = None) -> str:
    head = "| row | campaign | config | miss MiB | miss / measured | largest segment MiB | miss / segment | matches |"
    sep = "|---|---|---|---|---|---|---|---|"
    if probes is not None:
        head += " layout probe |"
        sep += "---|"
    lines = [head, sep]
    for t in rows:
        line = (f"| {t.row_id} | {t.campaign} | {t.config} | {t.deficit_mib:.0f} | "
                f"{t.deficit_mib / t.measured_mib:.1%} | {t.segment_mib:.0f} | "
                f"{t.deficit_mib / t.segment_mib if t.segment_mib else float('nan'):.2f} | "
                f"{t.kind} |")
        if probes is not None:
            line += f" {probes.get(t.row_id, '-')} |"
        lines.append(line)
    return "\n".join(lines)


def probe_rows(row_ids: Iterable[str], data: str | None,
               raw: dict[str, dict[str, float]] | None = None) -> dict[str, str]:
    """Re-capture each row as the bench does and run the layout probe on its trace; `raw`
    (if given) gets {row: {"up_mib", "down_mib"}}."""
    import io
    from contextlib import redirect_stderr, redirect_stdout

    from peakmem.baselines.peakmem_estimator import gpumemnet_command
    from peakmem.datasets.loaders import load_rows
    from peakmem.estimate import estimate_command
    from peakmem.estimate.layout_probe import probe_layout

    wanted = set(row_ids)
    out: dict[str, str] = {}
    for row in load_rows(DATASET, data):
        if row.id not in wanted:
            continue
        with redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()):
            estimate = estimate_command(gpumemnet_command(row), gpu=row.gpu,
                                        torch_version=row.torch_version, isolate=False)
        probe = probe_layout(estimate.capture.trace, estimate.alloc_conf, estimate.torch_version)
        mib = 1 << 20
        out[row.id] = (f"up +{probe.max_excess_bytes / mib:.0f}, "
                       f"down {probe.min_excess_bytes / mib:+.0f}")
        if raw is not None:
            raw[row.id] = {"up_mib": probe.max_excess_bytes / mib,
                           "down_mib": probe.min_excess_bytes / mib}
        print(f"{row.id} probe {out[row.id]}", flush=True)
    return out


def under_with_layout_reserve(results: Mapping[str, dict], probes: Mapping[str, dict],
                              fraction: float) -> tuple[int, int, float]:
    """(rows under, rows counted, median stated / measured - 1) when each probed row states
    `estimate x (1 + fraction) + its layout probe's upward excess`."""
    stated = [
        (r["estimated_mib"] * (1 + fraction) + probes[k]["up_mib"]) / r["measured_mib"] - 1
        for k, r in results.items() if "error_mib" in r and k in probes
    ]
    if not stated:
        return 0, 0, 0.0
    return sum(s < 0 for s in stated), len(stated), statistics.median(stated)


def fitted_fraction(results: Mapping[str, dict], segments: int, constant_mib: float,
                    failures: float = 0.01) -> float:
    """The smallest fraction (0.5% steps) for which `estimate x (1 + f) + segments x segment +
    constant_mib` leaves at most `failures` of the rows under (score_transformer_rows.py's
    rule, with a constant added)."""
    needed = sorted(
        max(0.0, (r["measured_mib"] - segments * r.get("largest_gradient_segment_mib", 0.0)
                  - constant_mib) / r["estimated_mib"] - 1)
        for r in results.values() if "error_mib" in r and r["estimated_mib"] > 0
    )
    if not needed:
        return 0.0
    allowed = int(failures * len(needed))
    return math.ceil(round(needed[len(needed) - 1 - allowed] * 200, 9)) / 200


def scan_margins(split: Mapping[str, dict], held: Mapping[str, dict],
                 constants: Iterable[float] = (0, 256, 512, 768, 1024, 1536, 2048),
                 most_segments: int = 2) -> list[str]:
    """For each (segments, constant): the fraction fitted on `split`, and on both sets the rows
    under and the median / mean stated over measured."""
    def stated(results, f, k, c):
        return [(r["estimated_mib"] * (1 + f) + k * r.get("largest_gradient_segment_mib", 0.0)
                 + c) / r["measured_mib"] - 1 for r in results.values() if "error_mib" in r]

    lines = ["| segments | constant MiB | fraction | split under | split median / mean "
             "| held-out under | held-out median / mean |", "|---|---|---|---|---|---|---|"]
    for k in range(most_segments + 1):
        for c in constants:
            f = fitted_fraction(split, k, c)
            a, b = stated(split, f, k, c), stated(held, f, k, c)
            lines.append(
                f"| {k} | {c:.0f} | {f:.1%} | {sum(x < 0 for x in a)}/{len(a)} | "
                f"{statistics.median(a):+.1%} / {statistics.fmean(a):+.1%} | "
                f"{sum(x < 0 for x in b)}/{len(b)} | "
                f"{statistics.median(b):+.1%} / {statistics.fmean(b):+.1%} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path, nargs="+")
    parser.add_argument("--data", default=None)
    parser.add_argument("--min-mib", type=float, default=100.0)
    parser.add_argument("--probe", action="store_true")
    parser.add_argument("--probe-all", type=Path, default=None, metavar="OUT.json",
                        help="probe every scored row (of --campaign) and write the figures "
                        "to OUT.json (row ids and MiB moves only)")
    parser.add_argument("--campaign", default=None, choices=["step 1", "step 2"])
    parser.add_argument("--layout-margin", type=Path, default=None, metavar="PROBES.json",
                        help="rows under at +FRACTION + each row's upward layout excess")
    parser.add_argument("--fraction", type=float, default=0.03)
    parser.add_argument("--without-excess", action="store_true",
                        help="with --layout-margin: the same rows at the fraction alone")
    parser.add_argument("--scan-margins", action="store_true",
                        help="RESULTS = SPLIT.json HELD.json: margins of a fraction + whole "
                        "segments + a constant, fitted on the split, scored on both")
    parser.add_argument("--over", action="store_true",
                        help="the rows over by at least --min-mib instead (the same classes)")
    args = parser.parse_args()
    if args.scan_margins:
        split, held = (json.loads(p.read_text()) for p in args.results[:2])
        print("\n".join(scan_margins(split, held)))
        return
    from peakmem.datasets.loaders import load_rows

    offsets = {r.id: int(r.features.get("source_offset") or 0)
               for r in load_rows(DATASET, args.data)}
    results: dict[str, dict] = {}
    for path in args.results:
        results |= json.loads(path.read_text())
    if args.campaign:
        results = {k: r for k, r in results.items()
                   if campaign_of(offsets.get(k, 0)) == args.campaign}
    if args.probe_all:
        raw: dict[str, dict[str, float]] = {}
        probe_rows([k for k, r in results.items() if "error_mib" in r], args.data, raw)
        args.probe_all.write_text(json.dumps(raw, indent=1))
        flips = sum(v["up_mib"] > 0 or v["down_mib"] < 0 for v in raw.values())
        print(f"{flips} of {len(raw)} probed rows sit on a layout edge")
        return
    if args.layout_margin:
        probes = json.loads(args.layout_margin.read_text())
        if args.without_excess:
            probes = {k: {**v, "up_mib": 0.0} for k, v in probes.items()}
        under, counted, median = under_with_layout_reserve(results, probes, args.fraction)
        what = "" if args.without_excess else " + layout excess"
        print(f"+{args.fraction:.1%}{what}: {under} of {counted} rows under, "
              f"stated over measured median {median:+.1%}")
        return
    tail = tail_rows(results, offsets, args.min_mib, over=args.over)
    probes = probe_rows([t.row_id for t in tail], args.data) if args.probe else None
    print(table(tail, probes))
    for name, (count, under) in campaign_counts(results, offsets, tail).items():
        print(f"{name}: {under} of {count} scored rows at least {args.min_mib:.0f} MiB "
              f"{'over' if args.over else 'under'}")
    kinds = {"whole segments": sum(bool(t.whole_segments) for t in tail),
             "shared amount": sum(bool(t.shared_with) for t in tail),
             "other": sum(t.kind == "other" for t in tail)}
    print(", ".join(f"{k}: {v}" for k, v in kinds.items()))
    if tail:
        print(f"median miss {statistics.median(t.deficit_mib for t in tail):.0f} MiB")


if __name__ == "__main__":
    main()
