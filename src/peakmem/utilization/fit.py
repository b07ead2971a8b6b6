"""Fit the timing model's free parameters on the declared split, and write params.toml.

    python -m peakmem.utilization.fit --data ../shared/datasets [--fit-rows 200,200,50] [--jobs 2]
        [--start shipped|defaults]

Only rows of the fit split (utilization.rows.in_fit_split: ~20% of each dataset) are used; a
spread sample of them (`--fit-rows` per dataset) is captured (cached) and the parameters
minimise a robust (soft-L1) sum of the GRACT, SMACT, SMOCC and FP32A errors over them,
starting from the shipped fitted values (`--start shipped`, params.toml; a parameter it lacks
starts at its default) or from the defaults (`--start defaults`).
"""

from __future__ import annotations

import argparse
import math
from dataclasses import fields
from pathlib import Path

import numpy as np

from peakmem.utilization.model import ModelParams, StepOps, fitted_params, utilization
from peakmem.utilization.rows import DATASETS, FIT_SPLIT_DESCRIPTION, METRICS

FITTED = (
    "host_forward_us", "host_backward_us", "host_optimizer_us", "host_step_us", "host_param_us",
    "loader_op_us", "loader_random_ns_per_byte", "loader_ns_per_byte", "loader_batch_us", "h2d_gbps", "kernel_min_us", "gemm_efficiency",
    "conv_efficiency", "memory_efficiency", "achieved_occupancy", "fp32_per_element",
    "tensor_fp32_share", "launch_gap_share", "conv_layout_share", "steady_share",
)
BOUNDS = {  # physically plausible ranges (a parameter at a bound is reported by the fit)
    "host_forward_us": (2.0, 100.0),
    "host_backward_us": (1.0, 100.0),
    "host_optimizer_us": (2.0, 200.0),
    "host_step_us": (10.0, 5000.0),
    "host_param_us": (0.1, 50.0),
    "loader_op_us": (0.5, 50.0),
    "loader_random_ns_per_byte": (0.01, 20.0),
    "loader_ns_per_byte": (0.01, 20.0),
    "h2d_gbps": (1.0, 25.0),
    "loader_batch_us": (10.0, 5000.0),
    "kernel_min_us": (1.0, 10.0),
    "gemm_efficiency": (0.1, 1.0),
    "conv_efficiency": (0.02, 1.0),
    "memory_efficiency": (0.3, 1.0),
    "achieved_occupancy": (0.2, 1.0),
    "fp32_per_element": (0.5, 50.0),
    "tensor_fp32_share": (0.001, 2.0),
    "launch_gap_share": (0.01, 1.0),
    "conv_layout_share": (0.01, 3.0),
    "steady_share": (0.7, 1.0),
}
DEFAULT_BOUNDS = (1e-3, 1e4)

Sample = tuple[StepOps, tuple[int, bool], dict[str, float], str]
"""(the step's ops, the job's DataLoader (workers, pinned), measured metrics, dataset)."""


def predict(sample: Sample, gpu, params: ModelParams) -> np.ndarray:  # type: ignore[no-untyped-def]
    ops, (workers, pinned), _, _ = sample
    u = utilization(ops, gpu, params, loader_workers=workers, pinned=pinned)
    return np.array([getattr(u, m) for m in METRICS])


def residuals(samples: list[Sample], gpu, params: ModelParams, weighted: bool = False) -> np.ndarray:  # type: ignore[no-untyped-def]
    """Predicted - measured, per row and metric; `weighted`: every family (MLP, CNN) weighs the
    same in total, whatever its number of rows."""
    families = [s[3].rstrip("0123456789") for s in samples]
    counts = {f: families.count(f) for f in set(families)}
    out = []
    for sample, family in zip(samples, families, strict=True):
        error = predict(sample, gpu, params) - np.array([sample[2][m] for m in METRICS])
        out.append(error / math.sqrt(counts[family]) if weighted else error)
    return np.concatenate(out) if out else np.zeros(0)


