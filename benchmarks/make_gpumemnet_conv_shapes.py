"""List the conv2d shapes of the public GPUMemNet CNN jobs, for benchmarks/cudnn_probe.py.

    PYTHONPATH=src python benchmarks/make_gpumemnet_conv_shapes.py [--data-dir ../shared/datasets]
        [--out benchmarks/data/gpumemnet_conv_shapes.csv] [--limit 4000]

Each rebuildable CNN row's model (peakmem.datasets.gpumemnet_models) runs on the meta device with a
hook on every Conv2d; a shape is (batch, C_in, H, W, C_out, kernel, stride, padding, dilation,
groups, bias). Priority order: first the largest conv of each job (by input + output elements:
the layer most likely to set the step's peak), shuffled with a fixed seed; then every other
distinct shape, shuffled. `jobs` counts the rows that use the shape; `largest` is 1 for a shape
that is some job's largest conv. The GPU machine cannot see ../shared, hence the committed file.
"""

from __future__ import annotations

import argparse
import csv
import random
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FIELDS = ["n", "cin", "h", "w", "cout", "kernel", "stride", "padding", "dilation", "groups",
          "bias", "jobs", "largest"]  # fmt: skip


def job_convs(job) -> list[tuple[int, ...]]:
    import torch

    from peakmem.datasets.gpumemnet_models import build_model, make_batch

    model = build_model(job, "meta")
    found: list[tuple[int, ...]] = []

    def hook(mod, inputs, output):
        n, cin, h, w = inputs[0].shape
        found.append((n, cin, h, w, mod.out_channels, mod.kernel_size[0], mod.stride[0],
                      mod.padding[0], mod.dilation[0], mod.groups, int(mod.bias is not None),
                      inputs[0].numel() + output.numel()))  # fmt: skip

    for mod in model.modules():
        if isinstance(mod, torch.nn.Conv2d):
            mod.register_forward_hook(hook)
    with torch.no_grad():
        model(make_batch(job, None, "meta")[0])
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default=None)
    parser.add_argument(
        "--out", type=Path, default=REPO / "benchmarks/data/gpumemnet_conv_shapes.csv"
    )
    parser.add_argument("--limit", type=int, default=4000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    from peakmem.datasets.gpumemnet_models import CannotBuildJob
    from peakmem.datasets.loaders import load_rows

    jobs: dict[tuple[int, ...], int] = {}
    largest: set[tuple[int, ...]] = set()
    for row in load_rows("gpumemnet-cnn", args.data_dir):
        try:
            convs = job_convs(row.job)
        except CannotBuildJob:
            continue
        if not convs:
            continue
        for shape in {c[:-1] for c in convs}:
            jobs[shape] = jobs.get(shape, 0) + 1
        largest.add(max(convs, key=lambda c: c[-1])[:-1])
    rng = random.Random(args.seed)
    first = sorted(largest)
    rest = sorted(set(jobs) - largest)
    rng.shuffle(first)
    rng.shuffle(rest)
    ordered = (first + rest)[: args.limit]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(FIELDS)
        for shape in ordered:
            writer.writerow([*shape, jobs[shape], int(shape in largest)])
    print(f"{len(jobs)} distinct conv shapes, {len(largest)} largest-of-a-job; wrote "
          f"{len(ordered)} to {args.out}")  # fmt: skip


if __name__ == "__main__":
    main()
