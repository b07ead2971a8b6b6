"""What the attention margin's layout probe costs, before and after issue 14's fast path.

    python benchmarks/layout_probe_speed.py [--only gpt2,rows,llama] [--rows 17] [--repeat 3]

For GPT-2 small (4 x 512 AdamW, `benchmarks/zoo/transformers_lm.py`), the GPUMemNet transformer
rows (as `peakmem bench` estimates them) and the Llama-3-8B shape (bf16, AdamW, 1 x 2048), each
estimated once: the estimate's CPU seconds (this process and its waited-for children, without
the margin), then `margin_reserve_bytes` of the trace with the layout probe replayed the plain
way (`probe_layout_plain`: one `simulate` per probe) and the fast way (`probe_layout`), CPU
seconds, best of `--repeat`, and whether the two give the same probe (every move) and the same
reserve. Prints one JSON line per job and a summary (medians over the rows). No dataset rows are
printed (row ids only).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ZOO = HERE / "zoo"
DATA = HERE.parents[1] / "shared" / "datasets"
if not DATA.is_dir():
    DATA = Path("/work/shared/datasets")
GPT2 = ["python", str(ZOO / "transformers_lm.py"), "--model", "gpt2", "--optimizer", "adamw",
        "--batch-size", "4", "--seq-len", "512"]
LLAMA = ["python", str(ZOO / "transformers_lm.py"), "--model", "llama-8b", "--weights-dtype",
         "bf16", "--optimizer", "adamw", "--batch-size", "1", "--seq-len", "2048"]


def _cpu() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _best(function, repeat: int) -> tuple[float, object]:
    best, value = float("inf"), None
    for _ in range(repeat):
        start = time.process_time()
        value = function()
        best = min(best, time.process_time() - start)
    return best, value


def measure(name: str, estimate, estimate_cpu: float, repeat: int) -> dict:
    from peakmem.estimate import layout_probe, margin_reserve

    trace = estimate.capture.trace
    conf, version, kind = estimate.alloc_conf, estimate.torch_version, estimate.margin_kind

    def reserve() -> int:
        return margin_reserve.margin_reserve_bytes(kind, trace, conf, version)

    fast_probe = layout_probe.probe_layout(trace, conf, version)
    plain_probe = layout_probe.probe_layout_plain(trace, conf, version)
    fast_seconds, fast_reserve = _best(reserve, repeat)
    margin_reserve.probe_layout = layout_probe.probe_layout_plain
    try:
        plain_seconds, plain_reserve = _best(reserve, repeat)
    finally:
        margin_reserve.probe_layout = layout_probe.probe_layout
    return {
        "job": name, "margin_kind": kind, "events": len(trace),
        "estimate_cpu_seconds": round(estimate_cpu, 3),
        "margin_cpu_seconds_plain": round(plain_seconds, 3),
        "margin_cpu_seconds_fast": round(fast_seconds, 3),
        "same_probe": fast_probe == plain_probe, "same_reserve": fast_reserve == plain_reserve,
        "margin_reserve_bytes": fast_reserve,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", default="gpt2,rows,llama")
    p.add_argument("--rows", type=int, default=17)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    only = set(args.only.split(","))
    from peakmem.estimate import estimate_command

    figures = []
    for name, argv, gpu in (("gpt2", GPT2, "h100-80gb"), ("llama", LLAMA, "h100-80gb")):
        if name in only:
            start = _cpu()
            estimate = estimate_command(argv, gpu=gpu)
            figures.append(measure(name, estimate, _cpu() - start, args.repeat))
            print(json.dumps(figures[-1]), flush=True)
    if "rows" in only:
        from peakmem.baselines.peakmem_estimator import PeakmemEstimator
        from peakmem.bench.calibration import evaluation_rows
        from peakmem.datasets.loaders import load_rows

        estimator = PeakmemEstimator()
        rows = evaluation_rows(load_rows("gpumemnet-transformer", DATA))[: args.rows]
        for row in rows:
            start = _cpu()
            estimate = estimator.run(row)
            figures.append(measure(f"gpumemnet-transformer {row.id}", estimate, _cpu() - start,
                                   args.repeat))
            print(json.dumps(figures[-1]), flush=True)
    print(f"{'job':<32} {'estimate':>9} {'margin plain':>13} {'margin fast':>12} same")
    rows_only = [f for f in figures if f["job"].startswith("gpumemnet")]
    shown = [f for f in figures if not f["job"].startswith("gpumemnet")]
    if rows_only:
        shown.append({
            "job": f"transformer rows (median of {len(rows_only)})",
            **{key: statistics.median(f[key] for f in rows_only)
               for key in ("estimate_cpu_seconds", "margin_cpu_seconds_plain",
                           "margin_cpu_seconds_fast")},
            "same_probe": all(f["same_probe"] for f in rows_only),
            "same_reserve": all(f["same_reserve"] for f in rows_only),
        })
    for f in shown:
        print(f"{f['job']:<32} {f['estimate_cpu_seconds']:>8.3f}s "
              f"{f['margin_cpu_seconds_plain']:>12.3f}s {f['margin_cpu_seconds_fast']:>11.3f}s "
              f"{f['same_probe'] and f['same_reserve']}")


if __name__ == "__main__":
    main()