def fit(samples: list[Sample], gpu, start: ModelParams | None = None) -> ModelParams:  # type: ignore[no-untyped-def]
    from scipy.optimize import least_squares

    start = start or ModelParams()
    lows = np.log([BOUNDS.get(n, DEFAULT_BOUNDS)[0] for n in FITTED])
    highs = np.log([BOUNDS.get(n, DEFAULT_BOUNDS)[1] for n in FITTED])
    x0 = np.clip(np.log([getattr(start, n) for n in FITTED]), lows + 1e-9, highs - 1e-9)

    def params_of(x: np.ndarray) -> ModelParams:
        values = {f.name: getattr(start, f.name) for f in fields(ModelParams)}
        values.update({n: float(math.exp(v)) for n, v in zip(FITTED, x, strict=True)})
        return ModelParams(**values)

    result = least_squares(
        lambda x: residuals(samples, gpu, params_of(x), weighted=True),
        x0,
        bounds=(lows, highs),
        loss="soft_l1",
        f_scale=0.05 / math.sqrt(len(samples)),
        diff_step=1e-3,
        max_nfev=400,
    )
    return params_of(result.x)


def write_params(params: ModelParams, path: Path, description: str) -> None:
    lines = [
        "# Free parameters of the utilization timing model (peakmem.utilization.model).",
        f"# Fitted by `python -m peakmem.utilization.fit` on {description}.",
        "[params]",
    ]
    lines += [f"{f.name} = {getattr(params, f.name):.6g}" for f in fields(ModelParams)]
    path.write_text("\n".join(lines) + "\n")


def fit_samples(
    data_dir: str | None, per_dataset: list[int], cache_path: Path | None, jobs: int
) -> list[Sample]:
    from peakmem.datasets.loaders import load_rows, spread_subset
    from peakmem.utilization.collect import DEFAULT_CACHE, StepCache, collect
    from peakmem.utilization.rows import in_fit_split, loader_of, measured

    cache = StepCache(cache_path or DEFAULT_CACHE)
    samples: list[Sample] = []
    for dataset, count in zip(DATASETS, per_dataset, strict=True):
        rows = [r for r in load_rows(dataset, data_dir) if measured(r) and in_fit_split(r)]
        rows = spread_subset(rows, count)
        records = collect(rows, cache, jobs=jobs)
        for row in rows:
            record = records[row.id]
            if isinstance(record, dict):
                samples.append(
                    (StepOps.from_meta(record), loader_of(row), measured(row), dataset)  # type: ignore[arg-type]
                )
    return samples


STARTS = {"shipped": fitted_params, "defaults": ModelParams}
"""Where the fit starts: the shipped params.toml (missing keys at their defaults) or the
defaults."""


def main(argv: list[str] | None = None) -> None:
    from peakmem.profiles import load_gpu

    parser = argparse.ArgumentParser(prog="python -m peakmem.utilization.fit")
    parser.add_argument("--data", default=None, help="datasets directory (../shared/datasets)")
    parser.add_argument("--fit-rows", default="200,200,50",
                        help="fit-split rows sampled per dataset (mlp1,mlp2,cnn)")
    parser.add_argument("--cache", type=Path, default=None, help="step cache (JSON lines)")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--start", choices=tuple(STARTS), default="shipped",
                        help="start from the shipped fitted values or from the defaults")
    parser.add_argument("--out", type=Path,
                        default=Path(__file__).resolve().parent / "params.toml")
    args = parser.parse_args(argv)
    per_dataset = [int(n) for n in args.fit_rows.split(",")]
    samples = fit_samples(args.data, per_dataset, args.cache, args.jobs)
    gpu = load_gpu("a100-40gb")
    start = STARTS[args.start]()
    params = fit(samples, gpu, start)
    before = np.abs(residuals(samples, gpu, start)).mean()
    after = np.abs(residuals(samples, gpu, params)).mean()
    description = (
        f"{len(samples)} rows of the declared split ({FIT_SPLIT_DESCRIPTION}; "
        f"{args.fit_rows} spread over {', '.join(DATASETS)}), started from the "
        f"{args.start} values; fit MAE {after:.3f} (start {before:.3f})"
    )
    write_params(params, args.out, description)
    print(description)
    print(args.out)


if __name__ == "__main__":
    main()
